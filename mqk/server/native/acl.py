"""RocketMQ plain ACL on the broker's remoting listener: who signed a request, and whether that principal may do it.

With the authorizer on (the same `authorizer` switch as Kafka's), every request must carry RocketMQ's `AccessKey`
and `Signature` ext fields (mqk.protocol.native.signature) made with the secret of a known access key
(mqk.broker.security.access_keys). The access key NAME acts as `User:NAME` and is asked about Kafka's ACLs, so one
set of ACLs governs both protocols. What each request needs, in Kafka's terms:

- sends (SEND_MESSAGE, _V2, batch): WRITE on the topic, and CREATE (on the cluster or the topic) too when the topic
  does not exist yet (the send would create it);
- pulls, consumer offset queries and commits: READ on the topic and READ on the consumer group;
- a consumer's heartbeat, unregistering, queue locks, CONSUMER_SEND_MSG_BACK: READ on its group;
- queue offsets by position or time (GET_MAX_OFFSET ...): DESCRIBE on the topic (Kafka's ListOffsets);
- QUERY_MESSAGE: READ on the topic; VIEW_MESSAGE_BY_ID names no topic, only a commit-log offset: its processor
  looks the message up and then asks `check_viewed` for READ on the message's topic, or DESCRIBE on the cluster;
- admin: UPDATE_AND_CREATE_TOPIC CREATE on the cluster or the topic, DELETE_TOPIC_IN_BROKER DELETE on the topic;
  topic and consume statistics DESCRIBE (DESCRIBE_CONFIGS for configs) on the topic or group; broker-wide
  information (runtime info, broker config, every topic's config) DESCRIBE_CONFIGS / DESCRIBE on the cluster.

RocketMQ's internal topics of a group (`%RETRY%G`, `%DLQ%G`) stand for the group: reading or writing one needs READ
on group G. Everything else (CHECK_CLIENT_CONFIG, END_TRANSACTION: RocketMQ checks no resource for them either)
needs a valid signature only. An unsigned request, an unknown access key, a wrong signature and a denied operation
are answered NO_PERMISSION with a remark saying which, and logged. With the authorizer off nothing is checked: the
fields are accepted and ignored. The name server checks nothing, as RocketMQ's does (its ACL is the broker's).

VIEW_MESSAGE_BY_ID is the one request whose resource only its answer knows. Its signature is checked here, with
every request's, before anything is looked up; once the processor has found the message, `check_viewed` asks the
same decision for READ on the topic the message is stored in (a group's retry or dead-letter topic: READ on the
group). That is an internal topic for a delayed message still waiting in the timer's topic or a transaction's half
message: a reader of the topic it is bound for cannot pull it yet either. DESCRIBE on the cluster, what the
request needed before, views any message still (operators' tools hold it); only such a principal is told that an
offset names no message: anyone else gets NO_PERMISSION (RocketMQ 5's answer for a topic one may not GET) with
one remark both for a message it may not see and for none, so it never learns whether such a message exists, as
Kafka answers TOPIC_AUTHORIZATION_FAILED for a topic one may not describe whether it exists or not.
(RocketMQ 5 authorizes, before its lookup, the topic named by the request's optional `topic` field, then serves the
message at the offset whatever its topic is; mqk ignores that field.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from mqk.broker.security import Principal, Security
from mqk.broker.security.principal import USER
from mqk.logfmt import LogThrottle
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.protocol.native.signature import ACCESS_KEY, SIGNATURE, verify

log = logging.getLogger("mqk.native")

TOPIC, GROUP, CLUSTER, CLUSTER_NAME = "TOPIC", "GROUP", "CLUSTER", "kafka-cluster"
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"

#: (operation, resource type, resource name)
Need = tuple[str, str, str]


def _topic(operation: str, name: str | None) -> Iterator[Need]:
    if not name:
        return  # the handler refuses a request without its topic
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            yield ("READ", GROUP, name[len(prefix) :])
            return
    yield (operation, TOPIC, name)


def _group(operation: str, name: str | None) -> Iterator[Need]:
    if name:
        yield (operation, GROUP, name)


def _cluster(operation: str) -> Iterator[Need]:
    yield (operation, CLUSTER, CLUSTER_NAME)


def _body(cmd: RemotingCommand) -> dict[str, Any]:
    try:
        doc = json.loads(cmd.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _send(cmd: RemotingCommand) -> Iterator[Need]:
    ext = cmd.ext_fields
    return _topic("WRITE", ext.get("topic") or ext.get("b"))  # SEND_MESSAGE_V2 names its fields by letter


def _read_topic_and_group(cmd: RemotingCommand) -> Iterator[Need]:
    yield from _topic("READ", cmd.ext_fields.get("topic"))
    yield from _group("READ", cmd.ext_fields.get("consumerGroup"))


def _batch_ack(cmd: RemotingCommand) -> Iterator[Need]:
    acks = _body(cmd).get("acks")
    for ack in acks if isinstance(acks, list) else ():
        if isinstance(ack, dict):
            yield from _group("READ", str(ack.get("c") or ack.get("consumerGroup") or "") or None)
            yield from _topic("READ", str(ack.get("t") or ack.get("topic") or "") or None)


def _subscription_group(cmd: RemotingCommand) -> Iterator[Need]:
    group = _body(cmd).get("groupName")
    yield ("ALTER_CONFIGS", GROUP, str(group) if group else "")


def _heartbeat(cmd: RemotingCommand) -> Iterator[Need]:
    consumers = _body(cmd).get("consumerDataSet")
    for consumer in consumers if isinstance(consumers, list) else ():
        if isinstance(consumer, dict) and consumer.get("groupName"):
            yield ("READ", GROUP, str(consumer["groupName"]))


def _body_group(cmd: RemotingCommand) -> Iterator[Need]:
    group = _body(cmd).get("consumerGroup")
    return _group("READ", str(group) if group else None)


def _ext(
    kind: Callable[[str, str | None], Iterator[Need]], operation: str, field: str
) -> Callable[[RemotingCommand], Iterator[Need]]:
    return lambda cmd: kind(operation, cmd.ext_fields.get(field))


def _create_topic(cmd: RemotingCommand) -> Iterator[Need]:
    yield ("CREATE", TOPIC, cmd.ext_fields.get("topic") or "")


def _consume_stats(cmd: RemotingCommand) -> Iterator[Need]:
    yield from _group("DESCRIBE", cmd.ext_fields.get("consumerGroup"))
    yield from _topic("DESCRIBE", cmd.ext_fields.get("topic"))


_NEEDS: dict[int, Callable[[RemotingCommand], Iterator[Need]]] = {
    RequestCode.SEND_MESSAGE: _send,
    RequestCode.SEND_MESSAGE_V2: _send,
    RequestCode.SEND_BATCH_MESSAGE: _send,
    RequestCode.CONSUMER_SEND_MSG_BACK: _ext(_group, "READ", "group"),
    RequestCode.RECALL_MESSAGE: _ext(_topic, "WRITE", "topic"),
    RequestCode.PULL_MESSAGE: _read_topic_and_group,
    RequestCode.POP_MESSAGE: _read_topic_and_group,
    RequestCode.ACK_MESSAGE: _read_topic_and_group,
    RequestCode.BATCH_ACK_MESSAGE: _batch_ack,
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: _read_topic_and_group,
    RequestCode.NOTIFICATION: _read_topic_and_group,
    RequestCode.POLLING_INFO: _read_topic_and_group,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: _subscription_group,
    RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG: _ext(_group, "DESCRIBE_CONFIGS", "group"),
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: lambda cmd: _cluster("DESCRIBE_CONFIGS"),
    RequestCode.DELETE_SUBSCRIPTIONGROUP: _ext(_group, "DELETE", "groupName"),
    RequestCode.QUERY_CONSUMER_OFFSET: _read_topic_and_group,
    RequestCode.UPDATE_CONSUMER_OFFSET: _read_topic_and_group,
    RequestCode.GET_MAX_OFFSET: _ext(_topic, "DESCRIBE", "topic"),
    RequestCode.GET_MIN_OFFSET: _ext(_topic, "DESCRIBE", "topic"),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: _ext(_topic, "DESCRIBE", "topic"),
    RequestCode.GET_EARLIEST_MSG_STORETIME: _ext(_topic, "DESCRIBE", "topic"),
    RequestCode.HEART_BEAT: _heartbeat,
    RequestCode.UNREGISTER_CLIENT: _ext(_group, "READ", "consumerGroup"),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: _ext(_group, "DESCRIBE", "consumerGroup"),
    RequestCode.GET_CONSUMER_CONNECTION_LIST: _ext(_group, "DESCRIBE", "consumerGroup"),
    RequestCode.LOCK_BATCH_MQ: _body_group,
    RequestCode.UNLOCK_BATCH_MQ: _body_group,
    RequestCode.UPDATE_AND_CREATE_TOPIC: _create_topic,
    RequestCode.DELETE_TOPIC_IN_BROKER: _ext(_topic, "DELETE", "topic"),
    RequestCode.GET_ALL_TOPIC_CONFIG: lambda cmd: _cluster("DESCRIBE"),
    RequestCode.QUERY_MESSAGE: _ext(_topic, "READ", "topic"),
    # VIEW_MESSAGE_BY_ID: a valid signature here; its processor asks check_viewed once it knows the message's topic
    RequestCode.GET_BROKER_RUNTIME_INFO: lambda cmd: _cluster("DESCRIBE_CONFIGS"),
    RequestCode.GET_BROKER_CONFIG: lambda cmd: _cluster("DESCRIBE_CONFIGS"),
    RequestCode.GET_TOPIC_STATS_INFO: _ext(_topic, "DESCRIBE", "topic"),
    RequestCode.GET_CONSUME_STATS: _consume_stats,
    RequestCode.GET_TOPIC_CONFIG: _ext(_topic, "DESCRIBE_CONFIGS", "topic"),
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: _ext(_topic, "DESCRIBE", "topic"),
    RequestCode.QUERY_TOPICS_BY_CONSUMER: _ext(_group, "DESCRIBE", "group"),
}


_SENDS = frozenset((RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE))


def needs(cmd: RemotingCommand) -> list[Need]:
    """What the request's principal must be allowed (see the module docstring)."""
    what = _NEEDS.get(cmd.code)
    return [] if what is None else list(what(cmd))


