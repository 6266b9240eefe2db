"""A full disk, for real: the test mounts its own 8 MiB tmpfs (we run as root; else a loop-mounted ext4 image) and
fills it through the Kafka protocol with confluent-kafka.

- disk_max_used_ratio: above it the producer gets KAFKA_STORAGE_ERROR (not a hang), reads go on, retention runs at
  once and frees the space of a size-limited topic, and appends resume by themselves;
- a real ENOSPC (ratio 1.0): the append that does not fit is refused with KAFKA_STORAGE_ERROR, nothing partial is
  stored (the consumer sees exactly the acknowledged records), reads keep working, writes resume once DeleteRecords
  + reclaim give space back, and a restart finds a clean tail.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from helpers import wait_until

from mqk.clock import SYSTEM_CLOCK, Clock, FakeClock
from mqk.config import TopicConfig
from mqk.services.diskguard import RETRY_SECONDS, used_ratio
from mqk.testing import ThreadedBroker, broker_config

SIZE = 8 * 1024 * 1024
VALUE = 16 * 1024


def _mount_small_fs(where: Path) -> str:
    """Mount an 8 MiB filesystem at `where`; returns how, or skips with the reason both ways failed."""
    where.mkdir(parents=True)
    tmpfs = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if tmpfs.returncode == 0:
        return "tmpfs"
    image = where.parent / "disk.img"
    try:
        with open(image, "wb") as f:
            f.truncate(SIZE)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(image), str(where)], check=True, capture_output=True, text=True)
        return "loop"
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(
            f"cannot make a small filesystem: tmpfs mount said {tmpfs.stderr.strip()!r}; loop mount failed with {exc}"
        )


def _fill(where: Path) -> Path:
    """A file taking every free byte of the filesystem at `where`."""
    path = where / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for size in (65536, 4096, 512, 64, 8, 1):  # down to the last partial block
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return path


@pytest.fixture
def small_fs(tmp_path: Path):
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) on this machine")
    mnt = tmp_path / "mnt"
    _mount_small_fs(mnt)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _start(
    data_dir: Path, ratio: float, clock: Clock = SYSTEM_CLOCK, disk_check_interval_ms: int = 100, **broker_fields
) -> ThreadedBroker:
    config = broker_config(
        "file",
        data_dir,
        commitlog_segment_bytes=512 * 1024,
        cq_units_per_file=256,
        disk_max_used_ratio=ratio,
        disk_check_interval_ms=disk_check_interval_ms,
        flush_interval_ms=50,
        checkpoint_interval_ms=100,
    )
    config = dataclasses.replace(config, log_retention_check_interval_ms=3_600_000, **broker_fields)
    return ThreadedBroker(config, clock=clock).start()


class Sender:
    """One record per request, waited for: the outcome of every send is known (acked offset or error code)."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 0,
                "retries": 0,
                "enable.idempotence": False,
                "message.timeout.ms": 10000,
                "request.timeout.ms": 10000,
            }
        )

    def send(self, topic: str, value: bytes) -> tuple[int | None, int | None]:
        """(offset, None) or (None, error code). Never waits past the client's own timeout."""
        out: list = []
        self.producer.produce(topic, value=value, key=value[:8], on_delivery=lambda err, msg: out.append((err, msg)))
        started = time.monotonic()
        while not out:
            self.producer.poll(0.1)
            assert time.monotonic() - started < 20, "a produce on a full disk hung"
        err, msg = out[0]
        return (None, err.code()) if err is not None else (msg.offset(), None)


