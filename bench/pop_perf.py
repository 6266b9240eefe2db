"""RocketMQ 5 POP over the remoting protocol against PULL of the same messages, against a broker this tool starts:

    python bench/pop_perf.py --messages 50000 --queues 4 --poppers 4

Lines, Kafka perf-test style, each with the broker's CPU seconds for the phase:
- `send-batch`: the messages, SEND_BATCH_MESSAGE of 64 (to have something to read).
- `pull`: PULL_MESSAGE of everything, all queues in parallel, 32 per pull (the classic consumption's cost).
- `pop+ack`: `--poppers` concurrent POP_MESSAGE calls over every queue (queueId -1, 32 per pop), each answered
  pop acknowledged with one BATCH_ACK_MESSAGE, until every message was popped once; the share-state engine keeps
  each record's state and writes the group's document per call.
- `pop ratio`: pop+ack's rate against pull's (issue 28's goal for share consumption: at least 50 %).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
import uuid

import perfutil


def _line(name: str, count: int, elapsed: float, size: int, cpu: float, extra: str = "") -> str:
    rate = count / max(elapsed, 1e-9)
    return (
        f"{name}: {count} records in {elapsed:.2f} s, {rate:.1f} records/sec ({rate * size / 1048576:.2f} MB/sec)"
        f"{extra}, broker cpu {cpu:.2f} s ({cpu / max(count, 1) * 1e6:.1f} us/record)"
    )


async def _pop_all(address: tuple[str, int], topic: str, count: int, poppers: int) -> tuple[float, int]:
    from mqk.client.remoting import RemotingConnection
    from mqk.protocol.native.codes import RequestCode, ResponseCode
    from mqk.protocol.native.command import RemotingCommand
    from mqk.protocol.native.message import decode_messages

    group = f"pop-perf-{uuid.uuid4().hex[:6]}"
    seen: set[tuple[int, int]] = set()

    async def popper() -> None:
        conn = RemotingConnection(address)
        await conn.connect()
        try:
            while len(seen) < count:
                ext = {"consumerGroup": group, "topic": topic, "queueId": -1, "maxMsgNums": 32}
                ext.update(invisibleTime=60_000, pollTime=1_000, bornTime=0, initMode=0)
                answer = await conn.invoke(RemotingCommand(code=RequestCode.POP_MESSAGE, ext_fields=ext), 30)
                if answer.code != ResponseCode.SUCCESS:
                    continue
                h = answer.ext_fields
                starts = {int(q): int(o) for _m, q, o in (s.split(" ") for s in h["startOffsetInfo"].split(";"))}
                acks = []
                for queue, offsets in _by_queue(decode_messages(answer.body)).items():
                    seen.update((queue, o) for o in offsets)
                    bits = sum(1 << (o - starts[queue]) for o in offsets)
                    raw = bits.to_bytes(max(1, (bits.bit_length() + 7) // 8), "little")
                    acks.append(
                        {"c": group, "t": topic, "r": "0", "so": starts[queue], "q": queue, "rq": 0}
                        | {"pt": int(h["popTime"]), "it": 60_000, "b": base64.b64encode(raw).decode()}
                    )
                body = json.dumps({"brokerName": "mqk-broker-a", "acks": acks}).encode()
                await conn.invoke(RemotingCommand(code=RequestCode.BATCH_ACK_MESSAGE, body=body), 30)
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(popper() for _ in range(poppers))), 600)
    return time.perf_counter() - started, len(seen)


def _by_queue(messages: list) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for m in messages:
        out.setdefault(m.queue_id, []).append(m.queue_offset)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--poppers", type=int, default=4)
    p.add_argument("--storage", default="file", choices=("file", "memory", "rocksdb"))
    args = p.parse_args()
    from native_perf import _pull_all, _send_batches

    with perfutil.Broker(args.storage) as broker:
        topic = f"pop-{uuid.uuid4().hex[:8]}"
        perfutil.create_topic(broker.bootstrap, topic, args.queues)
        cpu0 = broker.cpu_seconds()
        sent = asyncio.run(_send_batches(broker.namesrv, topic, args.messages - 1, args.size, 64, 4))
        cpu = broker.cpu_seconds() - cpu0
        print(_line("send-batch", sent["count"], sent["elapsed"], args.size, cpu, " (batches of 64)"))

        broker.settle()
        cpu0 = broker.cpu_seconds()
        pulled = asyncio.run(_pull_all(broker.namesrv, topic, args.messages, 32))
        cpu = broker.cpu_seconds() - cpu0
        print(_line("pull", pulled["count"], pulled["elapsed"], args.size, cpu, " (32 per pull)"))

        broker.settle()
        cpu0 = broker.cpu_seconds()
        address = broker.process.native_address
        assert address is not None
        elapsed, got = asyncio.run(_pop_all(address, topic, args.messages, args.poppers))
        cpu = broker.cpu_seconds() - cpu0
        print(_line("pop+ack", got, elapsed, args.size, cpu, f" (32 per pop, {args.poppers} poppers)"))
        pull_rate = pulled["count"] / max(pulled["elapsed"], 1e-9)
        print(f"pop ratio: {got / max(elapsed, 1e-9) / pull_rate * 100:.0f} % of pull's records/sec")


if __name__ == "__main__":
    main()
