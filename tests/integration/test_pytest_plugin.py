"""mqk's pytest plugin (mqk.testing) as a project that installs mqk uses it: inner pytest runs (pytest's own
`pytester`) with the plugin's session broker, its options from the ini file and the command line, and its
`mqk_reset` marker, driven by confluent-kafka; and `ThreadedBroker.reset` on a group that still has a member.

The inner runs are in-process (fast: no interpreter and broker imports each time). pytester takes the modules an
inner run imports out of sys.modules again afterwards, so what the inner runs import (the broker, the client) is
imported here first and stays.
"""

from __future__ import annotations

import socket

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

import mqk.runtime  # noqa: F401 - imported once here, kept by pytester's sys.modules snapshot (see the docstring)
from mqk.testing import TEST_CLUSTER_STORE, PluginOptions, ThreadedBroker

pytest_plugins = ["pytester"]

#: what every inner run's ini file says: pytest-asyncio (installed beside mqk) warns at start without a loop scope
INI = """\
[pytest]
asyncio_default_fixture_loop_scope = function
"""

#: inner-test helpers: real confluent-kafka clients against a bootstrap address
CLIENTS = """
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient


def admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap})


def user_topics(bootstrap):
    return {name: len(t.partitions) for name, t in admin(bootstrap).list_topics(timeout=10).topics.items()
            if not name.startswith("__")}


def group_ids(bootstrap):
    client = admin(bootstrap)  # (held while its future is waited for: a dropped client cancels it)
    result = client.list_consumer_groups().result(10)
    return sorted(g.group_id for g in result.valid)


def produce(bootstrap, topic, values):
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(10) == 0


def consume_and_commit(bootstrap, topic, group, count):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    got = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got
"""


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(INI)
    pytester.makepyfile(mqk_clients=CLIENTS)
    return pytester


def _refused(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_the_session_broker_starts_once_and_stops_with_the_session(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        test_first="""
        import pytest

        SEEN = []

        @pytest.mark.parametrize("n", range(3))
        def test_shares(n, mqk_session_broker, mqk_session_bootstrap, mqk_options):
            SEEN.append(mqk_session_broker)
            assert all(b is mqk_session_broker for b in SEEN)
            assert mqk_session_bootstrap == mqk_session_broker.bootstrap
            assert mqk_session_broker.runtime.started
            assert mqk_session_broker.config.store.storage == "memory"
            assert mqk_options == type(mqk_options)()
        """,
        test_second="""
        from mqk_clients import produce, user_topics
        from test_first import SEEN

        def test_same_broker_in_another_module(mqk_session_broker, mqk_session_bootstrap, pytestconfig):
            assert SEEN and SEEN[0] is mqk_session_broker
            produce(mqk_session_bootstrap, "shared", [b"x"])
            assert user_topics(mqk_session_bootstrap) == {"shared": 1}
            pytestconfig.rootpath.joinpath("bootstrap.txt").write_text(mqk_session_bootstrap)
        """,
    )
    result = inner.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    assert "mqk:" not in result.stdout.str()  # default options: nothing in the header
    bootstrap = (inner.path / "bootstrap.txt").read_text()
    assert _refused(bootstrap), "the session broker still listens after the session ended"


def test_ini_options_reach_the_session_broker(inner: pytest.Pytester) -> None:
    inner.makeini(INI + "mqk_partitions = 3\nmqk_storage = file\nmqk_flush = sync\n")
    inner.makepyfile(
        test_options="""
        from pathlib import Path

        from confluent_kafka.admin import ConfigResource
        from mqk_clients import admin, produce, user_topics

        def test_configured(mqk_session_broker, mqk_session_bootstrap, tmp_path_factory):
            resource = ConfigResource(ConfigResource.Type.BROKER, "0")
            client = admin(mqk_session_bootstrap)
            configs = client.describe_configs([resource])[resource].result(10)
            values = {name: entry.value for name, entry in configs.items()}
            assert values["num.partitions"] == "3"
            assert values["auto.create.topics.enable"] == "true"
            assert values["mqk.storage"] == "file"
            assert values["mqk.flush.mode"] == "sync"
            data_dir = Path(values["log.dirs"])
            assert data_dir.is_relative_to(tmp_path_factory.getbasetemp())

            produce(mqk_session_bootstrap, "orders", [b"a", b"b"])
            assert user_topics(mqk_session_bootstrap) == {"orders": 3}
            assert any(data_dir.rglob("*")), "the file store wrote nothing in its tmp dir"
        """
    )
    result = inner.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["mqk: partitions=3 auto_create_topics=true storage=file flush=sync"])


