"""The `mqk` admin and data commands that talk to a running broker: topics, groups, users, ACLs, produce, consume,
query.

They speak the broker's own wire protocols through mqk's codecs (no third-party client needed): Kafka requests
through `RawKafkaClient`, RocketMQ remoting through `mqk.client`. One connection, one request at a time: these are
tools for people, not load generators (see bench/ for those).

Every Kafka command takes the client security options of Kafka's tools: `--security-protocol` (PLAINTEXT, SSL,
SASL_PLAINTEXT, SASL_SSL), `--sasl-mechanism` / `--sasl-username` / `--sasl-password` (or the MQK_SASL_PASSWORD
environment variable, which keeps the password out of the process list) and `--ssl-cafile` / `--ssl-certfile` /
`--ssl-keyfile`. `mqk users` lists, adds and deletes SCRAM users through DescribeUserScramCredentials and
AlterUserScramCredentials; the salted password is derived here, so the password itself never reaches the broker.
`mqk acls` lists, adds and removes ACL bindings through DescribeAcls, CreateAcls and DeleteAcls, with the options of
Kafka's kafka-acls tool (`--allow-principal`, `--deny-principal`, `--operation`, `--topic`, `--group`, `--cluster`,
`--transactional-id`, `--resource-pattern-type`, `--allow-host`, `--deny-host`). `mqk users add-rocketmq` /
`delete-rocketmq` / `list-rocketmq` edit the RocketMQ access keys in the broker's data directory directly
(mqk.broker.security.access_keys: plain secrets, which RocketMQ's signatures need; a running broker rereads them),
or with `--cluster etcd://...` the cluster's, in etcd (every broker of the cluster follows them).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import getpass
import json
import os
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mqk._fast import load
from mqk.client import Message, Producer
from mqk.client.base import ClientBase
from mqk.client.remoting import ClientError
from mqk.client.tools import consume
from mqk.config import SASL_MECHANISMS, SECURITY_PROTOCOLS, parse_hostport
from mqk.errors import KafkaError, MqkError
from mqk.protocol.kafka.api import ApiKey
from mqk.protocol.kafka.records import decompress
from mqk.protocol.native.codes import RequestCode, ResponseCode
from mqk.protocol.native.message import decode_messages
from mqk.server.kafka.rawclient import RawKafkaClient, client_ssl_context, make_batch

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_NAMESRV = "127.0.0.1:9876"


class CommandError(Exception):
    """A broker answered with an error; printed as one line, exit code 1."""


def _check(code: int, what: str, message: str | None = None) -> None:
    if code:
        name = KafkaError.for_code(code).__name__
        raise CommandError(f"{what}: {name} ({code}){': ' + message if message else ''}")


def with_kafka_connection(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--bootstrap and Kafka's client security options, as every Kafka command of the CLI takes them."""
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


async def _kafka(args: argparse.Namespace, address: tuple[str, int] | None = None) -> RawKafkaClient:
    """A connection to `--bootstrap` (or to `address`, another broker of the cluster), secured as the options say."""
    host, port = address if address is not None else parse_hostport(args.bootstrap)
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


#: FindCoordinator's answer while the offsets topic is being created (the first ask creates it in cluster mode)
_COORDINATOR_NOT_AVAILABLE = 15
#: a coordinator's answers that Kafka's admin client retries: loading the group's offsets (a partition of a new
#: offsets topic not made on its broker yet, a new master), none now, another broker coordinates it now
_ASK_COORDINATOR_AGAIN = (14, 15, 16)
#: how often a coordinator or a leader is asked for again while there is none (a topic just created, a failover)
_ASK_AGAIN = 20


