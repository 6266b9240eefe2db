"""mqk: a Kafka- and RocketMQ-compatible message broker in Python with a Cython hot path."""

__version__ = "0.1.0"
