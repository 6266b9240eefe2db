"""What the Kafka listener counts of each answer for /metrics: its latency and the error codes it carries.

A request is timed from the read that decoded it to its answer being queued for the socket (long-polling Fetches
include their wait, as Kafka's TotalTimeMs does). Its error codes are counted as Kafka's ErrorsPerSec counts
them: every non-zero `error_code` of the answer, top level and per topic / partition / group, each once. Produce
and Fetch answers, the hot ones, are walked along their known shape (a field read per partition); the other APIs'
answers are walked generically, through every list of objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from mqk.broker.stats import RequestMeter
from mqk.protocol.kafka.api import ApiKey

_error_code = itemgetter("error_code")


def count_errors(meter: RequestMeter, api_key: int, body: Mapping[str, Any]) -> None:
    """Add the answer's non-zero error codes to the meter."""
    if api_key == ApiKey.PRODUCE:
        for topic in body["responses"]:
            parts = topic["partition_responses"]
            if any(map(_error_code, parts)):  # (a C loop: the usual answer, without errors, costs no more)
                for p in parts:
                    if p["error_code"]:
                        meter.error(api_key, p["error_code"])
        return
    if api_key == ApiKey.FETCH:
        code = body.get("error_code", 0)
        if code:
            meter.error(api_key, code)
        for topic in body["responses"]:
            parts = topic["partitions"]
            if any(map(_error_code, parts)):
                for p in parts:
                    if p["error_code"]:
                        meter.error(api_key, p["error_code"])
        return
    _walk(meter, api_key, body, 0)


def _walk(meter: RequestMeter, api_key: int, obj: Mapping[str, Any], depth: int) -> None:
    code = obj.get("error_code")
    if code:
        meter.error(api_key, code)
    if depth >= 4:  # no answer nests objects deeper than topic -> partition -> ...
        return
    for value in obj.values():
        if value.__class__ is list and value and value[0].__class__ is dict:
            for item in value:
                _walk(meter, api_key, item, depth + 1)


__all__ = ["count_errors"]