class Brokers:
    """The connections of one admin command, routed as Kafka's admin client routes its requests: `call` goes to
    `--bootstrap` (metadata, topic and config admin, ACLs, users, quotas: any broker answers those), and the broker
    that must answer the rest is connected on demand, secured as the options say: a partition's leader
    (`leader`, `list_offsets`), a group's coordinator (`coordinator`), every broker (`each`). On a single broker
    they are all the one connection."""

    #: the pause before a coordinator that answered a retriable error is asked again
    pause_s = 0.25

    def __init__(self, args: argparse.Namespace, bootstrap: RawKafkaClient) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self._clients: dict[tuple[str, int], RawKafkaClient] = {parse_hostport(args.bootstrap): bootstrap}
        self._addresses: dict[int, tuple[str, int]] = {}
        self._leaders: dict[str, dict[int, int]] = {}

    @classmethod
    async def open(cls, args: argparse.Namespace) -> Brokers:
        return cls(args, await _kafka(args))

    async def call(self, api_key: int, version: int, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return await self.bootstrap.call(api_key, version, body, **kw)

    async def to(self, node: int) -> RawKafkaClient:
        """The connection to broker `node` (CommandError when the cluster names no such live broker)."""
        if node not in self._addresses:
            await self._learn([])
        address = self._addresses.get(node)
        if address is None:
            raise CommandError(f"broker {node} is not live now")
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = await _kafka(self.args, address)
        return client

    async def _learn(self, topics: list[str]) -> dict[str, Any]:
        meta = await self.call(ApiKey.METADATA, 12, {"topics": [{"name": t} for t in topics]})
        self._addresses = {b["node_id"]: (b["host"], b["port"]) for b in meta["brokers"]}
        for topic in meta["topics"]:
            if topic["error_code"] == 0:
                self._leaders[topic["name"]] = {p["partition_index"]: p["leader_id"] for p in topic["partitions"]}
        return meta

    async def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> its leader's node id (-1: none live now)."""
        if topic not in self._leaders:
            meta = await self._learn([topic])
            _check(meta["topics"][0]["error_code"], f"topic {topic}")
        return self._leaders[topic]

    async def _leader_node(self, topic: str, partition: int) -> int:
        """The node id of `topic`[`partition`]'s leader (asked again for a few seconds while it has none: a topic
        just created, a failover)."""
        for _ in range(_ASK_AGAIN):
            node = (await self.leaders(topic)).get(partition)
            if node is None:
                raise CommandError(f"{topic} has no partition {partition}")
            if node >= 0:
                return node
            del self._leaders[topic]
            await asyncio.sleep(0.25)
        raise CommandError(f"{topic}[{partition}]: no live leader now")

    async def leader(self, topic: str, partition: int) -> RawKafkaClient:
        """The connection to the leader of `topic`[`partition`]."""
        return await self.to(await self._leader_node(topic, partition))

    async def by_leader(self, topic: str, partitions: list[int]) -> list[tuple[RawKafkaClient, list[int]]]:
        """`partitions` grouped by their leader, with its connection."""
        grouped: dict[int, list[int]] = {}
        for partition in partitions:
            grouped.setdefault(await self._leader_node(topic, partition), []).append(partition)
        return [(await self.to(node), parts) for node, parts in sorted(grouped.items())]

    async def list_offsets(self, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]:
        """`list_offsets`, each partition asked of its leader."""
        out: dict[int, int] = {}
        for client, parts in await self.by_leader(topic, partitions):
            out.update(await list_offsets(client, topic, parts, timestamp))
        return out

    async def coordinator(self, group: str, key_type: int = 0) -> RawKafkaClient:
        """The connection to `group`'s coordinator (key type 1: a transactional id's), by FindCoordinator, asked
        again while the offsets topic that places it is being created."""
        for _ in range(_ASK_AGAIN):
            resp = await self.call(ApiKey.FIND_COORDINATOR, 4, {"key_type": key_type, "coordinator_keys": [group]})
            found = resp["coordinators"][0]
            if found["error_code"] != _COORDINATOR_NOT_AVAILABLE:
                break
            await asyncio.sleep(0.25)
        _check(found["error_code"], f"coordinator of {group}", found.get("error_message"))
        address = (found["host"], found["port"])
        self._addresses[found["node_id"]] = address
        return await self.to(found["node_id"])

    async def at_coordinator(
        self, group: str, api: int, version: int, body: dict[str, Any], code_of: Callable[[dict[str, Any]], int]
    ) -> tuple[RawKafkaClient, dict[str, Any]]:
        """One request to `group`'s coordinator, and its answer (with the connection, for the next one); asked
        again, of the coordinator found again, while `code_of(answer)` is one Kafka's admin client retries."""
        for _ in range(_ASK_AGAIN):
            client = await self.coordinator(group)
            resp = await client.call(api, version, body)
            if code_of(resp) not in _ASK_COORDINATOR_AGAIN:
                break
            await asyncio.sleep(self.pause_s)
        return client, resp

    async def list_groups(self, version: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        """ListGroups asked of every broker (each lists the groups it coordinates, as Kafka's admin client asks
        them all), the groups by id."""
        found: dict[str, dict[str, Any]] = {}
        for client in await self.each():
            resp = await client.call(ApiKey.LIST_GROUPS, version, body)
            _check(resp["error_code"], "list groups")
            found.update((g["group_id"], g) for g in resp["groups"])
        return sorted(found.values(), key=lambda g: g["group_id"])

    async def each(self) -> list[RawKafkaClient]:
        """A connection to every live broker."""
        await self._learn([])
        return [await self.to(node) for node in sorted(self._addresses)]

    async def close(self) -> None:
        for client in {id(c): c for c in [self.bootstrap, *self._clients.values()]}.values():
            await client.close()

    async def __aenter__(self) -> Brokers:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


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
    topics = sorted(meta["topics"], key=lambda t: t["name"])
    if args.json:
        _print_json([{"topic": t["name"], "partitions": len(t["partitions"])} for t in topics])
        return
    for topic in topics:
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
    """Partitions (leader, start and end offsets, size in bytes from DescribeLogDirs) and settings."""
    async with await Brokers.open(args) as brokers:
        meta = await brokers.call(ApiKey.METADATA, 12, {"topics": [{"name": args.topic}]})
        topic = meta["topics"][0]
        _check(topic["error_code"], f"describe {args.topic}")
        cfg = await brokers.call(
            ApiKey.DESCRIBE_CONFIGS,
            4,
            {"resources": [{"resource_type": 2, "resource_name": args.topic, "configuration_keys": None}]},
        )
        indexes = [p["partition_index"] for p in topic["partitions"]]
        live = [p["partition_index"] for p in topic["partitions"] if p["leader_id"] >= 0]
        ends = await brokers.list_offsets(args.topic, live, -1)
        starts = await brokers.list_offsets(args.topic, live, -2)
        # (each broker describes the partitions it holds: the sizes are the leaders')
        leaders = {p["partition_index"]: p["leader_id"] for p in topic["partitions"]}
        sizes: dict[int, int] = {}
        for node, client in [(n, await brokers.to(n)) for n in sorted({n for n in leaders.values() if n >= 0})]:
            dirs = await client.call(
                ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": [{"topic": args.topic, "partitions": indexes}]}
            )
            sizes.update(
                (p["partition_index"], p["partition_size"])
                for result in dirs["results"]
                for t in result["topics"]
                if t["name"] == args.topic
                for p in t["partitions"]
                if leaders.get(p["partition_index"]) == node
            )
    partitions = [
        {
            "partition": p["partition_index"],
            "leader": p["leader_id"],
            "start_offset": starts.get(p["partition_index"]),
            "end_offset": ends.get(p["partition_index"]),
            "size_bytes": sizes.get(p["partition_index"]),
        }
        for p in sorted(topic["partitions"], key=lambda p: p["partition_index"])
    ]
    configs = sorted(cfg["results"][0]["configs"], key=lambda c: c["name"])
    if args.json:
        _print_json(
            {
                "topic": args.topic,
                "partitions": partitions,
                "size_bytes": sum(p["size_bytes"] or 0 for p in partitions),
                "configs": {c["name"]: c["value"] for c in configs},
                "overrides": sorted(c["name"] for c in configs if c.get("config_source", 5) != 5),
            }
        )
        return
    total = sum(p["size_bytes"] or 0 for p in partitions)
    print(f"topic {args.topic}  partitions={len(partitions)}  size={_human(total)}")
    for p in partitions:
        print(
            f"  partition {p['partition']}\tleader={p['leader']}\tend_offset={_or(p['end_offset'])}"
            f"\tstart_offset={_or(p['start_offset'])}\tsize_bytes={_or(p['size_bytes'])}"
        )
    for entry in configs:
        marker = "" if entry.get("config_source", 5) == 5 else "  (set)"
        print(f"  {entry['name']}={entry['value']}{marker}")


async def topics_delete_records(args: argparse.Namespace) -> None:
    """Move a partition's log start offset to `--before` (-1: the end offset), as kafka-delete-records does."""
    async with await Brokers.open(args) as brokers:
        resp = await (await brokers.leader(args.topic, args.partition)).call(
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
    async with await Brokers.open(args) as brokers:
        groups = await brokers.list_groups(4, {"states_filter": []})
    if args.json:
        _print_json(
            [
                {"group": g["group_id"], "state": g.get("group_state", ""), "protocol_type": g["protocol_type"]}
                for g in groups
            ]
        )
        return
    for group in groups:
        print(f"{group['group_id']}\t{group.get('group_state', '')}\t{group['protocol_type']}")


async def groups_describe(args: argparse.Namespace) -> None:
    """The group's state and members, and per partition its committed offset, log end offset and lag, with the
    member it is assigned to (kafka-consumer-groups --describe)."""
    async with await Brokers.open(args) as brokers:
        group, rows = await describe_group(brokers, args.group)
    if args.json:
        _print_json(
            {
                "group": args.group,
                "state": group["group_state"],
                "protocol": group["protocol_data"],
                "members": [
                    {"member_id": m["member_id"], "client_id": m["client_id"], "host": m["client_host"]}
                    for m in group["members"]
                ],
                "partitions": rows,
            }
        )
        return
    print(f"group {args.group}  state={group['group_state']}  protocol={group['protocol_data']}")
    for member in group["members"]:
        print(f"  member {member['member_id']}  client={member['client_id']}  host={member['client_host']}")
    _print_table(
        ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"],
        [
            [
                args.group,
                r["topic"],
                r["partition"],
                _or(r["current_offset"], "-"),
                _or(r["log_end_offset"], "-"),
                _or(r["lag"], "-"),
                r["consumer_id"] or "-",
                r["host"] or "-",
                r["client_id"] or "-",
            ]
            for r in rows
        ],
    )


async def describe_group(brokers: Brokers, group_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(DescribeGroups' group, a row per partition the group has committed or been assigned: topic, partition,
    current_offset, log_end_offset, lag, consumer_id, host, client_id)."""
    client, resp = await brokers.at_coordinator(
        group_id, ApiKey.DESCRIBE_GROUPS, 5, {"groups": [group_id]}, lambda r: r["groups"][0]["error_code"]
    )
    group = resp["groups"][0]
    _check(group["error_code"], f"describe {group_id}")
    fetched = await client.call(ApiKey.OFFSET_FETCH, 7, {"group_id": group_id, "topics": None})
    _check(fetched.get("error_code", 0), f"offsets of {group_id}")
    committed = {
        (t["name"], p["partition_index"]): p["committed_offset"]
        for t in fetched.get("topics") or []
        for p in t["partitions"]
        if p["committed_offset"] >= 0
    }
    owner: dict[tuple[str, int], dict[str, Any]] = {}
    for member in group["members"]:
        for topic, partitions in decode_assignment(member["member_assignment"]):
            for partition in partitions:
                owner[(topic, partition)] = member
    keys = sorted(set(committed) | set(owner))
    ends: dict[tuple[str, int], int] = {}
    for topic in sorted({t for t, _p in keys}):
        for partition, offset in (await brokers.list_offsets(topic, [p for t, p in keys if t == topic], -1)).items():
            ends[(topic, partition)] = offset
    rows = []
    for key in keys:
        current, end = committed.get(key), ends.get(key)
        member = owner.get(key)
        rows.append(
            {
                "topic": key[0],
                "partition": key[1],
                "current_offset": current,
                "log_end_offset": end,
                "lag": max(0, end - current) if current is not None and end is not None else None,
                "consumer_id": member["member_id"] if member else None,
                "host": member["client_host"] if member else None,
                "client_id": member["client_id"] if member else None,
            }
        )
    return group, rows


def decode_assignment(data: bytes | None) -> list[tuple[str, list[int]]]:
    """The (topic, partitions) of a consumer protocol assignment (version, [topic, [partition]], user data); []
    for one that is empty or not the consumer protocol's."""
    if not data or len(data) < 6:
        return []
    try:
        pos = 2
        (count,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out = []
        for _ in range(max(count, 0)):
            (size,) = struct.unpack_from(">h", data, pos)
            pos += 2
            topic = bytes(data[pos : pos + size]).decode()
            pos += size
            (n,) = struct.unpack_from(">i", data, pos)
            pos += 4
            partitions = list(struct.unpack_from(f">{max(n, 0)}i", data, pos))
            pos += 4 * max(n, 0)
            out.append((topic, partitions))
        return out
    except (struct.error, UnicodeDecodeError):
        return []


#: group states in which Kafka's tool resets offsets (no member owns a partition)
INACTIVE_STATES = ("Empty", "Dead")


async def groups_reset_offsets(args: argparse.Namespace) -> None:
    """kafka-consumer-groups --reset-offsets: plan new offsets for the group's partitions (of --topic, or every
    topic it has committed with --all-topics), print them, and commit them only with --execute. Refused while the
    group has active members, as Kafka's tool refuses it."""
    async with await Brokers.open(args) as brokers:
        client, resp = await brokers.at_coordinator(
            args.group, ApiKey.DESCRIBE_GROUPS, 5, {"groups": [args.group]}, lambda r: r["groups"][0]["error_code"]
        )
        group = resp["groups"][0]
        _check(group["error_code"], f"describe {args.group}")
        if group["group_state"] not in INACTIVE_STATES:
            raise CommandError(
                f"assignments can only be reset if the group '{args.group}' is inactive, but the current state is "
                f"{group['group_state']}"
            )
        fetched = await client.call(ApiKey.OFFSET_FETCH, 7, {"group_id": args.group, "topics": None})
        committed = {
            (t["name"], p["partition_index"]): p["committed_offset"]
            for t in fetched.get("topics") or []
            for p in t["partitions"]
            if p["committed_offset"] >= 0
        }
        plan = await _plan_offsets(brokers, args, await _reset_targets(brokers, args, committed), committed)
        if args.execute and plan:
            await _commit(client, args.group, plan)
    _print_plan(args, plan, committed, "NEW-OFFSET", "committed")


def _print_plan(
    args: argparse.Namespace,
    plan: list[tuple[str, int, int]],
    previous: dict[tuple[str, int], int],
    column: str,
    done: str,
) -> None:
    """A reset-offsets plan (topic, partition, new offset) of `args.group`, as JSON or a table (`column` heads the
    new offsets), and on a dry run a word that nothing was `done`."""
    if args.json:
        _print_json(
            {
                "group": args.group,
                "executed": bool(args.execute),
                "partitions": [
                    {"topic": t, "partition": p, "previous_offset": previous.get((t, p)), "new_offset": o}
                    for t, p, o in plan
                ],
            }
        )
        return
    _print_table(["GROUP", "TOPIC", "PARTITION", column], [[args.group, t, p, o] for t, p, o in plan])
    if not args.execute:
        print(f"(dry run: nothing was {done}; add --execute to apply)", file=sys.stderr)


# --- share groups (kafka-share-groups) -----------------------------------------------------------------------


async def share_groups_list(args: argparse.Namespace) -> None:
    async with await Brokers.open(args) as brokers:
        groups = await brokers.list_groups(5, {"states_filter": [], "types_filter": ["share"]})
    if args.json:
        _print_json([{"group": g["group_id"], "state": g["group_state"]} for g in groups])
        return
    for group in groups:
        print(f"{group['group_id']}\t{group['group_state']}")


async def describe_share_group(brokers: Brokers, group_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(ShareGroupDescribe's group, a row per partition the group has a state for: topic, partition, start_offset,
    lag), both from the group's coordinator."""
    body = {"group_ids": [group_id], "include_authorized_operations": False}
    client, resp = await brokers.at_coordinator(
        group_id, ApiKey.SHARE_GROUP_DESCRIBE, 1, body, lambda r: r["groups"][0]["error_code"]
    )
    group = resp["groups"][0]
    _check(group["error_code"], f"describe share group {group_id}")
    body = {"groups": [{"group_id": group_id, "topics": None}]}
    offsets = (await client.call(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 1, body))["groups"][0]
    _check(offsets["error_code"], f"start offsets of {group_id}")
    rows = []
    for topic in offsets["topics"]:
        for p in topic["partitions"]:
            _check(p["error_code"], f"start offset of {group_id} {topic['topic_name']}[{p['partition_index']}]")
            start, lag = p["start_offset"], p["lag"]
            rows.append(
                {
                    "topic": topic["topic_name"],
                    "partition": p["partition_index"],
                    "start_offset": None if start < 0 else start,
                    "lag": None if lag < 0 else lag,
                }
            )
    return group, sorted(rows, key=lambda r: (r["topic"], r["partition"]))


async def share_groups_describe(args: argparse.Namespace) -> None:
    """kafka-share-groups --describe: the group's state and members (with their assignments), and per partition
    its share-partition start offset and lag."""
    async with await Brokers.open(args) as brokers:
        group, rows = await describe_share_group(brokers, args.group)
    members = [
        {
            "member_id": m["member_id"],
            "client_id": m["client_id"],
            "host": m["client_host"],
            "assignment": [
                f"{t['topic_name']}:{','.join(str(p) for p in sorted(t['partitions']))}"
                for t in m["assignment"]["topic_partitions"]
            ],
        }
        for m in group["members"]
    ]
    if args.json:
        _print_json({"group": args.group, "state": group["group_state"], "members": members, "partitions": rows})
        return
    print(f"share group {args.group}  state={group['group_state']}  epoch={group['group_epoch']}")
    for m in members:
        print(f"  member {m['member_id']}  client={m['client_id']}  host={m['host']}  {' '.join(m['assignment'])}")
    _print_table(
        ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"],
        [[args.group, r["topic"], r["partition"], _or(r["start_offset"], "-"), _or(r["lag"], "-")] for r in rows],
    )


async def share_groups_reset_offsets(args: argparse.Namespace) -> None:
    """kafka-share-groups --reset-offsets: plan new start offsets for the group's partitions (of --topic, or every
    one it has a state for with --all-topics), print them, and apply them only with --execute. Refused while the
    group has members, as Kafka refuses it (NON_EMPTY_GROUP)."""
    async with await Brokers.open(args) as brokers:
        group, rows = await describe_share_group(brokers, args.group)
        if group["members"]:
            raise CommandError(
                f"share group '{args.group}' has {len(group['members'])} member(s): stop them before resetting"
            )
        current = {(r["topic"], r["partition"]): r["start_offset"] for r in rows if r["start_offset"] is not None}
        plan = await _plan_offsets(brokers, args, await _reset_targets(brokers, args, current), current)
        if args.execute and plan:
            by_topic: dict[str, list[dict[str, int]]] = {}
            for topic, partition, offset in plan:
                by_topic.setdefault(topic, []).append({"partition_index": partition, "start_offset": offset})
            body = {
                "group_id": args.group,
                "topics": [{"topic_name": t, "partitions": ps} for t, ps in by_topic.items()],
            }
            resp = await (await brokers.coordinator(args.group)).call(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, body)
            _check(resp["error_code"], f"reset share group {args.group}")
            for topic in resp["responses"]:
                for p in topic["partitions"]:
                    _check(p["error_code"], f"reset {args.group} {topic['topic_name']}[{p['partition_index']}]")
    _print_plan(args, plan, current, "NEW-START-OFFSET", "changed")


async def share_groups_delete_offsets(args: argparse.Namespace) -> None:
    """kafka-share-groups --delete-offsets: drop the group's states of these topics (its members start them
    afresh, per share.auto.offset.reset). Refused while the group has members."""
    async with await Brokers.open(args) as brokers:
        client = await brokers.coordinator(args.group)
        body = {"group_id": args.group, "topics": [{"topic_name": t} for t in args.topic]}
        resp = await client.call(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, body)
        _check(resp["error_code"], f"delete offsets of share group {args.group}")
        for topic in resp["responses"]:
            _check(topic["error_code"], f"delete offsets of {args.group} on {topic['topic_name']}")
    print(f"share group {args.group}: offsets of {', '.join(args.topic)} deleted")


async def _plan_offsets(
    brokers: Brokers, args: argparse.Namespace, targets: list[tuple[str, int]], current: dict[tuple[str, int], int]
) -> list[tuple[str, int, int]]:
    """(topic, partition, new offset) of each target as the --to-... / --shift-by option says, clamped to the
    partition's log as Kafka's tools clamp it; `current` is what --shift-by shifts (a partition without one
    shifts from its log start)."""
    from tqdm import tqdm

    plan: list[tuple[str, int, int]] = []
    by_topic: dict[str, list[int]] = {}
    for topic, partition in targets:
        by_topic.setdefault(topic, []).append(partition)
    with tqdm(total=len(targets), desc="planning", unit="partition", file=sys.stderr, disable=None) as bar:
        for topic, partitions in sorted(by_topic.items()):
            starts = await brokers.list_offsets(topic, partitions, -2)
            ends = await brokers.list_offsets(topic, partitions, -1)
            at: dict[int, int] = {}
            if args.to_datetime is not None:
                at = await brokers.list_offsets(topic, partitions, _epoch_ms(args.to_datetime))
            for partition in sorted(partitions):
                start, end = starts[partition], ends[partition]
                if args.to_earliest:
                    new = start
                elif args.to_latest:
                    new = end
                elif args.to_datetime is not None:
                    new = at.get(partition, -1)
                    new = end if new < 0 else new  # no record at or after that time: the end, as Kafka
                elif args.to_offset is not None:
                    new = args.to_offset
                else:
                    new = current.get((topic, partition), start) + args.shift_by
                plan.append((topic, partition, min(max(new, start), end)))
                bar.update(1)
    return plan


async def _reset_targets(
    client: Brokers, args: argparse.Namespace, committed: dict[tuple[str, int], int]
) -> list[tuple[str, int]]:
    """The (topic, partition) pairs --topic / --all-topics name."""
    if args.all_topics:
        return sorted(committed)
    targets = []
    for spec in args.topic or ():
        name, _, parts = spec.partition(":")
        if parts:
            try:
                targets += [(name, int(p)) for p in parts.split(",") if p]
            except ValueError:
                raise CommandError(f"--topic expects TOPIC or TOPIC:P,P,... not {spec!r}") from None
            continue
        meta = await client.call(ApiKey.METADATA, 12, {"topics": [{"name": name}], "allow_auto_topic_creation": False})
        topic = meta["topics"][0]
        _check(topic["error_code"], f"topic {name}")
        targets += [(name, p["partition_index"]) for p in topic["partitions"]]
    if not targets:
        raise CommandError("name the partitions to reset: --topic TOPIC[:P,...] (repeatable) or --all-topics")
    return sorted(set(targets))


async def _commit(client: RawKafkaClient, group: str, plan: list[tuple[str, int, int]]) -> None:
    """Commit the plan as the group's offsets (no generation: the way an admin commits for an inactive group)."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, partition, offset in plan:
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": offset,
                "committed_leader_epoch": -1,
                "committed_metadata": "",
            }
        )
    resp = await client.call(
        ApiKey.OFFSET_COMMIT,
        8,
        {
            "group_id": group,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [{"name": t, "partitions": parts} for t, parts in sorted(by_topic.items())],
        },
    )
    for topic in resp["topics"]:
        for p in topic["partitions"]:
            _check(p["error_code"], f"commit {group} {topic['name']}[{p['partition_index']}]")


def _epoch_ms(text: str) -> int:
    """An ISO 8601 date-time (local time when it names no zone) as epoch milliseconds."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"--to-datetime expects an ISO 8601 date-time, not {text!r}") from None
    return int(moment.timestamp() * 1000)


# --- shared helpers ------------------------------------------------------------------------------------


async def list_offsets(client: RawKafkaClient, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]:
    """ListOffsets of `partitions` at `timestamp` (-1 latest, -2 earliest, else epoch ms): partition -> offset
    (-1 where no record is at or after the timestamp)."""
    if not partitions:
        return {}
    resp = await client.call(
        ApiKey.LIST_OFFSETS,
        7,
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {"name": topic, "partitions": [{"partition_index": p, "timestamp": timestamp} for p in partitions]}
            ],
        },
    )
    out = {}
    for p in resp["topics"][0]["partitions"]:
        _check(p["error_code"], f"offsets of {topic}[{p['partition_index']}]")
        out[p["partition_index"]] = p["offset"]
    return out


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=1), flush=True)


def _print_table(header: list[str], rows: list[list[Any]]) -> None:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def _or(value: Any, missing: str = "?") -> Any:
    return missing if value is None else value


def _human(n: int) -> str:
    """512 B, 1.5 KiB, 3.0 GiB."""
    if n < 1024:
        return f"{n} B"
    value, exp = float(n), 0
    while value >= 1024 and exp < 4:
        value /= 1024
        exp += 1
    return f"{value:.1f} {('B', 'KiB', 'MiB', 'GiB', 'TiB')[exp]}"


# --- partitions: leader elections and reassignments --------------------------------------------------

#: ElectLeaders election types, as kafka-leader-election names them
ELECTION_TYPES = {"preferred": 0, "unclean": 1}
ELECTION_NOT_NEEDED = 84


def _topic_partitions(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """--topic / --partition as ElectLeaders names them (None: every partition of every topic)."""
    if args.topic is None:
        if args.partition:
            raise CommandError("--partition needs --topic")
        return None
    return [{"topic": args.topic, "partitions": args.partition}]


async def partitions_elect_leaders(args: argparse.Namespace) -> None:
    """ElectLeaders: a broker group's mastership moves as a whole, so partitions of one group share one outcome."""
    async with await _kafka(args) as client:
        partitions = _topic_partitions(args)
        if partitions is not None and not args.partition:
            meta = await client.call(ApiKey.METADATA, 12, {"topics": [{"name": args.topic}]})
            topic = meta["topics"][0]
            _check(topic["error_code"], f"elect leaders of {args.topic}")
            partitions[0]["partitions"] = sorted(p["partition_index"] for p in topic["partitions"])
        resp = await client.call(
            ApiKey.ELECT_LEADERS,
            2,
            {"election_type": ELECTION_TYPES[args.type], "topic_partitions": partitions, "timeout_ms": 60_000},
            timeout=90.0,
        )
    _check(resp.get("error_code", 0), "elect leaders")
    rows = [
        {
            "topic": t["topic"],
            "partition": p["partition_id"],
            "error_code": p["error_code"],
            "error": KafkaError.for_code(p["error_code"]).__name__ if p["error_code"] else None,
            "message": p["error_message"],
        }
        for t in resp["replica_election_results"]
        for p in t["partition_result"]
    ]
    if args.json:
        _print_json(rows)
    else:
        if not rows:
            print("no election was needed")
        for row in rows:
            if not row["error_code"]:
                outcome = f"{args.type} leader elected"
            elif row["error_code"] == ELECTION_NOT_NEEDED:
                outcome = "election not needed"
            else:
                outcome = f"{row['error']} ({row['error_code']}): {row['message'] or ''}".rstrip(": ")
            print(f"{row['topic']}[{row['partition']}]\t{outcome}")
    failed = [r for r in rows if r["error_code"] not in (0, ELECTION_NOT_NEEDED)]
    if failed:
        raise CommandError(f"{len(failed)} partition(s) could not be elected")


async def partitions_reassignments(args: argparse.Namespace) -> None:
    """ListPartitionReassignments: the reassignments in progress, each with its progress: the offsets its adding
    replicas still lack (DescribeLogDirs' offset lag, asked of each of them, as Kafka's tools show it)."""
    async with await Brokers.open(args) as brokers:
        resp = await brokers.call(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, {"timeout_ms": 30_000, "topics": None})
        _check(resp["error_code"], "list partition reassignments", resp.get("error_message"))
        rows = [
            {
                "topic": t["name"],
                "partition": p["partition_index"],
                "replicas": p["replicas"],
                "adding": p["adding_replicas"],
                "removing": p["removing_replicas"],
                "lag": await _adding_lag(brokers, t["name"], p["partition_index"], p["adding_replicas"]),
            }
            for t in resp["topics"]
            for p in t["partitions"]
        ]
    if args.json:
        _print_json(rows)
        return
    if not rows:
        print("no partition reassignment in progress")
    for r in rows:
        lag = "?" if r["lag"] is None else r["lag"]
        print(
            f"{r['topic']}[{r['partition']}]\treplicas={r['replicas']}\tadding={r['adding']}\t"
            f"removing={r['removing']}\tlag={lag}"
        )


async def _adding_lag(brokers: Brokers, topic: str, partition: int, adding: list[int]) -> int | None:
    """The largest offset lag the adding replicas report for the partition (None: none of them could say)."""
    lags = []
    for node in adding:
        try:
            client = await brokers.to(node)
        except CommandError:
            continue
        resp = await client.call(ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": [{"topic": topic, "partitions": [partition]}]})
        lags += [p["offset_lag"] for d in resp["results"] for t in d["topics"] for p in t["partitions"]]
    return max(lags) if lags else None


async def partitions_reassign(args: argparse.Namespace) -> None:
    """AlterPartitionReassignments for one partition (`--cancel`: stop the one in progress)."""
    replicas = None if args.cancel else [int(n) for n in args.replicas.split(",") if n.strip()]
    body = {
        "timeout_ms": 30_000,
        "topics": [{"name": args.topic, "partitions": [{"partition_index": args.partition, "replicas": replicas}]}],
    }
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, body)
    _check(resp["error_code"], "reassign partitions", resp.get("error_message"))
    part = resp["responses"][0]["partitions"][0]
    _check(part["error_code"], f"reassign {args.topic}[{args.partition}]", part.get("error_message"))
    print(f"{args.topic}[{args.partition}]: {'cancelled' if args.cancel else f'replicas {replicas}'}")


# --- producers ------------------------------------------------------------------------------------------


async def producers_describe(args: argparse.Namespace) -> None:
    """DescribeProducers, asked of each partition's leader (only a leader keeps its partitions' producer state)."""
    rows: list[dict[str, Any]] = []
    async with await Brokers.open(args) as brokers:
        wanted = args.partition or sorted(await brokers.leaders(args.topic))
        for client, indexes in await brokers.by_leader(args.topic, wanted):
            resp = await client.call(
                ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [{"name": args.topic, "partition_indexes": indexes}]}
            )
            for p in resp["topics"][0]["partitions"]:
                what = f"describe producers of {args.topic}[{p['partition_index']}]"
                _check(p["error_code"], what, p["error_message"])
                rows.extend({"partition": p["partition_index"], **producer} for producer in p["active_producers"])
    rows.sort(key=lambda r: (r["partition"], r["producer_id"]))
    if args.json:
        _print_json(rows)
        return
    if not rows:
        print(f"no active producer on {args.topic}")
        return
    _print_table(
        ["PARTITION", "PRODUCER-ID", "EPOCH", "LAST-SEQUENCE", "LAST-TIMESTAMP", "COORDINATOR-EPOCH", "TXN-START"],
        [
            [
                r["partition"],
                r["producer_id"],
                r["producer_epoch"],
                r["last_sequence"],
                r["last_timestamp"],
                r["coordinator_epoch"],
                r["current_txn_start_offset"],
            ]
            for r in rows
        ],
    )


# --- transactions ---------------------------------------------------------------------------------------


async def transactions_list(args: argparse.Namespace) -> None:
    """ListTransactions (every transactional id the coordinators know, or those in `--state`): asked of every
    broker, as Kafka's admin client does, since each coordinates its own share of the ids."""
    rows = []
    async with await Brokers.open(args) as brokers:
        for client in await brokers.each():
            resp = await client.call(
                ApiKey.LIST_TRANSACTIONS,
                1,
                {"state_filters": args.state or [], "producer_id_filters": [], "duration_filter": -1},
            )
            _check(resp["error_code"], "list transactions")
            if resp["unknown_state_filters"]:
                raise CommandError(f"unknown transaction states: {', '.join(resp['unknown_state_filters'])}")
            rows += resp["transaction_states"]
    rows.sort(key=lambda r: r["transactional_id"])
    if args.json:
        _print_json(rows)
        return
    _print_table(
        ["TRANSACTIONAL-ID", "PRODUCER-ID", "STATE"],
        [[r["transactional_id"], r["producer_id"], r["transaction_state"]] for r in rows],
    )


def _utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")


async def _describe_transaction(brokers: Brokers, transactional_id: str) -> dict[str, Any]:
    client = await brokers.coordinator(transactional_id, key_type=1)
    resp = await client.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [transactional_id]})
    state: dict[str, Any] = resp["transaction_states"][0]
    _check(state["error_code"], f"describe transaction {transactional_id!r}")
    return state


