"""Dispatch (RocketMQ's ReputMessageService): CommitLog entries become ConsumeQueue units and index entries.

Dispatch is synchronous with the append: the append pipeline (append.py) stages each entry's ConsumeQueue unit in
the same run that writes the entry and publishes both in the same call, so there is no dispatch lag to manage and
readers, who only look at ConsumeQueues, see an entry the moment its unit is published. `dispatch` is the
one-entry form recovery (recovery.py) replays scanned entries through. `dispatched` is the CommitLog offset below
which every entry has been dispatched (the checkpoint's safe offset is taken from it).

Extra consumers of entries (the key index) register in `hooks`; both paths call them through `run_hooks` (an append
skips the key index's hook for an entry it has nothing to index: AppendPipeline.hooks_for) as
`hook(topic, queue, base_offset, record_count, physical_offset, size, store_timestamp, keys, body)`, where
`keys` is what the producer passed (None at recovery: the hook derives keys from `body`, a view of the record
batch). A hook must not raise; if it does, the error is logged and dispatch goes on (the CommitLog is the truth).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqk.store.adapter import Buffer
    from mqk.store.file.shards import Shard

log = logging.getLogger(__name__)

#: hook(topic, queue, base_offset, count, phys, size, store_ts, keys, body): `body` is the entry's record batch, as
#: stored or as the producer gave it (the same bytes but for the first eight, the base offset, which is the
#: `base_offset` argument); appends hand over the producer's buffer, not a view that reads the log back
DispatchHook = Callable[[str, int, int, int, int, int, int, "Sequence[bytes] | None", "Buffer"], None]


class ReputMessageService:
    def __init__(self) -> None:
        self.hooks: list[DispatchHook] = []
        #: CommitLog offset up to which every entry has been dispatched
        self.dispatched = 0

    def dispatch(
        self,
        shard: Shard,
        phys: int,
        size: int,
        count: int,
        tags_code: int,
        store_ts: int,
        max_ts: int,
        base_offset: int,
        keys: Sequence[bytes] | None,
        body: Buffer,
    ) -> None:
        """Entry → ConsumeQueue unit (+ hooks), as recovery replays it. The engine's appends write the unit
        their own way (in the append kernel, or a run at a time) and call `run_hooks` with the hooks that apply."""
        shard.cq.put(phys, size, count, tags_code, store_ts, max_ts, base_offset)
        self.dispatched = phys + size
        if self.hooks:
            run_hooks(self.hooks, shard.topic, shard.queue, base_offset, count, phys, size, store_ts, keys, body)


def run_hooks(
    hooks: Sequence[DispatchHook],
    topic: str,
    queue: int,
    base_offset: int,
    count: int,
    phys: int,
    size: int,
    store_ts: int,
    keys: Sequence[bytes] | None,
    body: Buffer,
) -> None:
    """Show one entry to `hooks`, in order; a hook that raises is logged and the next one still runs."""
    for hook in hooks:
        try:
            hook(topic, queue, base_offset, count, phys, size, store_ts, keys, body)
        except Exception:
            log.exception("dispatch hook %r failed for %s-%d@%d", hook, topic, queue, base_offset)
