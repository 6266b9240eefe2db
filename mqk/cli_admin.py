"""The `mqk` admin and data commands that talk to a running broker: topics, groups, users, produce, consume, query.

They speak the broker's own wire protocols through mqk's codecs (no third-party client needed): Kafka requests
through `RawKafkaClient`, RocketMQ remoting through `mqk.client`. One connection, one request at a time: these are
tools for people, not load generators (see bench/ for those).

Every Kafka command takes the client security options of Kafka's tools: `--security-protocol` (PLAINTEXT, SSL,
SASL_PLAINTEXT, SASL_SSL), `--sasl-mechanism` / `--sasl-username` / `--sasl-password` (or the MQK_SASL_PASSWORD
environment variable, which keeps the password out of the process list) and `--ssl-cafile` / `--ssl-certfile` /
`--ssl-keyfile`. `mqk users` lists, adds and deletes SCRAM users through DescribeUserScramCredentials and
AlterUserScramCredentials; the salted password is derived here, so the password itself never reaches the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
import time
from typing import Any

from mqk.config import SASL_MECHANISMS, SECURITY_PROTOCOLS, parse_hostport
from mqk.errors import KafkaError, MqkError
from mqk.protocol.kafka.api import ApiKey
from mqk.server.kafka.rawclient import RawKafkaClient, client_ssl_context, make_batch

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_NAMESRV = "127.0.0.1:9876"


class CommandError(Exception):
    """A broker answered with an error; printed as one line, exit code 1."""


def _check(code: int, what: str, message: str | None = None) -> None:
    if code:
        name = KafkaError.for_code(code).__name__
        raise CommandError(f"{what}: {name} ({code}){': ' + message if message else ''}")


async def _kafka(args: argparse.Namespace) -> RawKafkaClient:
    host, port = parse_hostport(args.bootstrap)
    protocol = args.security_protocol
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = client_ssl_context(args.ssl_cafile, args.ssl_certfile, args.ssl_keyfile)
    client = await RawKafkaClient.connect(host, port, client_id="mqk-cli", ssl=context)
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        password = args.sasl_password if args.sasl_password is not None else os.environ.get("MQK_SASL_PASSWORD")
        if not args.sasl_username or password is None:
            await client.close()
            raise CommandError("SASL needs --sasl-username and --sasl-password (or MQK_SASL_PASSWORD)")
        try:
            await client.authenticate(args.sasl_mechanism, args.sasl_username, password)
        except (KafkaError, MqkError) as exc:
            await client.close()
            raise CommandError(f"authentication failed: {type(exc).__name__}: {exc}") from None
    return client


def _parse_configs(pairs: list[str] | None) -> dict[str, str]:
    configs = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep:
            raise CommandError(f"--config expects KEY=VALUE, got {pair!r}")
        configs[key] = value
    return configs


# --- topics --------------------------------------------------------------------------------------------


async def topics_list(args: argparse.Namespace) -> None:
    async with await _kafka(args) as client:
        meta = await client.call(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False})
    for topic in sorted(meta["topics"], key=lambda t: t["name"]):
        print(f"{topic['name']}\tpartitions={len(topic['partitions'])}")


async def topics_create(args: argparse.Namespace) -> None:
    body = {
        "topics": [
            {
                "name": args.topic,
                "num_partitions": args.partitions,
                "replication_factor": 1,
                "assignments": [],
                "configs": [{"name": k, "value": v} for k, v in _parse_configs(args.config).items()],
            }
        ],
        "timeout_ms": 30000,
        "validate_only": False,
    }
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.CREATE_TOPICS, 7, body)
    result = resp["topics"][0]
    _check(result["error_code"], f"create {args.topic}", result.get("error_message"))
    print(f"created {args.topic} with {args.partitions} partition(s)")


async def topics_delete(args: argparse.Namespace) -> None:
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.DELETE_TOPICS, 6, {"topics": [{"name": args.topic}], "timeout_ms": 30000})
    result = resp["responses"][0]
    _check(result["error_code"], f"delete {args.topic}", result.get("error_message"))
    print(f"deleted {args.topic}")


async def topics_describe(args: argparse.Namespace) -> None:
    async with await _kafka(args) as client:
        meta = await client.call(ApiKey.METADATA, 12, {"topics": [{"name": args.topic}]})
        topic = meta["topics"][0]
        _check(topic["error_code"], f"describe {args.topic}")
        cfg = await client.call(
            ApiKey.DESCRIBE_CONFIGS,
            4,
            {"resources": [{"resource_type": 2, "resource_name": args.topic, "configuration_keys": None}]},
        )
        offsets = await client.call(
            ApiKey.LIST_OFFSETS,
            7,
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {
                        "name": args.topic,
                        "partitions": [
                            {"partition_index": p["partition_index"], "timestamp": -1} for p in topic["partitions"]
                        ],
                    }
                ],
            },
        )
    ends = {p["partition_index"]: p["offset"] for p in offsets["topics"][0]["partitions"]}
    print(f"topic {args.topic}  partitions={len(topic['partitions'])}")
    for p in sorted(topic["partitions"], key=lambda p: p["partition_index"]):
        i = p["partition_index"]
        print(f"  partition {i}\tleader={p['leader_id']}\tend_offset={ends.get(i, '?')}")
    for entry in sorted(cfg["results"][0]["configs"], key=lambda c: c["name"]):
        marker = "" if entry.get("config_source", 5) == 5 else "  (set)"
        print(f"  {entry['name']}={entry['value']}{marker}")


async def topics_delete_records(args: argparse.Namespace) -> None:
    """Move a partition's log start offset to `--before` (-1: the end offset), as kafka-delete-records does."""
    async with await _kafka(args) as client:
        resp = await client.call(
            ApiKey.DELETE_RECORDS,
            2,
            {
                "topics": [
                    {"name": args.topic, "partitions": [{"partition_index": args.partition, "offset": args.before}]}
                ],
                "timeout_ms": 30000,
            },
        )
    part = resp["topics"][0]["partitions"][0]
    _check(part["error_code"], f"delete records of {args.topic}[{args.partition}]")
    print(f"{args.topic}[{args.partition}] now starts at offset {part['low_watermark']}")


