"""Share group offset operations across broker groups (cluster mode), through etcd.

A share group's membership is kept by its coordinator, and the record states of each partition by the master of
the broker group the partition is placed in (mqk.groups.share; its log carries them). The admin's
Describe-, Alter- and DeleteShareGroupOffsets go to the coordinator, as Kafka's admin client sends them, so the
coordinator asks the masters holding the partitions, as Kafka's group coordinator asks its share coordinators:

    share-ops/<group>/<op id>       (JSON)   an operation on this group's share states  (the asker's lease)
    share-answers/<op id>/<group>   (JSON)   the group's master's answer                (the answerer's lease)

The asker writes one request per broker group it needs, waits for every answer in its view, then deletes both
(a lease takes them if the asker dies first). A master answers each request addressed to its group once, fenced on
its mastership; what an operation does and answers is the caller's (`perform`): the keys carry JSON objects only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import quote

from mqk.broker.cluster import ClusterMember
from mqk.errors import MetaUnavailable, MqkError
from mqk.meta import Delete, Put

log = logging.getLogger("mqk.cluster.share")

Perform = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ShareOps:
    """One broker's side of the keys: as a coordinator (`ask`) and as its group's master (answering)."""

    def __init__(self, member: ClusterMember, perform: Perform) -> None:
        self.member = member
        self.keys = member.keys
        #: runs one operation on this broker's share states and says what came of it (its answer)
        self.perform = perform
        #: op ids of this group's requests being answered or answered (forgotten once their request is gone)
        self._taken: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Answer the requests addressed to this broker's group from now on (the view is synced)."""
        self.member.view.add_listener(self._follow)
        self._follow()

    # --- the coordinator's side ----------------------------------------------------------------------------------

    async def ask(
        self,
        groups: Iterable[str],
        op: dict[str, Any],
        timeout: float = 5.0,  # noqa: ASYNC109 - a bound on the wait for the answers, which then stop counting
    ) -> dict[str, dict[str, Any]]:
        """Ask every group's master for `op`; its answer by group (a group missing did not answer within
        `timeout`). MetaUnavailable when etcd cannot take the requests."""
        wanted = sorted(set(groups))
        if not wanted:
            return {}
        op_id = uuid.uuid4().hex
        node = self.member.node
        body = json.dumps(op).encode()
        requests = [self.keys.share_op(g, op_id) for g in wanted]
        await node.meta.txn([], [Put(key, body, node.lease) for key in requests])
        tails = {g: self.keys.share_answer(op_id, g)[len(self.keys.share_answers) :] for g in wanted}
        try:
            await self.member.view.wait_until(
                lambda s: all(t in s.table(self.keys.share_answers).values for t in tails.values()), timeout
            )
            held = self.member.view.state.table(self.keys.share_answers).values
            answers = {}
            for group, tail in tails.items():
                if tail in held:
                    try:
                        answers[group] = _decode(held[tail], f"the answer of group {group}")
                    except ValueError as exc:  # (counted as no answer)
                        log.error("share operation %s: %s", op_id, exc)
            return answers
        finally:
            answered = [self.keys.share_answer(op_id, g) for g in wanted]
            with contextlib.suppress(MetaUnavailable):  # (the leases take them)
                await node.meta.txn([], [Delete(key) for key in requests + answered])

    # --- the master's side ---------------------------------------------------------------------------------------

    def _follow(self) -> None:
        asked = self.member.view.state.table(self.keys.share_ops).values
        prefix = quote(self.member.group, safe="") + "/"
        mine = {tail[len(prefix) :]: value for tail, value in asked.items() if tail.startswith(prefix)}
        self._taken &= set(mine)
        if not self.member.node.leading:
            return
        for op_id, value in mine.items():
            if op_id not in self._taken:
                self._taken.add(op_id)
                task = asyncio.get_running_loop().create_task(self._answer(op_id, value))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _answer(self, op_id: str, value: bytes) -> None:
        try:
            answer = await self.perform(_decode(value, f"share operation {op_id}"))
        except (MqkError, ValueError, KeyError, TypeError) as exc:
            log.warning("share operation %s not performed: %s", op_id, exc)
            answer = {"error": str(exc)}
        node = self.member.node
        put = Put(self.keys.share_answer(op_id, self.member.group), json.dumps(answer).encode(), node.lease)
        try:
            if not await node.meta.txn([self.member.master_fence()], [put]):
                log.info("share operation %s not answered: this broker is no longer its group's master", op_id)
        except MetaUnavailable as exc:
            log.warning("share operation %s not answered: %s", op_id, exc)


def _decode(value: bytes, what: str) -> dict[str, Any]:
    doc = json.loads(value)
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is not a JSON object")
    return doc


__all__ = ["Perform", "ShareOps"]
