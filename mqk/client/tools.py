"""Command-line shaped helpers over the native client, for `mqk produce/consume --protocol native` (the CLI
parses flags and calls these): produce lines as messages, consume a topic (all queues) as a group, printing each
message. They return counts so the CLI can report and exit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from mqk.client.consumer import PullConsumer
from mqk.client.producer import Message, Producer
from mqk.protocol.native.message import MessageExt


async def produce_lines(
    namesrv: str,
    topic: str,
    lines: Iterable[bytes],
    *,
    tags: str | None = None,
    key_separator: bytes | None = None,
    delay_level: int = 0,
    deliver_at_ms: int | None = None,
    group: str = "mqk-cli-producer",
) -> int:
    """One message per line; with `key_separator`, `KEY<sep>BODY` lines carry a key."""
    sent = 0
    async with Producer(namesrv, group) as producer:
        for line in lines:
            key = None
            body = line
            if key_separator is not None and key_separator in line:
                raw_key, body = line.split(key_separator, 1)
                key = raw_key.decode("utf-8", "replace")
            await producer.send(
                Message(
                    topic,
                    body,
                    tags=tags,
                    keys=[key] if key else None,
                    delay_level=delay_level,
                    deliver_at_ms=deliver_at_ms,
                )
            )
            sent += 1
    return sent


def format_message(msg: MessageExt) -> str:
    keys = " ".join(msg.keys)
    return (
        f"{msg.topic}\t{msg.queue_id}\t{msg.queue_offset}\t{msg.tags or ''}\t{keys}\t"
        f"{msg.body.decode('utf-8', 'replace')}"
    )


async def consume(
    namesrv: str,
    topic: str,
    group: str,
    *,
    expression: str = "*",
    from_beginning: bool = True,
    max_messages: int | None = None,
    idle_timeout_s: float | None = 5.0,
    commit: bool = True,
    out: Callable[[MessageExt], None] = lambda m: print(format_message(m), flush=True),
    credentials: tuple[str, str] | None = None,
) -> int:
    """Pull every queue of `topic` from the group's committed offset (else the start, or the end without
    `from_beginning`) until `max_messages` arrived or nothing came for `idle_timeout_s`. `credentials`: (access
    key, secret key) to sign the requests with (a broker with RocketMQ ACLs on)."""
    seen = 0
    async with PullConsumer(namesrv, group) as consumer:
        consumer.credentials = credentials
        queues = await consumer.queues(topic)
        offsets = {}
        for mq in queues:
            committed = await consumer.committed_offset(mq)
            if committed is None:
                committed = await consumer.min_offset(mq) if from_beginning else await consumer.max_offset(mq)
            offsets[mq] = committed
        last_data = time.monotonic()
        while max_messages is None or seen < max_messages:
            results = await asyncio.gather(
                *(consumer.pull(mq, offsets[mq], 64, expression, suspend_ms=500) for mq in queues)
            )
            got_any = False
            for mq, result in zip(queues, results):
                for msg in result.messages:
                    if max_messages is not None and seen >= max_messages:
                        break
                    out(msg)
                    seen += 1
                    offsets[mq] = msg.queue_offset + 1
                    got_any = True
                else:
                    offsets[mq] = result.next_offset
            if got_any:
                last_data = time.monotonic()
            elif idle_timeout_s is not None and time.monotonic() - last_data > idle_timeout_s:
                break
        if commit:
            for mq, offset in offsets.items():
                await consumer.commit_offset(mq, offset)
    return seen