# --- groups --------------------------------------------------------------------------------------------


async def groups_list(args: argparse.Namespace) -> None:
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
    _check(resp["error_code"], "list groups")
    for group in sorted(resp["groups"], key=lambda g: g["group_id"]):
        print(f"{group['group_id']}\t{group.get('group_state', '')}\t{group['protocol_type']}")


async def groups_describe(args: argparse.Namespace) -> None:
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.DESCRIBE_GROUPS, 5, {"groups": [args.group]})
        fetched = await client.call(ApiKey.OFFSET_FETCH, 7, {"group_id": args.group, "topics": None})
    group = resp["groups"][0]
    _check(group["error_code"], f"describe {args.group}")
    print(f"group {args.group}  state={group['group_state']}  protocol={group['protocol_data']}")
    for member in group["members"]:
        print(f"  member {member['member_id']}  client={member['client_id']}  host={member['client_host']}")
    for topic in fetched.get("topics") or []:
        for p in topic["partitions"]:
            print(f"  {topic['name']}[{p['partition_index']}] committed={p['committed_offset']}")


# --- users (SCRAM credentials) ------------------------------------------------------------------------


def _scram_mechanisms() -> dict[str, Any]:
    from mqk.broker.security.scram import MECHANISMS

    return MECHANISMS


async def users_list(args: argparse.Namespace) -> None:
    names = {v.kafka_type: k for k, v in _scram_mechanisms().items()}
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": None})
    _check(resp["error_code"], "list users", resp.get("error_message"))
    for result in sorted(resp["results"], key=lambda r: r["user"]):
        creds = ", ".join(
            f"{names.get(c['mechanism'], c['mechanism'])} iterations={c['iterations']}"
            for c in result["credential_infos"]
        )
        print(f"{result['user']}\t{creds}")


def _new_password(args: argparse.Namespace) -> str:
    if args.password is not None:
        return str(args.password)
    if args.password_stdin:
        line = sys.stdin.readline()
        return line.rstrip("\n")
    if not sys.stdin.isatty():
        raise CommandError("give the password with --password, --password-stdin or at the prompt of a terminal")
    first = getpass.getpass(f"password for {args.user}: ")
    if getpass.getpass("again: ") != first:
        raise CommandError("the passwords differ")
    return first


