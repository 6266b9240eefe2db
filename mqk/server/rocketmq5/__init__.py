"""The RocketMQ 5 front door: RocketMQ 5's gRPC MessagingService (what the official RocketMQ 5 SDKs speak), on
the same store, topics and share-state engine as the Kafka and remoting front doors. Needs the `rocketmq5` extra
(grpcio and the protocol's generated modules, which rocketmq-python-client ships); loaded only when `grpc_listen`
is set."""

from mqk.server.rocketmq5.server import GrpcServer

__all__ = ["GrpcServer"]
