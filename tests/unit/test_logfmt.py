"""mqk.logfmt's LogThrottle: one line per key per interval, the rest counted, the keys bounded."""

from __future__ import annotations

from mqk.logfmt import LogThrottle


def test_log_throttle_lets_one_line_per_key_and_interval_through_and_counts_the_rest() -> None:
    now = [100.0]
    throttle = LogThrottle(interval_s=10.0, max_keys=4, now=lambda: now[0])
    assert throttle.allow("10.0.0.1") == 0
    assert [throttle.allow("10.0.0.1") for _ in range(3)] == [None, None, None]
    assert throttle.allow("10.0.0.2") == 0  # another address has its own interval
    now[0] += 10.0
    assert throttle.allow("10.0.0.1") == 3  # the next line says how many were held back
    assert throttle.allow("10.0.0.1") is None
    # bounded: a fifth address forgets the oldest half; a forgotten address's next line goes out
    for address in ("10.0.0.3", "10.0.0.4", "10.0.0.5"):
        assert throttle.allow(address) == 0
    assert len(throttle._keys) <= 4
    assert throttle.allow("10.0.0.2") == 0