def _mechanism_names(args: argparse.Namespace) -> list[str]:
    return list(dict.fromkeys(args.mechanism or ["SCRAM-SHA-256", "SCRAM-SHA-512"]))


async def users_add(args: argparse.Namespace) -> None:
    from mqk.broker.security.scram import salt_password

    password = _new_password(args)
    if not password:
        raise CommandError("the password must not be empty")
    mechanisms = _scram_mechanisms()
    upsertions = []
    for name in _mechanism_names(args):
        mechanism = mechanisms[name]
        salt, salted = salt_password(mechanism, password, args.iterations)
        upsertions.append(
            {
                "name": args.user,
                "mechanism": mechanism.kafka_type,
                "iterations": args.iterations,
                "salt": salt,
                "salted_password": salted,
            }
        )
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, {"deletions": [], "upsertions": upsertions})
    result = resp["results"][0]
    _check(result["error_code"], f"add user {args.user}", result.get("error_message"))
    print(f"user {args.user}: {', '.join(_mechanism_names(args))} set")


async def users_delete(args: argparse.Namespace) -> None:
    mechanisms = _scram_mechanisms()
    async with await _kafka(args) as client:
        if args.mechanism:
            types = [mechanisms[name].kafka_type for name in dict.fromkeys(args.mechanism)]
        else:  # every credential the user has
            found = await client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": [{"name": args.user}]})
            _check(found["error_code"], "describe users", found.get("error_message"))
            result = found["results"][0]
            _check(result["error_code"], f"delete user {args.user}", result.get("error_message"))
            types = [c["mechanism"] for c in result["credential_infos"]]
        resp = await client.call(
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
            0,
            {"deletions": [{"name": args.user, "mechanism": t} for t in types], "upsertions": []},
        )
    result = resp["results"][0]
    _check(result["error_code"], f"delete user {args.user}", result.get("error_message"))
    print(f"user {args.user} deleted")


# --- produce / consume ---------------------------------------------------------------------------------


def _input_values(args: argparse.Namespace) -> list[bytes]:
    if args.value is not None:
        return [v.encode() for v in args.value]
    return [line.rstrip("\n").encode() for line in sys.stdin]


async def produce_kafka(args: argparse.Namespace) -> None:
    values = _input_values(args)
    if not values:
        return
    key = args.key.encode() if args.key is not None else None
    headers = [[(k, v.encode()) for k, v in _parse_configs(args.header).items()]] * len(values)
    batch = make_batch(values, keys=[key] * len(values), headers=headers)
    async with await _kafka(args) as client:
        await client.call(ApiKey.METADATA, 12, {"topics": [{"name": args.topic}], "allow_auto_topic_creation": True})
        resp = await client.call(
            ApiKey.PRODUCE,
            9,
            {
                "acks": -1,
                "timeout_ms": 30000,
                "topic_data": [
                    {"name": args.topic, "partition_data": [{"index": args.partition, "records": bytes(batch)}]}
                ],
            },
        )
    part = resp["responses"][0]["partition_responses"][0]
    _check(part["error_code"], f"produce to {args.topic}[{args.partition}]", part.get("error_message"))
    print(
        f"{len(values)} record(s) written to {args.topic}[{args.partition}] at offset {part['base_offset']}",
        file=sys.stderr,
    )


async def produce_native(args: argparse.Namespace) -> None:
    from mqk.client import Message, Producer

    values = _input_values(args)
    properties = _parse_configs(args.header)
    async with Producer(args.namesrv, "mqk-cli-producer") as producer:
        for value in values:
            result = await producer.send(
                Message(
                    args.topic,
                    value,
                    tags=args.tags,
                    keys=[args.key] if args.key else None,
                    properties=properties,
                    delay_level=args.delay_level,
                    deliver_at_ms=args.deliver_at,
                )
            )
        if values:
            print(
                f"{len(values)} message(s) sent to {args.topic}, last to queue {result.queue.queue_id} "
                f"at offset {result.queue_offset}",
                file=sys.stderr,
            )