async def transactions_describe(args: argparse.Namespace) -> None:
    """DescribeTransactions: state, producer id and epoch, timeout, start time and partitions of one id."""
    async with await Brokers.open(args) as brokers:
        state = await _describe_transaction(brokers, args.transactional_id)
    if args.json:
        _print_json(state)
        return
    started = state["transaction_start_time_ms"]
    _print_table(
        ["TRANSACTIONAL-ID", "PRODUCER-ID", "EPOCH", "STATE", "TIMEOUT-MS", "STARTED", "PARTITIONS"],
        [
            [
                state["transactional_id"],
                state["producer_id"],
                state["producer_epoch"],
                state["transaction_state"],
                state["transaction_timeout_ms"],
                _utc(started) if started >= 0 else "-",
                ",".join(f"{t['topic']}-{p}" for t in state["topics"] for p in t["partitions"]) or "-",
            ]
        ],
    )


async def transactions_abort(args: argparse.Namespace) -> None:
    """Abort the transaction under way of a transactional id and fence its producer, as Kafka's
    `kafka-transactions.sh force-terminate` does: an InitProducerId for the id, which bumps its epoch (its producer's
    next request is refused as fenced) and aborts what it left open."""
    async with await Brokers.open(args) as brokers:
        state = await _describe_transaction(brokers, args.transactional_id)
        client = await brokers.coordinator(args.transactional_id, key_type=1)
        resp = await client.call(
            ApiKey.INIT_PRODUCER_ID,
            4,
            {
                "transactional_id": args.transactional_id,
                "transaction_timeout_ms": state["transaction_timeout_ms"],
                "producer_id": -1,
                "producer_epoch": -1,
            },
        )
    _check(resp["error_code"], f"abort transaction {args.transactional_id!r}")
    was = state["transaction_state"]
    done = "aborted the transaction under way" if was == "Ongoing" else f"nothing under way ({was})"
    fenced = f"producer {resp['producer_id']} fenced (epoch now {resp['producer_epoch']})"
    print(f"{args.transactional_id}: {done}; {fenced}")


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