def _consume_all(bootstrap: str, topic: str, end: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "disk-full-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while (not got or got[-1][0] < end - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return got


def _stored(outcome: tuple[int | None, int | None]) -> tuple[int | None, int | None] | None:
    """A Sender.send outcome if the record was stored, else None (try again)."""
    return outcome if outcome[1] is None else None


def _value(i: int) -> bytes:
    return (b"%08d" % i) * (VALUE // 8)


def test_above_the_ratio_appends_are_refused_and_resume_after_retention(small_fs: Path) -> None:
    # The guard runs on a FakeClock and measures after every send (its periodic measurement never comes due): it
    # sees every step from 4 MiB (the ratio) to 8 MiB (ENOSPC), however fast the sender; its retention re-runs
    # (RETRY_SECONDS apart while the disk stays full) are released by moving the clock.
    clock = FakeClock()
    broker = _start(small_fs / "data", ratio=0.5, clock=clock, disk_check_interval_ms=3_600_000)
    guard = broker.runtime.diskguard
    try:
        topic = "bounded"
        # nothing of this topic expires yet: above the ratio the guard's retention frees nothing, so appends are
        # refused until an operator lowers retention (below), as the guard leaves unexpired data alone
        broker.call(broker.store.create_topic(topic, 1, TopicConfig({"retention.ms": "-1"})))
        sender = Sender(broker.bootstrap)
        refused = resumed = 0
        acked: dict[int, bytes] = {}
        for i in range(700):  # ~11 MiB through an 8 MiB disk: only retention makes that possible
            offset, code = sender.send(topic, _value(i))
            if code is not None:
                assert code == KafkaError.KAFKA_STORAGE_ERROR, code
                refused += 1
                if refused == 1:
                    assert guard.refused > 0, "refused by ENOSPC, not by the guard"
                    broker.call(
                        broker.store.alter_topic_config(
                            topic, TopicConfig({"retention.ms": "-1", "retention.bytes": str(512 * 1024)})
                        )
                    )
                broker.advance(RETRY_SECONDS)  # the disk stays full: the next measurement runs retention again
            else:
                if refused:
                    resumed += 1
                acked[offset] = _value(i)
            broker.call(guard.check())
        assert refused > 0, "the disk never crossed disk_max_used_ratio"
        assert resumed > 0, "appends did not resume after retention freed space"
        assert broker.runtime.diskguard.refused > 0
        assert used_ratio(small_fs) < 0.9
        # reads kept working: what is retained is there, in order, every record as acknowledged (the guard may
        # still be moving the log start while we read: the disk can sit just above the ratio)
        start = broker.store.log_start_offset(topic, 0)
        end = broker.store.end_offset(topic, 0)
        assert start > 0 and list(acked) == list(range(len(acked))) and end == len(acked)
        got = _consume_all(broker.bootstrap, topic, end)
        assert got and got[0][0] >= start
        assert got == [(o, acked[o]) for o in range(got[0][0], end)]
    finally:
        broker.stop()


def test_enospc_refuses_cleanly_reads_go_on_and_restart_finds_a_clean_tail(small_fs: Path) -> None:
    data = small_fs / "data"
    broker = _start(data, ratio=1.0)  # no early refusal: the filesystem itself runs out
    topic = "filler"
    try:
        broker.call(broker.store.create_topic(topic, 1, TopicConfig({"retention.ms": "-1"})))
        sender = Sender(broker.bootstrap)
        acked: list[tuple[int, bytes]] = []
        errors = []
        for i in range(1000):
            offset, code = sender.send(topic, _value(i))
            if code is None:
                acked.append((offset, _value(i)))
            else:
                errors.append(code)
                if len(errors) >= 3:
                    break
        assert errors, "8 MiB never filled up"
        assert set(errors) == {KafkaError.KAFKA_STORAGE_ERROR}
        assert [o for o, _ in acked] == list(range(len(acked)))
        end = broker.store.end_offset(topic, 0)
        assert end == len(acked)  # no partial entry, no record that was refused
        # reads keep working on a full disk
        got = _consume_all(broker.bootstrap, topic, end)
        assert got == acked
        # free space: delete most records, reclaim, and appends resume
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        low = next(iter(admin.delete_records([TopicPartition(topic, 0, end - 5)]).values())).result(10)
        assert low.low_watermark == end - 5
        engine = broker.store.engines["file"]
        broker.call(engine.checkpoint_now())
        report = broker.call(broker.runtime.retention.run_once())
        assert report.freed["file"] > 0
        offset, code = sender.send(topic, b"after the storm")
        assert code is None and offset == end
        sender.producer.flush(5)
    finally:
        broker.stop()
    broker = _start(data, ratio=1.0)
    try:
        report = broker.store.engines["file"].recovery_report
        assert report["error"] is None, report
        assert broker.store.log_start_offset(topic, 0) == end - 5
        assert broker.store.end_offset(topic, 0) == end + 1
        got = _consume_all(broker.bootstrap, topic, end + 1)
        assert got == [*acked[-5:], (end, b"after the storm")]
    finally:
        broker.stop()
    assert not os.path.exists(data / "abort")


def test_kill_minus_nine_on_a_full_disk_restarts_with_a_clean_tail(small_fs: Path, tmp_path: Path) -> None:
    """The broker process is killed while the disk is full (ENOSPC refusals under way); it restarts on that disk
    with every free block taken, serves exactly the acknowledged records, and takes appends once space is
    freed."""
    from mqk.testing import BrokerProcess

    config = tmp_path / "broker.toml"
    config.write_text(
        "log_retention_check_interval_ms = 200\n[store]\ncommitlog_segment_bytes = 524288\n"
        "cq_units_per_file = 256\ndisk_max_used_ratio = 1.0\n"
    )
    # the last --data-dir wins: data on the small filesystem, the broker's log beside tmp_path
    broker = BrokerProcess(
        tmp_path / "proc", extra_args=["--config", str(config), "--data-dir", str(small_fs / "data")]
    ).start()
    topic = "crash-full"
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        from confluent_kafka.admin import NewTopic

        next(iter(admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "-1"})]).values())).result(10)
        sender = Sender(broker.bootstrap)
        acked: list[tuple[int, bytes]] = []
        refused = 0
        for i in range(1000):
            offset, code = sender.send(topic, _value(i))
            if code is None:
                acked.append((offset, _value(i)))
            else:
                assert code == KafkaError.KAFKA_STORAGE_ERROR
                refused += 1
                if refused >= 2:
                    break
        assert refused, "8 MiB never filled up"
        broker.kill()
        filler = _fill(small_fs)  # not a free block left: the restart itself must not need one
        broker.start()
        assert "torn tail" not in broker.log_text() and "damaged" not in broker.log_text()
        got = _consume_all(broker.bootstrap, topic, len(acked))
        assert got == acked
        filler.unlink()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        low = next(iter(admin.delete_records([TopicPartition(topic, 0, len(acked) - 2)]).values())).result(10)
        assert low.low_watermark == len(acked) - 2
        # the periodic retention pass reclaims the segments below the new log start; appends resume
        sender = Sender(broker.bootstrap)  # the restarted broker listens on a new port
        offset, code = wait_until(
            lambda: _stored(sender.send(topic, b"after the restart")), 20, "appends to resume after DeleteRecords"
        )
        assert offset == len(acked)
    finally:
        broker.stop()