class NativeAcl:
    """The broker listener's check, asked before a request reaches its processor."""

    def __init__(self, enabled: bool, security: Security, topic_exists: Callable[[str], bool]) -> None:
        """`enabled`: the broker's `authorizer` switch (what turns Kafka's ACL authorizer on)."""
        self.enabled = enabled
        self.security = security
        self.topic_exists = topic_exists
        self._log_throttle = LogThrottle()

    def check(self, peer: tuple[str, int], cmd: RemotingCommand) -> RemotingCommand | None:
        """None when the request may go on; else the NO_PERMISSION answer to send instead."""
        if not self.enabled:
            return None
        ext = cmd.ext_fields
        access_key = ext.get(ACCESS_KEY)
        if not access_key or SIGNATURE not in ext:
            return self._refuse(peer, cmd, "", "request is not signed (no AccessKey/Signature)")
        secret = self.security.access_keys.secret(access_key)
        if secret is None:
            return self._refuse(peer, cmd, access_key, f"unknown AccessKey {access_key}")
        if not verify(ext, cmd.body, secret):
            return self._refuse(peer, cmd, access_key, f"Check signature failed for accessKey={access_key}")
        wanted = needs(cmd)
        if cmd.code in _SENDS:
            topic = cmd.ext_fields.get("topic") or cmd.ext_fields.get("b")
            if topic and (TOPIC, topic) in {(t, n) for _, t, n in wanted} and not self.topic_exists(topic):
                wanted.append(("CREATE", TOPIC, topic))
        why = self._denied(peer, access_key, wanted)
        return None if why is None else self._refuse(peer, cmd, access_key, why)

    def check_viewed(self, peer: tuple[str, int], cmd: RemotingCommand, topic: str | None) -> RemotingCommand | None:
        """VIEW_MESSAGE_BY_ID once its processor has looked the offset up (`topic`: the message's, None if the
        offset names no message), after `check` let the request in (its signature is good). None when the peer
        may have the answer; else the NO_PERMISSION answer to send instead, the same for a message the peer may
        not see and for one that does not exist (see the module docstring)."""
        if not self.enabled:
            return None
        access_key = cmd.ext_fields[ACCESS_KEY]
        # READ on the topic, as QUERY_MESSAGE and a pull need. DESCRIBE on the cluster is the alternative, as CREATE
        # on the cluster is for a topic's CREATE: it kept what it allowed before this check moved to the message's
        # topic, and it may see any message, so telling it that an offset names none leaks nothing
        why = (
            "the offset names no message"
            if topic is None
            else self._denied(peer, access_key, list(_topic("READ", topic)))
        )
        if why is None or self._denied(peer, access_key, list(_cluster("DESCRIBE"))) is None:
            return None
        told = (
            f"{Principal(USER, access_key)} may not view the message at offset {cmd.ext_fields.get('offset')}, if "
            "there is one there (it needs READ on the message's topic or DESCRIBE on the cluster)"
        )
        return self._refuse(peer, cmd, access_key, why, told)

    def _denied(self, peer: tuple[str, int], access_key: str, wanted: list[Need]) -> str | None:
        """Why the access key's principal may not have all of `wanted`, or None if it may."""
        authorizer = self.security.authorizer
        principal = self.security.access_key_principal(access_key)
        for operation, resource_type, name in wanted:
            if operation == "CREATE" and authorizer.authorize(principal, peer[0], "CREATE", CLUSTER, CLUSTER_NAME):
                continue  # CREATE on the cluster covers every topic, as Kafka's CreateTopics
            if not authorizer.authorize(principal, peer[0], operation, resource_type, name):
                return f"{principal} is not allowed {operation} on {resource_type} {name}"
        return None

    def _refuse(
        self, peer: tuple[str, int], cmd: RemotingCommand, access_key: str, why: str, told: str | None = None
    ) -> RemotingCommand:
        """The NO_PERMISSION answer, telling the peer `told` (default: `why`); the log line says `why`."""
        # one line per address, access key and request code per interval: a client retrying a refused request is
        # not a log flood
        held = self._log_throttle.allow((peer[0], access_key, cmd.code))
        if held is not None:
            log.warning(
                "rocketmq-broker: NO_PERMISSION for request code %s from %s:%s%s: %s%s",
                cmd.code,
                peer[0],
                peer[1],
                f" (AccessKey {access_key})" if access_key else "",
                why,
                f" ({held} more like it refused since its last line)" if held else "",
            )
        return cmd.response(ResponseCode.NO_PERMISSION, f"No permission: {why if told is None else told}")
