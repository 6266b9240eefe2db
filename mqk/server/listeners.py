"""A broker's Kafka listeners as the front door runs them: each one's name, security protocol, bound address and the
address clients are told to connect to (Kafka's `listeners` and `advertised.listeners`).

Keys: the unnamed PLAINTEXT listener (`--kafka-listen`) is `kafka`, a named listener NAME is `kafka.NAME`. A key
names the listener in the ready line (`kafka=` / `kafka.NAME=`), in `--advertise` (`kafka.NAME=HOST:PORT`, like
`kafka=` and `native=`) and in a cluster broker's registration (mqk.broker.cluster's BrokerRecord.listeners), where
Metadata looks up, for every broker, the listener of the name the client came in through (Kafka's rule).

The advertised address of a listener is, in this order: the one configured for its key (`--advertise KEY=HOST:PORT`,
or `advertised_listeners` for a named listener); a bare `--advertise HOST` with the bound port; the bound address.
A listener bound to every interface (0.0.0.0, ::) with nothing configured is advertised at the address each client
reached it by (its connection's local address), never as 0.0.0.0; a cluster broker cannot register such a listener
(its peers' clients reach it by an address it cannot know) and refuses to start.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqk.config import BrokerConfig, ListenerConfig, parse_hostport

Address = tuple[str, int]
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def listener_key(name: str) -> str:
    return f"kafka.{name}" if name else "kafka"


@dataclass(eq=False)
class KafkaListener:
    config: ListenerConfig
    #: the address bound (port 0 resolved), once started
    bound: Address | None = None
    #: what clients are told; None: the address each client reached (bound to every interface, nothing configured)
    advertised: Address | None = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def protocol(self) -> str:
        return self.config.protocol

    @property
    def key(self) -> str:
        return listener_key(self.config.name)

    @property
    def tls(self) -> bool:
        return self.config.tls

    @property
    def sasl(self) -> bool:
        return self.config.sasl

    def describe(self) -> str:
        return f"{self.name or 'kafka'} ({self.protocol})"


def advertised_address(config: BrokerConfig, key: str, bound: Address) -> Address | None:
    """Where clients are told to reach the listener `key` bound at `bound` (None: bound to every interface and
    nothing configured; see the module docstring)."""
    host = None
    for item in config.advertise:
        name, sep, value = item.partition("=")
        if sep and name.strip() == key:
            return parse_hostport(value.strip())
        if not sep:
            host = item.strip()
    for name, h, p in config.advertised_listeners:
        if key == listener_key(name):
            return h, p
    if host:
        return host, bound[1]
    if bound[0] in WILDCARD_HOSTS:
        return None
    return bound


def kafka_listeners(config: BrokerConfig) -> list[KafkaListener]:
    return [KafkaListener(lc) for lc in config.kafka_listeners]