# --- RocketMQ access keys (plain secrets: in the broker's data directory, or a cluster's in etcd) ----------


class _FileAccessKeys:
    """The access keys of one broker's data directory (`--data-dir`)."""

    def __init__(self, data_dir: str) -> None:
        # (imported here: the other admin commands never load the broker's security modules)
        from mqk.broker.security import access_keys

        self._module = access_keys
        self.where = access_keys.access_keys_path(Path(data_dir))

    async def read(self) -> dict[str, str]:
        try:
            return dict(self._module.read_access_keys(self.where))
        except MqkError as exc:  # Corrupt: a file mqk did not write
            raise CommandError(str(exc)) from None

    async def put(self, name: str, secret: str) -> None:
        keys = await self.read()
        keys[name] = secret
        self._module.write_access_keys(self.where, keys)

    async def delete(self, name: str) -> bool:
        keys = await self.read()
        if keys.pop(name, None) is None:
            return False
        self._module.write_access_keys(self.where, keys)
        return True

    async def close(self) -> None:
        pass


class _ClusterAccessKeys:
    """A cluster's access keys, one etcd key each (`--cluster`, `--cluster-id`): every broker follows them."""

    def __init__(self, url: str, cluster_id: str) -> None:
        from mqk.broker.cluster.model import Keys
        from mqk.broker.security import access_keys
        from mqk.meta.etcd import EtcdClient, parse_endpoints

        self._module = access_keys
        try:
            self._prefix = Keys(cluster_id).rocketmq_keys
            self._etcd = EtcdClient(parse_endpoints(url))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.where = f"cluster {cluster_id}"

    async def _call(self, op: Any) -> Any:
        try:
            return await op()
        except MqkError as exc:  # MetaUnavailable: no etcd endpoint answers
            raise CommandError(f"cannot reach etcd: {exc}") from None

    async def read(self) -> dict[str, str]:
        records, _revision = await self._call(lambda: self._etcd.get_prefix(self._prefix))
        values = {r.key[len(self._prefix) :]: r.value for r in records}
        return dict(self._module.decode_cluster_keys(values))

    async def put(self, name: str, secret: str) -> None:
        key = self._prefix + self._module.cluster_key_tail(name)
        await self._call(lambda: self._etcd.put(key, self._module.encode_cluster_value(secret)))

    async def delete(self, name: str) -> bool:
        if name not in await self.read():
            return False
        await self._call(lambda: self._etcd.delete(self._prefix + self._module.cluster_key_tail(name)))
        return True

    async def close(self) -> None:
        await self._etcd.close()