async def consume_native(args: argparse.Namespace) -> None:
    from mqk.client.tools import consume

    def out(msg: Any) -> None:
        if args.json:
            print(
                json.dumps(
                    {
                        "queue": msg.queue_id,
                        "offset": msg.queue_offset,
                        "tags": msg.tags,
                        "keys": list(msg.keys),
                        "value": msg.body.decode(errors="replace"),
                        "properties": msg.properties,
                    }
                ),
                flush=True,
            )
        else:
            print(msg.body.decode(errors="replace"), flush=True)

    await consume(
        args.namesrv,
        args.topic,
        args.group,
        expression=args.tags or "*",
        from_beginning=args.offset != -1,
        max_messages=None if args.max_messages >= 1 << 62 else args.max_messages,
        idle_timeout_s=args.timeout,
        out=out,
    )


def _by_protocol(kafka: Any, native: Any) -> Any:
    async def run(args: argparse.Namespace) -> None:
        await (native if args.protocol == "native" else kafka)(args)

    return run


async def consume_kafka(args: argparse.Namespace) -> None:
    from mqk._fast import load
    from mqk.protocol.kafka.records import decompress

    recbatch = load("recbatch")
    printed = 0
    deadline = time.monotonic() + args.timeout
    async with await _kafka(args) as client:
        offset = args.offset
        if offset < 0:
            resp = await client.call(
                ApiKey.LIST_OFFSETS,
                7,
                {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [
                        {"name": args.topic, "partitions": [{"partition_index": args.partition, "timestamp": offset}]}
                    ],
                },
            )
            part = resp["topics"][0]["partitions"][0]
            _check(part["error_code"], f"list offsets of {args.topic}")
            offset = part["offset"]
        while printed < args.max_messages and time.monotonic() < deadline:
            resp = await client.call(
                ApiKey.FETCH,
                12,
                {
                    "replica_id": -1,
                    "max_wait_ms": 500,
                    "min_bytes": 1,
                    "max_bytes": 1 << 20,
                    "isolation_level": 0,
                    "session_id": 0,
                    "session_epoch": -1,
                    "topics": [
                        {
                            "topic": args.topic,
                            "partitions": [
                                {"partition": args.partition, "fetch_offset": offset, "partition_max_bytes": 1 << 20}
                            ],
                        }
                    ],
                    "forgotten_topics_data": [],
                    "rack_id": "",
                },
            )
            part = resp["responses"][0]["partitions"][0]
            _check(part["error_code"], f"fetch {args.topic}[{args.partition}]")
            data = bytes(part["records"] or b"")
            for info in recbatch.scan_batches(data, False) if data else []:
                pos, size, _lod, _max_ts, count, attributes = info[:6]
                base = recbatch.parse_header(data, pos)[0]
                records = data[pos + recbatch.HEADER_SIZE : pos + size]
                if attributes & 0x07:
                    records = decompress(attributes & 0x07, records)
                for rec in recbatch.decode_records(records, count):
                    rec_offset = base + rec[2]
                    if rec_offset < offset or printed >= args.max_messages:
                        continue
                    printed += 1
                    _print_record(args, rec_offset, rec[3], rec[4], rec[5])
                offset = max(offset, base + info[2] + 1)


def _print_record(args: argparse.Namespace, offset: int, key: Any, value: Any, headers: list) -> None:
    if args.json:
        print(
            json.dumps(
                {
                    "offset": offset,
                    "key": None if key is None else bytes(key).decode(errors="replace"),
                    "value": None if value is None else bytes(value).decode(errors="replace"),
                    "headers": {k: (None if v is None else bytes(v).decode(errors="replace")) for k, v in headers},
                }
            ),
            flush=True,
        )
    else:
        print("" if value is None else bytes(value).decode(errors="replace"), flush=True)


# --- query by key --------------------------------------------------------------------------------------