def test_auto_create_off_and_the_command_line_winning_over_the_ini(inner: pytest.Pytester) -> None:
    inner.makeini(INI + "mqk_partitions = 3\nmqk_auto_create_topics = true\n")
    inner.makepyfile(
        test_flags="""
        from confluent_kafka import Producer
        from mqk_clients import user_topics

        def test_session(mqk_session_broker, mqk_session_bootstrap):
            assert mqk_session_broker.config.num_partitions == 5
            producer = Producer({"bootstrap.servers": mqk_session_bootstrap, "message.timeout.ms": 1000})
            failures = []
            producer.produce("unknown", b"x", on_delivery=lambda err, _msg: failures.append(err))
            producer.flush(10)
            assert len(failures) == 1 and failures[0] is not None
            assert user_topics(mqk_session_bootstrap) == {}
            assert mqk_session_broker.store.topic("unknown") is None

        def test_function_scoped_brokers(mqk_broker, mqk_file_broker, tmp_path):
            for broker in (mqk_broker, mqk_file_broker):
                assert broker.config.num_partitions == 5
                assert broker.config.auto_create_topics is False
                assert broker.config.store.flush_mode == "sync"
                assert broker.config.store.storage == "file"
                assert broker.config.store.data_dir.is_relative_to(tmp_path)
            assert mqk_broker.store is not mqk_file_broker.store
        """
    )
    result = inner.runpytest(
        "-p",
        "no:cacheprovider",
        "--mqk-partitions",
        "5",
        "--mqk-auto-create-topics=off",
        "--mqk-storage=file",
        "--mqk-flush=sync",
    )
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize(
    ("ini", "args", "message"),
    [
        ("mqk_partitions = 0", (), "mqk_partitions must be at least 1"),
        ("mqk_partitions = many", (), "mqk_partitions must be a positive integer, not 'many'"),
        ("mqk_auto_create_topics = maybe", (), "mqk_auto_create_topics must be true or false, not 'maybe'"),
        ("mqk_storage = tape", (), "mqk_storage must be one of file, memory, rocksdb, not 'tape'"),
        ("mqk_flush = never", (), "mqk_flush must be async or sync, not 'never'"),
        ("", ("--mqk-storage", "tape"), "argument --mqk-storage: invalid choice: 'tape'"),
    ],
)
def test_a_bad_option_value_stops_the_run(
    inner: pytest.Pytester, ini: str, args: tuple[str, ...], message: str
) -> None:
    inner.makeini(INI + ini + "\n")
    inner.makepyfile(test_never="def test_never():\n    raise AssertionError('the run went on')\n")
    result = inner.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_the_marker_is_registered(inner: pytest.Pytester) -> None:
    result = inner.runpytest("-p", "no:cacheprovider", "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.mqk_reset: delete every topic*"])


