"""The RocketMQ 5 front door: RocketMQ 5's gRPC MessagingService (what the official RocketMQ 5 SDKs speak), on
the same store, topics and share-state engine as the Kafka and remoting front doors. Needs the `grpc` extra
(grpcio and the protocol's generated modules, which rocketmq-python-client ships); loaded only when the listener is on
(`mqk serve` turns it on at 127.0.0.1:8081 where the extra is installed)."""

from mqk.server.rocketmq5.server import GrpcServer

__all__ = ["GrpcServer"]
