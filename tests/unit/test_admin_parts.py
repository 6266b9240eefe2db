"""The admin pieces on their own: RocketMQ's fastjson bodies, Kafka error names as metric labels, the error counts of
Kafka answers, the JSON log formatter, and the HTTP server's framing (pipelining, limits, bad requests)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from mqk.broker.stats import LATENCY_BOUNDS_S, RequestMeter
from mqk.logfmt import JsonFormatter
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.native import fastjson
from mqk.server.admin.http import HttpResponse, HttpServer
from mqk.server.admin.metrics import kafka_error_name
from mqk.server.kafka.metering import count_errors


def test_fastjson_writes_maps_keyed_by_message_queue_as_rocketmq_does_and_reads_them_back():
    mq = {"topic": "t", "brokerName": "b", "queueId": 0}
    body = {"offsetTable": fastjson.object_keyed([(mq, {"minOffset": 0, "maxOffset": 5})]), "topicPutTps": 0.0}
    text = fastjson.dumps(body)
    assert text == (
        '{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:{"maxOffset":5,"minOffset":0}},"topicPutTps":0.0}'
    )
    back = fastjson.loads(text)
    assert back["topicPutTps"] == 0.0
    assert list(back["offsetTable"]) == [(mq, {"maxOffset": 5, "minOffset": 0})]
    plain = {"a": [1, -2.5e3, 'x"y', None, True, {"b": {}}]}
    assert fastjson.loads(json.dumps(plain, indent=2)) == plain
    with pytest.raises(ValueError):
        fastjson.loads('{"a":1} trailing')


def test_kafka_error_names_are_kafkas():
    assert kafka_error_name(3) == "UNKNOWN_TOPIC_OR_PARTITION"
    assert kafka_error_name(6) == "NOT_LEADER_OR_FOLLOWER"
    assert kafka_error_name(9999) == "CODE_9999"


def test_error_counts_of_kafka_answers():
    meter = RequestMeter("kafka", "kafka")
    produce = {
        "responses": [
            {"name": "t", "partition_responses": [{"index": 0, "error_code": 0}, {"index": 1, "error_code": 3}]}
        ]
    }
    count_errors(meter, ApiKey.PRODUCE, produce)
    fetch = {"error_code": 0, "responses": [{"topic": "t", "partitions": [{"error_code": 1}, {"error_code": 1}]}]}
    count_errors(meter, ApiKey.FETCH, fetch)
    groups = {"groups": [{"error_code": 16, "members": []}, {"error_code": 0, "members": []}]}
    count_errors(meter, ApiKey.DESCRIBE_GROUPS, groups)
    assert meter.errors == {(ApiKey.PRODUCE, 3): 1, (ApiKey.FETCH, 1): 2, (ApiKey.DESCRIBE_GROUPS, 16): 1}
    meter.record(ApiKey.PRODUCE, 2_000_000)  # 2 ms
    stats = meter.apis[ApiKey.PRODUCE]
    assert stats.count == 1 and stats.buckets[LATENCY_BOUNDS_S.index(0.0025)] == 1


def test_json_log_lines_carry_stable_keys_extras_and_the_traceback_in_one_line():
    formatter = JsonFormatter()
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("mqk.kafka", logging.ERROR, __file__, 1, "closed %s", ("peer",), sys.exc_info())
    record.peer = "127.0.0.1:5"
    line = formatter.format(record)
    assert "\n" not in line
    event = json.loads(line)
    assert event["level"] == "ERROR" and event["logger"] == "mqk.kafka" and event["msg"] == "closed peer"
    assert event["peer"] == "127.0.0.1:5" and "ValueError: boom" in event["exc"] and event["ts"].endswith("+00:00")


async def test_http_server_answers_pipelined_requests_in_order_and_refuses_what_it_cannot_take():
    server = HttpServer(("127.0.0.1", 0), max_body=16)

    async def echo(request):
        return HttpResponse.text(f"{request.method} {request.path} {request.arg('q')} {len(request.body)}")

    server.route("GET", "/a", echo)
    server.route("POST", "/a", echo)
    server.route_prefix("GET", "/static/", echo)
    host, port = await server.start()
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            b"GET /a?q=1 HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
            b"GET /static/x%20y HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        bodies = []
        for _ in range(3):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            bodies.append((head.split(b" ")[1], await reader.readexactly(length)))
        assert bodies == [(b"200", b"GET /a 1 0"), (b"200", b"POST /a None 3"), (b"200", b"GET /static/x y None 0")]
        writer.write(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"z" * 100)
        assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 413")
        writer.close()

        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 400")
        writer.close()
    finally:
        await server.stop()
