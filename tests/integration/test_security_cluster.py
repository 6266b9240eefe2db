"""Security in cluster mode, for real (etcd and two `mqk serve --cluster` processes): users added through one broker
are users of every broker (etcd's `users/` keys, followed by each broker's watch), and Metadata answers each client
with every broker's address on the listener that client came in through (Kafka's rule)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable

import pytest
from helpers import CLUSTER_TESTS, leaders_seen_by, produce_body, wait_until

from mqk import errors as E
from mqk.client import Producer
from mqk.client.remoting import ClientError
from mqk.cluster_local import LocalCluster
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.native.codes import ResponseCode
from mqk.server.kafka.rawclient import RawKafkaClient, make_batch

pytestmark = CLUSTER_TESTS

NO_PERMISSION = ResponseCode.NO_PERMISSION


def mqk_users(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mqk", "users", *args], capture_output=True, text=True, timeout=60)


async def _call(address, api_key, version, body, *, sasl: tuple[str, str, str] | None = None) -> dict:
    async with await RawKafkaClient.connect(*address) as client:
        if sasl is not None:
            await client.authenticate(*sasl)
        return await client.call(api_key, version, body)


def call(address, api_key, version, body, **kw) -> dict:
    return asyncio.run(_call(address, api_key, version, body, **kw))


def create_topics_body(name: str, partitions: int) -> dict:
    return {
        "topics": [
            {"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [], "configs": []}
        ],
        "timeout_ms": 10000,
        "validate_only": False,
    }


def test_users_are_the_clusters_and_metadata_follows_the_clients_listener(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = mqk_cluster_factory(2, extra_args=("--listener", "SASL=SASL_PLAINTEXT://127.0.0.1:0"))
    b0, b1 = cluster.brokers
    assert set(b0.listeners) == set(b1.listeners) == {"SASL"}

    added = mqk_users("add", "zoe", "--password", "zoe-pass", "--bootstrap", b0.bootstrap)
    assert added.returncode == 0, added.stderr

    def known_to_b1() -> bool:
        found = call(b1.kafka, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": [{"name": "zoe"}]})
        return found["results"][0]["error_code"] == 0

    wait_until(known_to_b1, timeout=30, what="the user reaching the other broker")
    zoe = ("SCRAM-SHA-256", "zoe", "zoe-pass")
    meta = call(b1.listeners["SASL"], ApiKey.METADATA, 12, {"topics": None}, sasl=zoe)
    by_node = {b["node_id"]: (b["host"], b["port"]) for b in meta["brokers"]}
    assert by_node == {b0.node_id: b0.listeners["SASL"], b1.node_id: b1.listeners["SASL"]}
    plain = call(b1.kafka, ApiKey.METADATA, 12, {"topics": None})
    assert {b["node_id"]: (b["host"], b["port"]) for b in plain["brokers"]} == {
        b0.node_id: b0.kafka,
        b1.node_id: b1.kafka,
    }

    deleted = mqk_users("delete", "zoe", "--bootstrap", b1.bootstrap)
    assert deleted.returncode == 0, deleted.stderr

    def gone_from_b0() -> bool:
        found = call(b0.kafka, ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": [{"name": "zoe"}]})
        return found["results"][0]["error_code"] == E.ResourceNotFoundError.code

    wait_until(gone_from_b0, timeout=30, what="the deletion reaching the first broker")
    with pytest.raises(E.SaslAuthenticationFailedError):
        call(b0.listeners["SASL"], ApiKey.METADATA, 12, {"topics": None}, sasl=zoe)


def mqk_acls(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mqk", "acls", *args], capture_output=True, text=True, timeout=60)


def test_an_acl_created_through_one_broker_is_enforced_by_the_other(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    """ACLs are the cluster's (etcd's `acls/` keys, followed by each broker's watch): an ACL added through one broker
    lets a user in on the other, and its removal through that one shuts the user out on the first."""
    cluster = mqk_cluster_factory(
        2,
        extra_args=("--listener", "SASL=SASL_PLAINTEXT://127.0.0.1:0"),
        # the PLAINTEXT listeners' ANONYMOUS is the super user that sets the cluster up
        config={"authorizer": True, "super_users": "User:ANONYMOUS"},
    )
    b0, b1 = cluster.brokers
    added = mqk_users("add", "yan", "--password", "yan-pass", "--bootstrap", b0.bootstrap)
    assert added.returncode == 0, added.stderr
    created = call(b0.kafka, ApiKey.CREATE_TOPICS, 7, create_topics_body("guarded", 1))
    assert created["topics"][0]["error_code"] == 0
    yan = ("SCRAM-SHA-256", "yan", "yan-pass")

    def listed_by(broker) -> list[str]:
        meta = call(broker.listeners["SASL"], ApiKey.METADATA, 12, {"topics": None}, sasl=yan)
        return [t["name"] for t in meta["topics"]]

    wait_until(lambda: _authenticates(b1, yan), timeout=30, what="the user reaching the other broker")
    assert listed_by(b1) == []
    allowed = mqk_acls("add", "--allow-principal", "User:yan", "--operation", "DESCRIBE", "--topic", "guarded",
                       "--bootstrap", b0.bootstrap)  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    wait_until(lambda: listed_by(b1) == ["guarded"], timeout=30, what="the ACL reaching the other broker")
    listed = mqk_acls("list", "--bootstrap", b1.bootstrap)
    assert "TOPIC:LITERAL:guarded\tUser:yan\thost=*\tDESCRIBE\tALLOW" in listed.stdout, listed.stderr
    removed = mqk_acls("remove", "--allow-principal", "User:yan", "--topic", "guarded", "--bootstrap", b1.bootstrap)
    assert removed.returncode == 0 and "1 ACL(s) removed" in removed.stdout, removed.stderr
    wait_until(lambda: listed_by(b0) == [], timeout=30, what="the removal reaching the first broker")
    refused = call(b0.listeners["SASL"], ApiKey.METADATA, 12, {"topics": [{"name": "guarded"}]}, sasl=yan)
    assert refused["topics"][0]["error_code"] == E.TopicAuthorizationFailedError.code


def _authenticates(broker, sasl: tuple[str, str, str]) -> bool:
    try:
        call(broker.listeners["SASL"], ApiKey.API_VERSIONS, 0, {}, sasl=sasl)
    except E.SaslAuthenticationFailedError:
        return False
    return True


def test_a_client_quota_set_through_one_broker_is_described_and_enforced_by_every_broker(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    """Client quotas are the cluster's (etcd's `quotas/` keys), as Kafka keeps them in its metadata: set through one
    broker, another describes it and throttles a client over it (each broker measures what it serves), a restarted
    broker has it again, and its removal through the other broker lifts it everywhere."""
    cluster = mqk_cluster_factory(2)
    b0, b1 = cluster.brokers
    rate = 20_000
    quota = {
        "entity": [{"entity_type": "client-id", "entity_name": "capped"}],
        "ops": [{"key": "producer_byte_rate", "value": rate, "remove": False}],
    }
    set_ = call(b0.kafka, ApiKey.ALTER_CLIENT_QUOTAS, 1, {"validate_only": False, "entries": [quota]})
    assert [e["error_code"] for e in set_["entries"]] == [0]

    def described_by(broker) -> list:
        answer = call(broker.kafka, ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, {"components": [], "strict": False})
        return [(e["entity"][0]["entity_name"], e["values"]) for e in answer["entries"]]

    expected = [("capped", [{"key": "producer_byte_rate", "value": rate}])]
    wait_until(lambda: described_by(b1) == expected, timeout=30, what="the quota reaching the other broker")
    cluster.restart(b1.node_id)
    wait_until(lambda: described_by(b1) == expected, timeout=30, what="the quota after a restart")

    created = call(b1.kafka, ApiKey.CREATE_TOPICS, 7, create_topics_body("capped", 2))
    assert created["topics"][0]["error_code"] == 0
    # each broker throttles the client on what it leads: one partition each (placement spreads the topic)
    for broker in (b0, b1):
        leaders = wait_until(lambda b=broker: all_led(b, "capped", 2), timeout=30, what=f"capped in {broker.node_id}")
        led = [p for p, node in leaders.items() if node == broker.node_id]
        assert led, leaders
        answer = asyncio.run(_produce_as(broker.kafka, "capped", "capped", led[0], rate + 4_000))
        assert answer["responses"][0]["partition_responses"][0]["error_code"] == 0
        assert answer["throttle_time_ms"] > 0, f"node {broker.node_id} did not throttle"

    lifted = dict(quota, ops=[{"key": "producer_byte_rate", "value": 0, "remove": True}])
    removed = call(b1.kafka, ApiKey.ALTER_CLIENT_QUOTAS, 1, {"validate_only": False, "entries": [lifted]})
    assert [e["error_code"] for e in removed["entries"]] == [0]
    wait_until(lambda: described_by(b0) == [], timeout=30, what="the removal reaching the first broker")


def all_led(broker, topic: str, partitions: int) -> dict[int, int] | None:
    """partition -> leader in the broker's own Metadata once it has the topic with every partition led, else None:
    the broker asked to create a topic answers once its view has it; the others learn it by their etcd watch a
    moment later."""
    leaders = leaders_seen_by(broker.kafka, topic)
    return leaders if len(leaders) == partitions and min(leaders.values()) >= 0 else None


async def _produce_as(address, client_id: str, topic: str, partition: int, size: int) -> dict:
    async with await RawKafkaClient.connect(*address, client_id) as client:
        return await client.call(ApiKey.PRODUCE, 9, produce_body(topic, make_batch([b"q" * size]), partition))


def test_a_rocketmq_access_key_added_to_the_cluster_signs_requests_to_every_broker(
    mqk_cluster_factory: Callable[..., LocalCluster],
) -> None:
    """RocketMQ access keys are the cluster's (etcd's `rocketmq-keys/` keys, written by `mqk users add-rocketmq
    --cluster`): a RocketMQ client signing with one is let in by every broker under the cluster's ACLs, a wrong
    secret is refused, and the key's deletion shuts the client out everywhere."""
    cluster = mqk_cluster_factory(2, config={"authorizer": True, "super_users": "User:ANONYMOUS"})
    b0, b1 = cluster.brokers
    where = ("--cluster", cluster.etcd_url, "--cluster-id", cluster.cluster_id)
    added = subprocess.run(
        [sys.executable, "-m", "mqk", "users", "add-rocketmq", "rk", "--secret-stdin", *where],
        input="rk-secret\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    listed = mqk_users("list-rocketmq", *where)
    assert listed.returncode == 0 and listed.stdout.split() == ["rk"], listed
    created = call(b0.kafka, ApiKey.CREATE_TOPICS, 7, create_topics_body("signed", 2))
    assert created["topics"][0]["error_code"] == 0
    granted = mqk_acls("add", "--allow-principal", "User:rk", "--operation", "WRITE", "--topic", "signed",
                       "--bootstrap", b0.bootstrap)  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    meta = call(b0.kafka, ApiKey.METADATA, 12, {"topics": [{"name": "signed"}]})
    leaders = {p["leader_id"] for p in meta["topics"][0]["partitions"]}
    assert leaders == {b0.node_id, b1.node_id}, meta  # one partition on each broker: both check the signature
    # (the producer below asks b1's name server for the topic's route)
    wait_until(lambda: len(leaders_seen_by(b1.kafka, "signed")) == 2, timeout=30, what="b1 to know the topic")

    namesrv = "{}:{}".format(*b1.namesrv)

    async def send_everywhere(secret: str) -> list[int]:
        """Send one message to every queue of the topic signed with `secret`; the response codes."""
        producer = Producer(namesrv, "signed-pg")
        producer.credentials = ("rk", secret)
        codes = []
        async with producer:
            route = await producer.route("signed")
            assert len({q.broker_name for q in route.queues}) == 2, route
            for _queue in route.queues:  # the producer goes round the queues: each one once
                try:
                    await producer.send("signed", b"signed body")
                    codes.append(0)
                except ClientError as exc:
                    codes.append(exc.code)
        return codes

    # the key reaches each broker through its watch: retried until both take it
    wait_until(lambda: asyncio.run(send_everywhere("rk-secret")) == [0, 0], timeout=30, what="the key signing")
    assert asyncio.run(send_everywhere("not-the-secret")) == [NO_PERMISSION] * 2

    deleted = mqk_users("delete-rocketmq", "rk", *where)
    assert deleted.returncode == 0, deleted.stderr
    wait_until(
        lambda: asyncio.run(send_everywhere("rk-secret")) == [NO_PERMISSION] * 2,
        timeout=30,
        what="the deletion reaching both brokers",
    )
    assert mqk_users("delete-rocketmq", "rk", *where).returncode == 1