async def query_by_key(args: argparse.Namespace) -> None:
    """QUERY_MESSAGE (RocketMQ's query by key) to every broker of the topic's name-server route. The broker's key
    index holds RocketMQ `KEYS` and, on topics with `index.keys=true`, Kafka record keys; a key that matches
    nothing prints nothing (exit 0)."""
    from mqk.client.base import ClientBase
    from mqk.client.remoting import ClientError
    from mqk.protocol.native.codes import RequestCode, ResponseCode
    from mqk.protocol.native.message import decode_messages

    if args.max < 1:
        raise CommandError(f"--max must be at least 1, not {args.max}")
    end_ms = args.end_ms if args.end_ms is not None else int(time.time() * 1000) + 60_000
    try:
        client = ClientBase(args.namesrv, "mqk-cli-query")
    except ValueError as exc:
        raise CommandError(f"--namesrv: {exc}") from None
    try:
        route = await client.route(args.topic)
        found = []
        for addr in sorted(set(route.broker_addrs.values())):
            resp = await client.invoke(
                addr,
                RequestCode.QUERY_MESSAGE,
                {
                    "topic": args.topic,
                    "key": args.key,
                    "maxNum": args.max,
                    "beginTimestamp": args.begin_ms,
                    "endTimestamp": end_ms,
                },
                ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
            )
            if resp.code == ResponseCode.SUCCESS and resp.body:
                found.extend(decode_messages(resp.body))
    except ClientError as exc:
        raise CommandError(f"query {args.topic} by key {args.key!r}: {exc}") from None
    finally:
        await client.close()
    found.sort(key=lambda m: (m.store_timestamp, m.queue_id, m.queue_offset), reverse=True)  # newest first
    for msg in found[: args.max]:
        body = msg.body.decode(errors="replace")
        if args.json:
            print(
                json.dumps(
                    {
                        "queue": msg.queue_id,
                        "offset": msg.queue_offset,
                        "keys": msg.keys,
                        "tags": msg.tags,
                        "body": body,
                        "store_timestamp": msg.store_timestamp,
                        "msg_id": msg.msg_id,
                        "properties": msg.properties,
                    }
                ),
                flush=True,
            )
        else:
            print(
                f"queue={msg.queue_id}\toffset={msg.queue_offset}\tkeys={' '.join(msg.keys)}\t"
                f"tags={msg.tags or ''}\t{body}",
                flush=True,
            )