def _access_keys(args: argparse.Namespace) -> _FileAccessKeys | _ClusterAccessKeys:
    if args.cluster:
        return _ClusterAccessKeys(args.cluster, args.cluster_id)
    return _FileAccessKeys(args.data_dir)


async def rocketmq_keys_list(args: argparse.Namespace) -> None:
    store = _access_keys(args)
    try:
        for name in sorted(await store.read()):
            print(name)
    finally:
        await store.close()


async def rocketmq_keys_add(args: argparse.Namespace) -> None:
    args.password = args.secret
    args.password_stdin = args.secret_stdin
    secret = _new_password(args)
    if not secret:
        raise CommandError("the secret key must not be empty")
    store = _access_keys(args)
    try:
        await store.put(args.user, secret)
    finally:
        await store.close()
    print(f"rocketmq access key {args.user} set in {store.where} (running brokers pick it up)")


async def rocketmq_keys_delete(args: argparse.Namespace) -> None:
    store = _access_keys(args)
    try:
        if not await store.delete(args.user):
            raise CommandError(f"no rocketmq access key {args.user} in {store.where}")
    finally:
        await store.close()
    print(f"rocketmq access key {args.user} deleted")


# --- ACLs ---------------------------------------------------------------------------------------------


QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate")


def _quota_entity(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The entity the options name (Kafka's kafka-configs --entity-type users / clients, or their defaults)."""
    entity = []
    if args.user is not None or args.user_default:
        entity.append({"entity_type": "user", "entity_name": None if args.user_default else args.user})
    if args.client_id is not None or args.client_id_default:
        entity.append({"entity_type": "client-id", "entity_name": None if args.client_id_default else args.client_id})
    if not entity:
        raise CommandError(
            "name a user (--user, --user-default), a client id (--client-id, --client-id-default) or both"
        )
    return entity


def _entity_text(entity: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{e['entity_type']}={e['entity_name'] if e['entity_name'] is not None else '<default>'}" for e in entity
    )


async def quotas_list(args: argparse.Namespace) -> None:
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1, {"components": [], "strict": False})
    _check(resp["error_code"], "list client quotas", resp.get("error_message"))
    entries = [
        {"entity": e["entity"], "values": {v["key"]: v["value"] for v in e["values"]}} for e in resp["entries"] or []
    ]
    if args.json:
        _print_json(entries)
        return
    for e in sorted(entries, key=lambda e: _entity_text(e["entity"])):
        values = ", ".join(f"{k}={v:.15g}" for k, v in sorted(e["values"].items()))
        print(f"{_entity_text(e['entity'])}\t{values}")


async def _alter_quotas(args: argparse.Namespace, ops: list[dict[str, Any]], done: str) -> None:
    entity = _quota_entity(args)
    async with await _kafka(args) as client:
        resp = await client.call(
            ApiKey.ALTER_CLIENT_QUOTAS, 1, {"validate_only": False, "entries": [{"entity": entity, "ops": ops}]}
        )
    result = resp["entries"][0]
    _check(result["error_code"], f"change the quotas of {_entity_text(entity)}", result.get("error_message"))
    print(f"{_entity_text(entity)}: {done}")


async def quotas_set(args: argparse.Namespace) -> None:
    ops = [
        {"key": key, "value": float(value), "remove": False}
        for key, value in (
            ("producer_byte_rate", args.producer_byte_rate),
            ("consumer_byte_rate", args.consumer_byte_rate),
        )
        if value is not None
    ]
    if not ops:
        raise CommandError("give --producer-byte-rate, --consumer-byte-rate or both")
    await _alter_quotas(args, ops, ", ".join(f"{op['key']}={op['value']:.15g}" for op in ops))


async def quotas_remove(args: argparse.Namespace) -> None:
    keys = args.key or list(QUOTA_KEYS)
    await _alter_quotas(args, [{"key": k, "value": 0.0, "remove": True} for k in keys], f"{', '.join(keys)} removed")


def _acl_codes() -> Any:
    # (imported here: the other admin commands never load the broker's security modules)
    from mqk.broker.security import acls

    return acls


def _acl_resources(args: argparse.Namespace, for_filter: bool) -> list[tuple[str, str | None]]:
    """(resource type, name) of each resource the options name; a filter without one matches every resource."""
    resources: list[tuple[str, str | None]] = [("TOPIC", t) for t in args.topic or ()]
    resources += [("GROUP", g) for g in args.group or ()]
    resources += [("TRANSACTIONAL_ID", t) for t in args.transactional_id or ()]
    resources += [("DELEGATION_TOKEN", t) for t in args.delegation_token or ()]
    if args.cluster:
        resources.append(("CLUSTER", "kafka-cluster"))
    if not resources:
        if not for_filter:
            raise CommandError("name a resource: --topic, --group, --cluster, --transactional-id or --delegation-token")
        resources.append(("ANY", None))
    return resources


def _acl_entries(args: argparse.Namespace, for_filter: bool) -> list[tuple[str | None, str | None, str, str]]:
    """(principal, host, operation, permission) of each entry the options describe (a filter: None is any)."""
    operations = [o.upper() for o in args.operation or ()] or (["ANY"] if for_filter else [])
    if not operations:
        raise CommandError("name at least one --operation (READ, WRITE, DESCRIBE, ..., ALL)")
    default_host = None if for_filter else "*"
    entries: list[tuple[str | None, str | None, str, str]] = []
    for permission, principals, hosts in (
        ("ALLOW", args.allow_principal, args.allow_host),
        ("DENY", args.deny_principal, args.deny_host),
    ):
        for principal in principals or ():
            for host in hosts or [default_host]:
                entries += [(principal, host, op, permission) for op in operations]
    if not entries:
        if not for_filter:
            raise CommandError("name a principal: --allow-principal or --deny-principal User:NAME")
        entries = [(None, None, op, "ANY") for op in operations]
    return entries


async def acls_list(args: argparse.Namespace) -> None:
    acls = _acl_codes()
    pattern = args.resource_pattern_type.upper()
    found: list[dict[str, Any]] = []
    async with await _kafka(args) as client:
        for resource_type, name in _acl_resources(args, for_filter=True):
            principals: list[str | None] = list(args.principal or [None])
            for principal in principals:
                resp = await client.call(
                    ApiKey.DESCRIBE_ACLS,
                    3,
                    {
                        "resource_type_filter": acls.RESOURCE_CODES[resource_type],
                        "resource_name_filter": name,
                        "pattern_type_filter": acls.PATTERN_CODES[pattern],
                        "principal_filter": principal,
                        "host_filter": None,
                        "operation": acls.OPERATION_CODES["ANY"],
                        "permission_type": acls.PERMISSION_CODES["ANY"],
                    },
                )
                _check(resp["error_code"], "list ACLs", resp.get("error_message"))
                for r in resp["resources"]:
                    for a in r["acls"]:
                        found.append(
                            {
                                "resource_type": acls.RESOURCE_TYPES[r["resource_type"]],
                                "resource_name": r["resource_name"],
                                "pattern_type": acls.PATTERN_TYPES[r["pattern_type"]],
                                "principal": a["principal"],
                                "host": a["host"],
                                "operation": acls.OPERATIONS[a["operation"]],
                                "permission": acls.PERMISSIONS[a["permission_type"]],
                            }
                        )
    unique = list({json.dumps(b, sort_keys=True): b for b in found}.values())
    if args.json:
        _print_json(unique)
        return
    for b in unique:
        print(
            f"{b['resource_type']}:{b['pattern_type']}:{b['resource_name']}\t{b['principal']}\thost={b['host']}"
            f"\t{b['operation']}\t{b['permission']}"
        )


async def acls_add(args: argparse.Namespace) -> None:
    acls = _acl_codes()
    pattern = args.resource_pattern_type.upper()
    if pattern not in ("LITERAL", "PREFIXED"):
        raise CommandError("--resource-pattern-type of a new ACL is LITERAL or PREFIXED")
    creations = [
        {
            "resource_type": acls.RESOURCE_CODES[resource_type],
            "resource_name": name,
            "resource_pattern_type": acls.PATTERN_CODES[pattern],
            "principal": principal,
            "host": host,
            "operation": acls.OPERATION_CODES.get(operation, 0),
            "permission_type": acls.PERMISSION_CODES[permission],
        }
        for resource_type, name in _acl_resources(args, for_filter=False)
        for principal, host, operation, permission in _acl_entries(args, for_filter=False)
    ]
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.CREATE_ACLS, 3, {"creations": creations})
    for creation, result in zip(creations, resp["results"], strict=True):
        what = f"add ACL {creation['principal']} {acls.OPERATIONS.get(creation['operation'], '?')}"
        _check(result["error_code"], what, result.get("error_message"))
    print(f"{len(creations)} ACL(s) added")


