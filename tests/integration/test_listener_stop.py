"""A stopped broker leaves no client socket open, on the Kafka listener and the RocketMQ one alike, even one whose
client stopped reading with answers still queued (asyncio's Server.close() leaves accepted connections alone, and
a transport closed with unsent bytes keeps its socket until they drain). The broker runs embedded (mqk.testing), as
in a user's test suite: after `stop()` its loop no longer runs, so a socket left open would stay open for good.
The clients are raw sockets that send and never read; the test looks at the broker's side of their connections."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from helpers import wait_until

from mqk.broker.accepted import AcceptedTransports
from mqk.protocol.native.codes import RequestCode
from mqk.protocol.native.command import RemotingCommand
from mqk.testing import ThreadedBroker, broker_config

#: how many requests a client sends at most before its socket would block (its answers fill both socket buffers first)
MAX_REQUESTS = 200_000


def _kafka_api_versions(correlation_id: int) -> bytes:
    body = struct.pack(">hhih", 18, 0, correlation_id, 4) + b"mute"  # ApiVersions v0, client id "mute"
    return struct.pack(">i", len(body)) + body


def _rocketmq_topic_route(correlation_id: int) -> bytes:
    topic = {"topic": "no-such-topic"}
    return RemotingCommand(code=RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=correlation_id, ext_fields=topic).encode()


def _mute_client(address: tuple[str, int], request: Callable[[int], bytes]) -> socket.socket:
    """A client that sends requests until its socket would block and reads none of the answers."""
    sock = socket.create_connection(address, timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    batch = b"".join(request(i) for i in range(100))
    for _ in range(MAX_REQUESTS // 100):
        try:
            sock.send(batch)
        except BlockingIOError:
            break
    return sock


def _queued_bytes(broker: ThreadedBroker, connections: Callable[[], Iterable[Any]]) -> int:
    """The answers the broker holds unsent, over all of a listener's connections."""

    async def total() -> int:
        return sum(transport.get_write_buffer_size() for transport in map(_transport_of, connections()))

    result: int = broker.call(total())
    return result


def _sockets(broker: ThreadedBroker, connections: Callable[[], Iterable[Any]]) -> list[Any]:
    """The broker's side of each of a listener's connections (asyncio's socket view: fileno() is -1 once closed)."""

    async def sockets() -> list[Any]:
        return [transport.get_extra_info("socket") for transport in map(_transport_of, connections())]

    result: list[Any] = broker.call(sockets())
    return result


def _transport_of(connection: Any) -> asyncio.WriteTransport:
    return connection.transport if hasattr(connection, "transport") else connection.writer.transport


@pytest.mark.parametrize("front_door", ["kafka", "rocketmq"])
def test_a_stopped_broker_closes_the_socket_of_a_client_that_stopped_reading(front_door: str) -> None:
    broker = ThreadedBroker(broker_config("memory")).start()
    running, sock = True, None
    try:
        runtime = broker.runtime
        if front_door == "kafka":
            host, port = broker.bootstrap.split(":")
            address, request, connections = (host, int(port)), _kafka_api_versions, lambda: runtime.kafka.connections
        else:
            address, request = broker.native_address, _rocketmq_topic_route
            connections = lambda: runtime.native.connections
        sock = _mute_client(address, request)
        # the precondition that makes the test mean something: answers wait unsent when the broker stops
        wait_until(lambda: _queued_bytes(broker, connections) > 0, what="answers queued behind the mute client")
        [server_side] = _sockets(broker, connections)
        running = False
        broker.stop()
        assert server_side.fileno() == -1, "the stopped broker left the client's connection open"
    finally:
        if sock is not None:
            sock.close()
        if running:
            broker.stop()


async def test_a_connection_made_after_the_stop_is_aborted_as_it_comes() -> None:
    loop = asyncio.get_running_loop()
    accepted = AcceptedTransports()
    pairs = [socket.socketpair() for _ in range(2)]
    for ours, _theirs in pairs:
        ours.setblocking(False)
    for _ours, theirs in pairs:
        theirs.setblocking(False)
    before, _ = await loop.connect_accepted_socket(asyncio.Protocol, pairs[0][0])
    assert accepted.add(before)
    await accepted.abort_all()
    assert await asyncio.wait_for(loop.sock_recv(pairs[0][1], 1), 5) == b""  # closed by the stop
    after, _ = await loop.connect_accepted_socket(asyncio.Protocol, pairs[1][0])
    assert not accepted.add(after)
    assert await asyncio.wait_for(loop.sock_recv(pairs[1][1], 1), 5) == b""  # closed as it came
    for _ours, theirs in pairs:
        theirs.close()
