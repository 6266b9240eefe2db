"""The RocketMQ 5 gRPC listener: a grpc.aio server on the broker's event loop serving MessagingService
(mqk.server.rocketmq5.service), with TLS from the `[tls]` table when `grpc_tls` is on.

Bound to `grpc_listen` only (never every interface by default); SO_REUSEPORT off, so a second broker on the same
port fails to start instead of sharing it. gRPC checks each message's size against the limit before it reads it:
the largest body a client may send plus room for its properties. A connection idle for the broker's
`connections_max_idle_ms` is closed by gRPC (max_connection_idle). gRPC also holds its connections to the broker's
`max_connections` (grpc.max_allowed_incoming_connections: a connection past it is closed at once, and one is taken
again once another closes). It counts its own: grpc.aio offers no hook at accept, so the Kafka and remoting
listeners' shared count does not include them, and `max_connections_per_ip` does not apply to them."""

from __future__ import annotations

import logging
from typing import Any

import grpc
from rocketmq.grpc_protocol import service_pb2_grpc as pbs_grpc

from mqk.config import BrokerConfig
from mqk.groups.share import ShareGroups
from mqk.server.listeners import advertised_address
from mqk.server.native.server import NativeServer
from mqk.server.rocketmq5.service import MessagingService

log = logging.getLogger("mqk.rocketmq5")

#: room for a message's topic, properties and framing beside its body
ENVELOPE_BYTES = 1 << 20
#: max_connections' default (no cap): gRPC aborts the process if given it as its connection cap, so it is not
UNCAPPED = (1 << 31) - 1


class GrpcServer:
    def __init__(self, config: BrokerConfig, native: NativeServer, share: ShareGroups) -> None:
        assert config.grpc_listen is not None
        self.config = config
        self.service = MessagingService(native, share)
        self._server: Any = None
        self.address: tuple[str, int] | None = None

    def _credentials(self) -> Any:
        tls = self.config.tls
        if tls.key_password:
            raise ValueError("the gRPC listener cannot use an encrypted private key: give it an unencrypted one")
        assert tls.cert_file is not None and tls.key_file is not None
        ca = tls.ca_file.read_bytes() if tls.ca_file is not None and tls.client_auth != "none" else None
        return grpc.ssl_server_credentials(
            [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())],
            root_certificates=ca,
            require_client_auth=tls.client_auth == "required",
        )

    async def start(self) -> tuple[str, int]:
        host, port = self.config.grpc_listen or ("127.0.0.1", 0)
        limit = self.config.native_max_message_size + ENVELOPE_BYTES
        cap = []
        if self.config.max_connections < UNCAPPED:
            # the broker's connection cap, counted by gRPC over its own connections (see the module docstring)
            cap = [("grpc.max_allowed_incoming_connections", self.config.max_connections)]
        server = self._server = grpc.aio.server(
            options=[
                *cap,
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", max(limit, 64 << 20)),
                # the broker's idle limit (connections_max_idle_ms), enforced by gRPC on its own connections
                ("grpc.max_connection_idle_ms", self.config.connections_max_idle_ms),
            ]
        )
        pbs_grpc.add_MessagingServiceServicer_to_server(self.service, server)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.config.grpc_tls:
            bound = server.add_secure_port(target, self._credentials())
        else:
            bound = server.add_insecure_port(target)
        await server.start()
        self.address = (host, bound)
        advertised = advertised_address(self.config, "grpc", self.address) or self.address
        self.service.endpoints.addresses.add(host=advertised[0], port=advertised[1])
        self.service.start()
        log.info("rocketmq5: gRPC MessagingService on %s:%s%s", host, bound, " (TLS)" if self.config.grpc_tls else "")
        return self.address

    async def stop(self) -> None:
        await self.service.stop()
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None
