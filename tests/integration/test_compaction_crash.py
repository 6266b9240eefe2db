"""kill -9 while the cleaner runs, 10 times at random points (bounded well under 60 s): after every restart a
consumer reads every record exactly as it was produced at that offset (old or new batches, never a mix or a torn
one), every key's latest acknowledged value is there, and the cleaner goes on from its checkpoint.

Runs on rocksdb (each rewrite is one synced WriteBatch) and on the file engine (a new compaction-log generation,
then an atomic MANIFEST switch)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mqk.testing import BrokerProcess

TOPIC = "crash-compacted"
KEYS = 300


def _produce_round(bootstrap: str, r: int, written: dict[int, tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "enable.idempotence": False})
    acked: list = []

    def on_delivery(err, msg) -> None:
        assert err is None, err
        acked.append((msg.offset(), msg.key(), msg.value()))

    for k in range(KEYS):
        producer.produce(TOPIC, key=b"key-%04d" % k, value=b"v-%d-%d" % (k, r) * 4, on_delivery=on_delivery)
    assert producer.flush(20) == 0
    for offset, key, value in acked:
        written[offset] = (key, value)


def _read_all(bootstrap: str, end: int) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "crash-reader",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    out: list = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        deadline = time.monotonic() + 20
        while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.3)
            if msg is not None and msg.error() is None:
                out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["rocksdb", "file"])
def test_kill_minus_nine_during_compaction_leaves_old_or_new(storage: str, tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    # 16 MiB segments: recovery after kill -9 verifies the last segments, and 1 GiB ones would cost seconds each
    config.write_text("log_cleaner_backoff_ms = 20\n[store]\ncommitlog_segment_bytes = 16777216\n")
    broker = BrokerProcess(tmp_path / "data", storage=storage, extra_args=["--config", str(config)]).start()
    rng = random.Random(20261129)
    started = time.monotonic()
    written: dict[int, tuple[bytes, bytes]] = {}
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        futures = admin.create_topics(
            [
                NewTopic(
                    TOPIC,
                    1,
                    1,
                    config={"cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01"},
                )
            ]
        )
        next(iter(futures.values())).result(10)
        _produce_round(broker.bootstrap, 0, written)
        for r in range(1, 11):
            _produce_round(broker.bootstrap, r, written)  # makes the log dirty: the cleaner starts within 20 ms
            # kill at a random point of the cleaner's work in the broker process: a real, random pause, since
            # nothing outside the process marks the points inside a pass
            time.sleep(rng.uniform(0.0, 0.25))
            broker.kill()
            broker.start()
            end = max(written) + 1
            got = _read_all(broker.bootstrap, end)
            assert got and got[-1][0] == end - 1, f"round {r}: read stopped at {got[-1][0] if got else None}"
            for offset, key, value in got:
                assert written[offset] == (key, value), f"round {r}: offset {offset} is not what was produced"
            latest = {}
            for offset in sorted(written):
                latest[written[offset][0]] = written[offset][1]
            assert {k: v for _, k, v in got} == latest
        # the cleaner did its work across the crashes: far fewer records than were written remain
        got = _read_all(broker.bootstrap, max(written) + 1)
        assert len(got) < len(written) / 2
        assert time.monotonic() - started < 60
    finally:
        broker.stop()