async def acls_remove(args: argparse.Namespace) -> None:
    acls = _acl_codes()
    pattern = args.resource_pattern_type.upper()
    filters = [
        {
            "resource_type_filter": acls.RESOURCE_CODES[resource_type],
            "resource_name_filter": name,
            "pattern_type_filter": acls.PATTERN_CODES[pattern],
            "principal_filter": principal,
            "host_filter": host,
            "operation": acls.OPERATION_CODES.get(operation, 0),
            "permission_type": acls.PERMISSION_CODES[permission],
        }
        for resource_type, name in _acl_resources(args, for_filter=True)
        for principal, host, operation, permission in _acl_entries(args, for_filter=True)
    ]
    async with await _kafka(args) as client:
        resp = await client.call(ApiKey.DELETE_ACLS, 3, {"filters": filters})
    removed: set[str] = set()
    for result in resp["filter_results"]:
        _check(result["error_code"], "remove ACLs", result.get("error_message"))
        removed.update(json.dumps(m, sort_keys=True) for m in result["matching_acls"])
    print(f"{len(removed)} ACL(s) removed")


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
    async with await Brokers.open(args) as brokers:
        await brokers.call(ApiKey.METADATA, 12, {"topics": [{"name": args.topic}], "allow_auto_topic_creation": True})
        resp = await (await brokers.leader(args.topic, args.partition)).call(
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


#: where the native commands read the secret of `--access-key` from (kept out of the process list)
SECRET_KEY_ENV = "MQK_ROCKETMQ_SECRET_KEY"


def _rocketmq_credentials(args: argparse.Namespace) -> tuple[str, str] | None:
    """(access key, secret key) when `--access-key` is given: the secret from $MQK_ROCKETMQ_SECRET_KEY, else asked
    at the terminal."""
    if not getattr(args, "access_key", None):
        return None
    secret = os.environ.get(SECRET_KEY_ENV)
    if secret is None:
        if not sys.stdin.isatty():
            raise CommandError(f"--access-key: give its secret in ${SECRET_KEY_ENV} or at the prompt of a terminal")
        secret = getpass.getpass(f"secret key of {args.access_key}: ")
    return (str(args.access_key), secret)


async def produce_native(args: argparse.Namespace) -> None:
    values = _input_values(args)
    properties = _parse_configs(args.header)
    credentials = _rocketmq_credentials(args)
    async with Producer(args.namesrv, "mqk-cli-producer") as producer:
        producer.credentials = credentials
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
            assert result is not None  # (a send that is not one-way always answers)
            print(
                f"{len(values)} message(s) sent to {args.topic}, last to queue {result.queue.queue_id} "
                f"at offset {result.queue_offset}",
                file=sys.stderr,
            )


async def consume_native(args: argparse.Namespace) -> None:
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
        credentials=_rocketmq_credentials(args),
    )