def test_the_reset_marker_empties_the_session_broker(inner: pytest.Pytester) -> None:
    """Kafka clients leave topics, a group and its committed offsets on the session broker; the next test sees
    them, a marked test does not (nor its class's and module's tests), and internal topics stay."""
    inner.makepyfile(
        test_reset="""
        import pytest
        from mqk_clients import consume_and_commit, group_ids, produce, user_topics

        def test_leaves_state(mqk_session_bootstrap):
            produce(mqk_session_bootstrap, "orders", [b"1", b"2", b"3"])
            produce(mqk_session_bootstrap, "audit", [b"a"])
            assert consume_and_commit(mqk_session_bootstrap, "orders", "billing", 3) == [b"1", b"2", b"3"]

        def test_unmarked_sees_it(mqk_session_broker, mqk_session_bootstrap):
            assert user_topics(mqk_session_bootstrap) == {"orders": 1, "audit": 1}
            assert group_ids(mqk_session_bootstrap) == ["billing"]
            assert mqk_session_broker.store.fetch_offsets("billing")[("orders", 0)].offset == 3

        @pytest.fixture
        def made_by_a_fixture(mqk_session_bootstrap):
            produce(mqk_session_bootstrap, "fixture-topic", [b"f"])

        @pytest.mark.mqk_reset
        def test_marked_starts_clean(made_by_a_fixture, mqk_session_broker, mqk_session_bootstrap):
            # the test's own fixture ran after the reset
            assert user_topics(mqk_session_bootstrap) == {"fixture-topic": 1}
            assert group_ids(mqk_session_bootstrap) == []
            assert mqk_session_broker.store.list_offset_groups() == []
            assert "__mqk_timer" in mqk_session_broker.store.topics()
            produce(mqk_session_bootstrap, "orders", [b"new"])
            assert consume_and_commit(mqk_session_bootstrap, "orders", "billing", 1) == [b"new"]

        @pytest.mark.mqk_reset
        class TestClassMarked:
            def test_clean_again(self, mqk_session_bootstrap):
                assert user_topics(mqk_session_bootstrap) == {}
                assert group_ids(mqk_session_bootstrap) == []
        """
    )
    result = inner.runpytest("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=4)


def test_the_options_reach_a_cluster_config() -> None:
    assert PluginOptions().cluster_config() == {"store": TEST_CLUSTER_STORE}
    options = PluginOptions(partitions=4, auto_create_topics=False, storage="memory", flush="sync")
    assert options.cluster_config() == {
        "store": {**TEST_CLUSTER_STORE, "flush_mode": "sync"},
        "num_partitions": 4,
        "auto_create_topics": False,
    }


def test_the_options_reach_a_clusters_brokers(inner: pytest.Pytester) -> None:
    """A one-broker cluster (etcd and one `mqk serve --cluster` process) started by `mqk_cluster_factory`."""
    inner.makepyfile(
        test_cluster="""
        from confluent_kafka.admin import ConfigResource
        from mqk_clients import admin, produce, user_topics

        def test_cluster(mqk_cluster_factory):
            cluster = mqk_cluster_factory(1)
            produce(cluster.bootstrap, "auto", [b"x"])
            assert user_topics(cluster.bootstrap) == {"auto": 2}
            resource = ConfigResource(ConfigResource.Type.BROKER, "0")
            client = admin(cluster.bootstrap)
            configs = client.describe_configs([resource])[resource].result(10)
            assert configs["mqk.flush.mode"].value == "sync"
        """
    )
    result = inner.runpytest("-p", "no:cacheprovider", "--mqk-partitions=2", "--mqk-flush=sync")
    result.assert_outcomes(passed=1)


def test_reset_removes_a_group_that_still_has_a_member(engine_broker: ThreadedBroker) -> None:
    """A consumer left open by an earlier test: reset drops its membership (it is told NOT_COORDINATOR and would
    join again from scratch) and deletes the group, its offsets and the topics, on either store."""
    bootstrap = engine_broker.bootstrap
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("left-open", b"x")
    assert producer.flush(10) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "still-here",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe(["left-open"])
        msg = None
        for _ in range(150):
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.value() == b"x"
        consumer.commit(asynchronous=False)
        groups = engine_broker.runtime.kafka.groups
        assert groups.groups["still-here"].members, "the consumer is not a member"

        reset = engine_broker.reset()
        assert reset.topics == ("left-open",)
        assert reset.groups == ("still-here",)
        assert "still-here" not in groups.groups
        assert engine_broker.store.list_offset_groups() == []
        assert engine_broker.store.topic("left-open") is None
        assert [name for name in engine_broker.store.topics() if not name.startswith("__")] == []
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert "left-open" not in admin.list_topics(timeout=10).topics
