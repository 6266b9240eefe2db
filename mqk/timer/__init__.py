"""Delayed and scheduled delivery (RocketMQ delay levels and delivery times, Kafka `mqk-deliver-at` /
`mqk-delay-ms` headers): `TimerService(config, store, clock=...)` with start/stop; see `mqk.timer.service`."""

from __future__ import annotations

from mqk.timer.delay import HEADER_DELAY_MS, HEADER_DELIVER_AT, due_time
from mqk.timer.service import TIMER_STATE_TOPIC, TIMER_TOPIC, TimerService

__all__ = ["HEADER_DELAY_MS", "HEADER_DELIVER_AT", "TIMER_STATE_TOPIC", "TIMER_TOPIC", "TimerService", "due_time"]