def register(sub: argparse._SubParsersAction) -> None:
    """Add the admin and data commands to the `mqk` parser."""

    def with_native(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--protocol",
            choices=("kafka", "native"),
            default="kafka",
            help="kafka (default) or native: RocketMQ remoting through the name server",
        )
        p.add_argument("--namesrv", default=DEFAULT_NAMESRV, metavar="HOST:PORT", help="native: the name server")

    def with_bootstrap(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--bootstrap", default=DEFAULT_BOOTSTRAP, metavar="HOST:PORT", help="Kafka listener")
        security = p.add_argument_group("client security (Kafka)")
        security.add_argument("--security-protocol", choices=SECURITY_PROTOCOLS, default="PLAINTEXT")
        security.add_argument("--sasl-mechanism", choices=SASL_MECHANISMS, default="SCRAM-SHA-512")
        security.add_argument("--sasl-username")
        security.add_argument("--sasl-password", help="(default: the MQK_SASL_PASSWORD environment variable)")
        security.add_argument("--ssl-cafile", help="PEM CA bundle the broker's certificate is checked against")
        security.add_argument("--ssl-certfile", help="PEM client certificate (SSL listeners with client auth)")
        security.add_argument("--ssl-keyfile", help="PEM key of the client certificate")
        return p

    topics = sub.add_parser("topics", help="list, create, describe, delete topics")
    tsub = topics.add_subparsers(dest="action", required=True)
    with_bootstrap(tsub.add_parser("list")).set_defaults(run=topics_list)
    p = with_bootstrap(tsub.add_parser("create"))
    p.add_argument("topic")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--config", action="append", metavar="KEY=VALUE")
    p.set_defaults(run=topics_create)
    p = with_bootstrap(tsub.add_parser("describe"))
    p.add_argument("topic")
    p.set_defaults(run=topics_describe)
    p = with_bootstrap(tsub.add_parser("delete"))
    p.add_argument("topic")
    p.set_defaults(run=topics_delete)
    p = with_bootstrap(tsub.add_parser("delete-records", help="move a partition's log start offset forward"))
    p.add_argument("topic")
    p.add_argument("--partition", type=int, default=0)
    p.add_argument("--before", type=int, required=True, help="new log start offset; -1 = the end offset")
    p.set_defaults(run=topics_delete_records)

    groups = sub.add_parser("groups", help="list and describe consumer groups")
    gsub = groups.add_subparsers(dest="action", required=True)
    with_bootstrap(gsub.add_parser("list")).set_defaults(run=groups_list)
    p = with_bootstrap(gsub.add_parser("describe"))
    p.add_argument("group")
    p.set_defaults(run=groups_describe)

    users = sub.add_parser("users", help="list, add, delete SCRAM users")
    usub = users.add_subparsers(dest="action", required=True)
    with_bootstrap(usub.add_parser("list")).set_defaults(run=users_list)
    p = with_bootstrap(usub.add_parser("add", help="add a user, or set a user's password"))
    p.add_argument("user")
    password = p.add_mutually_exclusive_group()
    password.add_argument("--password", help="(visible in the process list: prefer --password-stdin)")
    password.add_argument("--password-stdin", action="store_true", help="read the password from stdin's first line")
    p.add_argument("--mechanism", action="append", choices=("SCRAM-SHA-256", "SCRAM-SHA-512"))
    p.add_argument("--iterations", type=int, default=4096, help="PBKDF2 iterations, 4096..16384 (default 4096)")
    p.set_defaults(run=users_add)
    p = with_bootstrap(usub.add_parser("delete", help="delete a user's credentials (all of them by default)"))
    p.add_argument("user")
    p.add_argument("--mechanism", action="append", choices=("SCRAM-SHA-256", "SCRAM-SHA-512"))
    p.set_defaults(run=users_delete)

    p = with_bootstrap(sub.add_parser("produce", help="write records (one per stdin line, or --value)"))
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int, default=0)
    p.add_argument("--key")
    p.add_argument("--header", action="append", metavar="KEY=VALUE")
    p.add_argument("--value", action="append", help="a record value (repeatable); default: read stdin lines")
    with_native(p)
    p.add_argument("--tags", help="native: the message's TAGS")
    p.add_argument("--delay-level", type=int, default=0, help="native: RocketMQ delay level 1..18")
    p.add_argument("--deliver-at", type=int, help="native: delivery time, epoch ms")
    p.set_defaults(run=_by_protocol(produce_kafka, produce_native))

    p = with_bootstrap(sub.add_parser("consume", help="print records of one partition"))
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int, default=0)
    p.add_argument("--offset", type=int, default=-2, help="start offset; -2 earliest (default), -1 latest")
    p.add_argument("--max-messages", type=int, default=1 << 62)
    p.add_argument("--timeout", type=float, default=10.0, help="stop after this many seconds")
    p.add_argument("--json", action="store_true", help="one JSON object per record with key, headers, offset")
    with_native(p)
    p.add_argument("--group", default="mqk-cli-consumer", help="native: the consumer group (commits its offsets)")
    p.add_argument("--tags", help="native: tag expression, e.g. 'a || b'")
    p.set_defaults(run=_by_protocol(consume_kafka, consume_native))

    for p in (topics, groups, users):
        p.set_defaults(func=run_command)
    p = sub.add_parser("query", help="print the messages whose key (RocketMQ KEYS, or an indexed Kafka key) matches")
    p.add_argument("--topic", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--namesrv", default=DEFAULT_NAMESRV, metavar="HOST:PORT", help="name server (RocketMQ route)")
    p.add_argument("--max", type=int, default=64, help="at most this many messages (the broker caps it at 64)")
    p.add_argument("--begin-ms", type=int, default=0, help="store time lower bound, epoch ms")
    p.add_argument("--end-ms", type=int, default=None, help="store time upper bound, epoch ms (default: now)")
    p.add_argument("--json", action="store_true", help="one JSON object per message")
    p.set_defaults(run=query_by_key)

    for name in ("produce", "consume", "query"):
        sub.choices[name].set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        asyncio.run(args.run(args))
    except CommandError as exc:
        print(f"mqk: {exc}", file=sys.stderr)
        return 1
    except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
        print(f"mqk: cannot reach the broker: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    return 0