def _by_protocol(kafka: Any, native: Any) -> Any:
    async def run(args: argparse.Namespace) -> None:
        if args.protocol != "native":
            await kafka(args)
            return
        try:
            await native(args)
        except ClientError as exc:  # the broker's answer (e.g. NO_PERMISSION), said as a command error
            raise CommandError(str(exc)) from None

    return run


async def consume_kafka(args: argparse.Namespace) -> None:
    from tqdm import tqdm  # (imported here: only consuming to a file draws progress; serve never loads it)

    recbatch = load("recbatch")
    printed = 0
    deadline = time.monotonic() + args.timeout
    # a progress bar on the terminal while the records go to a file or a pipe (never between printed records)
    bar = tqdm(
        total=args.max_messages if args.max_messages < 1 << 62 else None,
        unit="rec",
        file=sys.stderr,
        disable=None if not sys.stdout.isatty() else True,
    )
    async with await Brokers.open(args) as brokers:
        client = await brokers.leader(args.topic, args.partition)
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
                    bar.update(1)
                    _print_record(args, rec_offset, rec[3], rec[4], rec[5])
                offset = max(offset, base + info[2] + 1)
    bar.close()


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

    if args.max < 1:
        raise CommandError(f"--max must be at least 1, not {args.max}")
    end_ms = args.end_ms if args.end_ms is not None else int(time.time() * 1000) + 60_000
    try:
        client = ClientBase(args.namesrv, "mqk-cli-query")
    except ValueError as exc:
        raise CommandError(f"--namesrv: {exc}") from None
    client.credentials = _rocketmq_credentials(args)
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


def with_json(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def _group_parsers(
    parser: argparse.ArgumentParser,
    runs: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]],
    *,
    describe_help: str,
    reset_help: str,
    reset_description: str,
    all_partitions: str,
    shift: str,
) -> argparse._SubParsersAction:
    """`list`, `describe GROUP` and `reset-offsets GROUP` under `parser` (consumer groups and share groups alike:
    `runs` are their three commands); the subparsers, for a kind's further verbs."""
    list_run, describe_run, reset_run = runs
    verbs = parser.add_subparsers(dest="action", required=True)
    with_json(with_kafka_connection(verbs.add_parser("list"))).set_defaults(run=list_run)
    p = with_json(with_kafka_connection(verbs.add_parser("describe", help=describe_help)))
    p.add_argument("group")
    p.set_defaults(run=describe_run)
    p = with_json(
        with_kafka_connection(verbs.add_parser("reset-offsets", help=reset_help, description=reset_description))
    )
    p.add_argument("group")
    _reset_options(p, all_partitions, shift)
    p.set_defaults(run=reset_run)
    return verbs


