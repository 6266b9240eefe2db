"""How long a failed authentication waits before it is answered: Kafka's connection.failed.authentication.delay.ms,
growing for an address that keeps failing.

The first failure from an address waits `base_s`; each further one doubles that, up to `max_s`, so a password
guesser is slowed down while a client with one typo barely notices. An address is forgotten `forget_s` after its last
failure, or after a success; at most `capacity` addresses are remembered (the least recently failed go first), so a
flood of addresses cannot grow the table without bound. Time comes from the broker's clock.
"""

from __future__ import annotations

from collections import OrderedDict

from mqk.clock import Clock


class AuthFailureDelays:
    def __init__(
        self, clock: Clock, base_s: float, max_s: float, *, forget_s: float = 600.0, capacity: int = 10_000
    ) -> None:
        self.clock = clock
        self.base_s = base_s
        self.max_s = max_s
        self.forget_s = forget_s
        self.capacity = capacity
        #: address -> (consecutive failures, time of the last one)
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def failed(self, address: str) -> float:
        """Count a failure from `address`; the seconds its answer waits."""
        now = self.clock.monotonic()
        count, last = self._failures.pop(address, (0, now))
        if now - last > self.forget_s:
            count = 0
        count += 1
        self._failures[address] = (count, now)
        while len(self._failures) > self.capacity:
            self._failures.popitem(last=False)
        delay: float = min(self.max_s, self.base_s * (2 ** min(count - 1, 32)))
        return delay

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)

    def failures(self, address: str) -> int:
        """Consecutive failures remembered for `address`."""
        return self._failures.get(address, (0, 0.0))[0]