def _reset_options(p: argparse.ArgumentParser, all_topics: str, shift_by: str) -> None:
    """The options of a reset-offsets command (kafka-consumer-groups' and kafka-share-groups'): which partitions,
    where to, and --execute."""
    p.add_argument("--topic", action="append", metavar="TOPIC[:P,P...]", help="partitions to reset (repeatable)")
    p.add_argument("--all-topics", action="store_true", help=all_topics)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--to-earliest", action="store_true", help="each partition's log start offset")
    how.add_argument("--to-latest", action="store_true", help="each partition's log end offset")
    how.add_argument("--to-datetime", metavar="ISO-8601", help="the first offset at or after this time")
    how.add_argument("--to-offset", type=int, metavar="N", help="this offset (clamped to each log)")
    how.add_argument("--shift-by", type=int, metavar="N", help=shift_by)
    p.add_argument("--execute", action="store_true", help="apply the new offsets (default: only show them)")


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
        p.add_argument(
            "--access-key",
            help=f"native: sign requests with this RocketMQ access key (its secret from ${SECRET_KEY_ENV} or a prompt)",
        )

    with_bootstrap = with_kafka_connection

    topics = sub.add_parser("topics", help="list, create, describe, delete topics")
    tsub = topics.add_subparsers(dest="action", required=True)
    with_json(with_bootstrap(tsub.add_parser("list"))).set_defaults(run=topics_list)
    p = with_bootstrap(tsub.add_parser("create"))
    p.add_argument("topic")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--config", action="append", metavar="KEY=VALUE")
    p.set_defaults(run=topics_create)
    p = with_json(with_bootstrap(tsub.add_parser("describe", help="partitions with offsets and sizes, settings")))
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

    groups = sub.add_parser("groups", help="list, describe consumer groups (with lag), reset their offsets")
    _group_parsers(
        groups,
        (groups_list, groups_describe, groups_reset_offsets),
        describe_help="members, and per partition offsets and lag",
        reset_help="move a group's committed offsets (dry run unless --execute)",
        reset_description="Plan new committed offsets for an inactive group and print them; --execute commits "
        "them. Refused while the group has active members, as kafka-consumer-groups refuses it.",
        all_partitions="every partition the group has committed",
        shift="the committed offset plus N (N may be negative)",
    )
    shares = sub.add_parser("share-groups", help="list, describe share groups (KIP-932), reset or delete offsets")
    ssub = _group_parsers(
        shares,
        (share_groups_list, share_groups_describe, share_groups_reset_offsets),
        describe_help="members, and per partition start offset and lag",
        reset_help="move a share group's start offsets (dry run unless --execute)",
        reset_description="Plan new share-partition start offsets for a share group without members and print "
        "them; --execute applies them.",
        all_partitions="every partition the group has a state for",
        shift="the start offset plus N (N may be negative)",
    )
    p = with_bootstrap(ssub.add_parser("delete-offsets", help="drop a share group's states of topics"))
    p.add_argument("group")
    p.add_argument("--topic", action="append", required=True, help="a topic whose states go (repeatable)")
    p.set_defaults(run=share_groups_delete_offsets)

    partitions = sub.add_parser("partitions", help="leader elections and reassignments of partitions")
    psub = partitions.add_subparsers(dest="action", required=True)
    p = with_json(
        with_bootstrap(
            psub.add_parser(
                "elect-leaders",
                help="hand leadership back to the preferred replica, or elect an out-of-sync one (unclean)",
                description="A partition's leader is its broker group's master: an election moves the mastership "
                "of the whole group, for every partition placed in it. preferred: the group's first member (lowest "
                "node id) once it is in sync; unclean: a group without a master gets a live member, in sync or not.",
            )
        )
    )
    p.add_argument("--type", choices=tuple(ELECTION_TYPES), default="preferred")
    p.add_argument("--topic", help="the topic (default: every topic)")
    p.add_argument("--partition", type=int, action="append", help="a partition (repeatable; default: all)")
    p.set_defaults(run=partitions_elect_leaders)
    p = with_json(with_bootstrap(psub.add_parser("reassignments", help="the partition reassignments in progress")))
    p.set_defaults(run=partitions_reassignments)
    p = with_bootstrap(
        psub.add_parser("reassign", help="move a partition to other replicas (AlterPartitionReassignments)")
    )
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int, required=True)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--replicas", metavar="N,N,...", help="the target replica node ids")
    target.add_argument("--cancel", action="store_true", help="cancel the reassignment in progress")
    p.set_defaults(run=partitions_reassign)

    producers = sub.add_parser("producers", help="the active idempotent producers of a topic's partitions")
    prsub = producers.add_subparsers(dest="action", required=True)
    p = with_json(with_bootstrap(prsub.add_parser("describe", help="producer id, epoch, last sequence per partition")))
    p.add_argument("--topic", required=True)
    p.add_argument("--partition", type=int, action="append", help="a partition (repeatable; default: all)")
    p.set_defaults(run=producers_describe)

    transactions = sub.add_parser("transactions", help="list, describe, abort Kafka transactions")
    txsub = transactions.add_subparsers(dest="action", required=True)
    p = with_json(with_bootstrap(txsub.add_parser("list", help="the transactional ids, their producer and state")))
    p.add_argument("--state", action="append", help="only ids in this state, e.g. Ongoing (repeatable)")
    p.set_defaults(run=transactions_list)
    p = with_json(with_bootstrap(txsub.add_parser("describe", help="one transactional id's transaction")))
    p.add_argument("--transactional-id", required=True)
    p.set_defaults(run=transactions_describe)
    p = with_bootstrap(
        txsub.add_parser("abort", help="abort a transactional id's open transaction and fence its producer")
    )
    p.add_argument("--transactional-id", required=True)
    p.set_defaults(run=transactions_abort)

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

    # RocketMQ access keys: the broker needs their plain secrets (signatures are HMACs), so they are not SCRAM
    # credentials and live in their own file under the broker's data directory, edited here directly; a cluster's
    # live in its etcd
    def access_key_store(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        where = p.add_mutually_exclusive_group()
        where.add_argument("--data-dir", default="mqk-data", help="the broker's data directory (default ./mqk-data)")
        where.add_argument(
            "--cluster", metavar="etcd://HOST:PORT[,HOST:PORT...]", help="the cluster's keys, in its etcd"
        )
        p.add_argument("--cluster-id", default="mqk-cluster", help="with --cluster: the cluster (default mqk-cluster)")
        return p

    p = access_key_store(usub.add_parser("list-rocketmq", help="list the RocketMQ access keys"))
    p.set_defaults(run=rocketmq_keys_list)
    p = access_key_store(usub.add_parser("add-rocketmq", help="add a RocketMQ access key (user NAME, User:NAME)"))
    p.add_argument("user")
    secret = p.add_mutually_exclusive_group()
    secret.add_argument("--secret", help="(visible in the process list: prefer --secret-stdin)")
    secret.add_argument("--secret-stdin", action="store_true", help="read the secret key from stdin's first line")
    p.set_defaults(run=rocketmq_keys_add)
    p = access_key_store(usub.add_parser("delete-rocketmq", help="delete a RocketMQ access key"))
    p.add_argument("user")
    p.set_defaults(run=rocketmq_keys_delete)

    quotas = sub.add_parser("quotas", help="list, set, remove client quotas (byte rates per user and client id)")
    qsub = quotas.add_subparsers(dest="action", required=True)

    def with_quota_entity(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        user = p.add_mutually_exclusive_group()
        user.add_argument("--user", help="the user the quota is for")
        user.add_argument("--user-default", action="store_true", help="every user without a quota of its own")
        client = p.add_mutually_exclusive_group()
        client.add_argument("--client-id", help="the client id the quota is for (with --user: that user's client)")
        client.add_argument("--client-id-default", action="store_true", help="every client id without its own")
        return p

    with_json(with_bootstrap(qsub.add_parser("list"))).set_defaults(run=quotas_list)
    p = with_bootstrap(with_quota_entity(qsub.add_parser("set", help="set byte-rate quotas of a user / client id")))
    p.add_argument("--producer-byte-rate", type=float, help="bytes per second a producer may send")
    p.add_argument("--consumer-byte-rate", type=float, help="bytes per second a consumer may fetch")
    p.set_defaults(run=quotas_set)
    p = with_bootstrap(with_quota_entity(qsub.add_parser("remove", help="remove quotas of a user / client id")))
    p.add_argument("--key", action="append", choices=QUOTA_KEYS, help="the quota to remove (default: both)")
    p.set_defaults(run=quotas_remove)

    acls = sub.add_parser("acls", help="list, add, remove ACLs (Kafka's kafka-acls options)")
    asub = acls.add_subparsers(dest="action", required=True)

    def with_acl_resource(p: argparse.ArgumentParser, pattern_default: str) -> argparse.ArgumentParser:
        p.add_argument("--topic", action="append", metavar="NAME", help="a topic resource (repeatable; `*`: all)")
        p.add_argument("--group", action="append", metavar="NAME", help="a consumer group resource (repeatable)")
        p.add_argument("--transactional-id", action="append", metavar="ID")
        p.add_argument("--delegation-token", action="append", metavar="ID")
        p.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
        p.add_argument(
            "--resource-pattern-type",
            default=pattern_default,
            type=str.upper,
            choices=("LITERAL", "PREFIXED", "ANY", "MATCH"),
            help=f"how the resource names match (default {pattern_default})",
        )
        return p

    def with_acl_entry(p: argparse.ArgumentParser, host_help: str) -> argparse.ArgumentParser:
        p.add_argument("--allow-principal", action="append", metavar="User:NAME", help="User:* for every user")
        p.add_argument("--deny-principal", action="append", metavar="User:NAME")
        p.add_argument("--allow-host", action="append", metavar="HOST", help=host_help)
        p.add_argument("--deny-host", action="append", metavar="HOST", help=host_help)
        p.add_argument(
            "--operation",
            action="append",
            type=str.upper,
            help="READ, WRITE, CREATE, DELETE, ALTER, "
            "DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALL (repeatable)",
        )
        return p

    p = with_json(with_bootstrap(with_acl_resource(asub.add_parser("list"), "ANY")))
    p.add_argument("--principal", action="append", metavar="User:NAME", help="only this principal's ACLs")
    p.set_defaults(run=acls_list)
    p = with_bootstrap(with_acl_entry(with_acl_resource(asub.add_parser("add"), "LITERAL"), "(default: *)"))
    p.set_defaults(run=acls_add)
    p = with_bootstrap(
        with_acl_entry(
            with_acl_resource(asub.add_parser("remove", help="remove every ACL matching the options"), "LITERAL"),
            "(default: any)",
        )
    )
    p.set_defaults(run=acls_remove)

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

    for p in (topics, groups, shares, partitions, producers, transactions, users, quotas, acls):
        p.set_defaults(func=run_command)
    p = sub.add_parser("query", help="print the messages whose key (RocketMQ KEYS, or an indexed Kafka key) matches")
    p.add_argument("--topic", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--namesrv", default=DEFAULT_NAMESRV, metavar="HOST:PORT", help="name server (RocketMQ route)")
    p.add_argument(
        "--access-key",
        help=f"sign requests with this RocketMQ access key (its secret from ${SECRET_KEY_ENV} or a prompt)",
    )
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
    except (TimeoutError, ConnectionError, OSError) as exc:
        print(f"mqk: cannot reach the broker: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    return 0
