"""The controller's work: the one writer of topic metadata (one per cluster, elected in node.py).

While this broker is the controller it answers the metadata changes brokers ask for (`requests/<id>` keys, in the
order they were made): create a topic (name and settings checked, partitions placed over the live groups:
placement.py), delete one, add partitions, replace its settings, and the steps of moving a partition to another
group (start or cancel, seal, switch: mqk.broker.moves). Each change is one etcd transaction that also
writes the asker's result and removes the request, and that carries the controller fence (the controller key is
still the one this broker created): a controller that lost its election (its lease expired while it was paused)
cannot write anything, even if it has not noticed yet.

It must not: write a topic key any other way, or answer a request it did not apply (a failed fence means the request
stays for the next controller).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

from mqk import errors as E
from mqk.broker import topic_config as settings
from mqk.broker.cluster.model import (
    MOVE_SEALED,
    PartitionMove,
    RequestRecord,
    ResultRecord,
    TopicRecord,
    dump,
)
from mqk.broker.cluster.node import ClusterNode
from mqk.broker.cluster.placement import group_loads, place
from mqk.broker.cluster.woken import WokenTask
from mqk.broker.names import KAFKA
from mqk.meta import Compare, Delete, LeaseExpired, MetaUnavailable, Put
from mqk.protocol.kafka.offset_records import OFFSETS_TOPIC
from mqk.store.adapter import MAX_SHARD_COUNT

log = logging.getLogger("mqk.cluster.controller")


class Controller:
    def __init__(self, node: ClusterNode, *, offsets_partitions: int = 50, max_partitions: int = 10_000) -> None:
        self.node = node
        self.offsets_partitions = offsets_partitions
        self.max_partitions = max_partitions
        self._task = WokenTask("mqk-controller", self._answer_requests)
        #: requests whose askers' leases are gone, skipped until their keys leave the view
        self._abandoned: set[str] = set()

    def start(self) -> None:
        self.node.view.add_listener(self._task.wake)
        self.node.on_controller.append(self._task.wake)
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def _answer_requests(self) -> float | None:
        """Apply the pending metadata requests in the order they were asked, while this broker is the controller;
        with etcd unreachable, again half a second later."""
        if not self.node.is_controller:
            return None
        try:
            pending = sorted(self.node.view.state.requests.items(), key=lambda item: item[1][0])
            for request_id, (_revision, request) in pending:
                if not self.node.is_controller:
                    break
                if request_id in self._abandoned:
                    continue
                try:
                    await self._apply(request_id, request)
                except LeaseExpired:
                    # the asker's lease is gone (it died after asking): its request key goes with it and nobody
                    # waits for the answer, which etcd refused to write under that lease; nothing was changed
                    log.info("controller: %s %r dropped: its asker is gone", request.op, request.topic)
                    self._abandoned.add(request_id)
            self._abandoned &= set(self.node.view.state.requests)
        except MetaUnavailable as exc:
            log.warning("controller: etcd unreachable (%s); requests wait", exc)
            return 0.5
        except E.NotControllerError:
            pass
        return None

    def _epoch(self) -> int:
        """This controller's epoch: every topic version it writes carries it (who wrote what, and when, in etcd)."""
        return self.node.controlling[0] if self.node.controlling else 0

    def _groups_for(self, rf: int) -> list[str]:
        """The live groups a partition of replication factor `rf` may go to (those with at least `rf` members);
        InvalidReplicationFactorError when there is none."""
        view = self.node.view
        live = view.live_groups()
        if not live:
            raise E.BrokerNotAvailableError("no broker group is live")
        if rf <= 1:
            return live
        fit = [g for g in live if len(view.members_of(g)) >= rf]
        if not fit:
            largest = max(len(view.members_of(g)) for g in live)
            raise E.InvalidReplicationFactorError(
                f"replication factor {rf}: no live broker group has {rf} brokers (the largest has {largest})"
            )
        return fit

    def _new_topic(self, name: str, partitions: int, configs: dict[str, str], rf: int) -> TopicRecord:
        state = self.node.view.state
        live = self._groups_for(rf)
        loads = group_loads((t.partitions for t in state.topics.values()), live)
        return TopicRecord(uuid.uuid4().hex, dict(configs), place(name, 0, partitions, live, loads), self._epoch(), rf)

    async def _apply(self, request_id: str, request: RequestRecord) -> None:
        """Apply one request and answer it, in one fenced transaction; then wait until this broker's view has seen
        it (the next request is decided on that view)."""
        keys = self.node.keys
        try:
            compares, writes = self._change(request)
            result = ResultRecord()
        except E.MqkError as exc:  # refused: answered, nothing written
            compares, writes = [], []
            result = ResultRecord(type(exc).__name__, str(exc))
        answer: list[Put | Delete] = [Delete(keys.request(request_id))]
        if request.lease:
            answer.append(Put(keys.result(request_id), dump(result), request.lease))
        fence = self.node.controller_fence()
        done, revision = await self.node.meta.txn_at([fence, *compares], [*writes, *answer])
        if not done:
            # the fence, or the topic's revision: retriable for the asker, who decided on an older view
            busy = ResultRecord("ConcurrentTransactionsError", f"{request.topic!r} changed meanwhile; try again")
            done, revision = await self.node.meta.txn_at(
                [fence],
                answer[:1] + ([Put(keys.result(request_id), dump(busy), request.lease)] if request.lease else []),
            )
            if not done:
                raise E.NotControllerError("the controller fence failed: another broker is the controller")
        elif writes:
            log.info("controller: %s %s done", request.op, request.topic)
        await self.node.view.wait_until(lambda s: s.revision >= revision, self.node.config.request_timeout_s)

    def _change(self, request: RequestRecord) -> tuple[list[Compare], list[Put | Delete]]:
        """The compares and writes that make `request`'s change; an mqk error when it is refused."""
        state = self.node.view.state
        name = request.topic
        key = self.node.keys.topic(name)
        current = state.topics.get(name)
        if request.op == "create":
            reason = KAFKA.error(name)
            if reason:
                raise E.InvalidTopicError(reason)
            if current is not None:
                raise E.TopicAlreadyExistsError(f"topic {name!r} already exists")
            if not 1 <= request.partitions <= min(self.max_partitions, MAX_SHARD_COUNT):
                raise E.InvalidPartitionsError(
                    f"partition count must be in [1, {self.max_partitions}], not {request.partitions}"
                )
            reason = settings.check_all(request.configs)
            if reason:
                raise E.InvalidConfigError(reason)
            self._groups_for(request.replication_factor)
            if request.validate_only:
                return [], []
            record = self._new_topic(name, request.partitions, request.configs, request.replication_factor)
            return [Compare(key, "version", "==", 0)], [Put(key, dump(record))]
        if current is None:
            raise E.UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        revision = state.topic_revisions.get(name, 0)
        if request.op == "delete":
            if name == OFFSETS_TOPIC:
                raise E.InvalidTopicError(f"{name} is internal")
            return [Compare(key, "mod", "==", revision)], [Delete(key)]
        if request.op == "partitions":
            have = len(current.partitions)
            if request.partitions <= have or request.partitions > min(self.max_partitions, MAX_SHARD_COUNT):
                raise E.InvalidPartitionsError(
                    f"topic {name!r} has {have} partitions; cannot change to {request.partitions}"
                )
            live = self._groups_for(current.replication_factor)
            if request.validate_only:
                return [], []
            loads = group_loads((t.partitions for t in state.topics.values()), live)
            grown = dataclasses.replace(
                current,
                partitions=current.partitions
                + place(name, have, request.partitions - have, live, loads, current.partitions),
                controller_epoch=self._epoch(),
            )
            return [Compare(key, "mod", "==", revision)], [Put(key, dump(grown))]
        if request.op.startswith("move"):
            moved = self._move(current, request)
            if moved is None or request.validate_only:
                return [], []
            return [Compare(key, "mod", "==", revision)], [Put(key, dump(moved))]
        # configs: a full replacement computed by the asker from the version it saw
        reason = settings.check_all(request.configs)
        if reason:
            raise E.InvalidConfigError(reason)
        if request.base_revision and request.base_revision != revision:
            raise E.ConcurrentTransactionsError(f"{name!r} changed while its settings were being computed")
        if request.validate_only:
            return [], []
        changed = dataclasses.replace(current, configs=dict(request.configs), controller_epoch=self._epoch())
        return [Compare(key, "mod", "==", revision)], [Put(key, dump(changed))]

    def _move(self, current: TopicRecord, request: RequestRecord) -> TopicRecord | None:
        """The topic after one step of moving a partition to another broker group (mqk.broker.moves), or None
        when the step changes nothing; an mqk error when it is refused."""
        name, p, target = request.topic, request.partitions, request.group
        if not 0 <= p < len(current.partitions):
            raise E.UnknownTopicOrPartitionError(f"no partition {name}-{p}")
        source = current.partitions[p][0]
        move = current.move_of(p)
        others = [m for m in current.moves if m.partition != p]
        if request.op == "move":
            if not target or target == source:  # back where it is: a cancel (Kafka's null replicas)
                if move is None:
                    if not target:
                        raise E.NoReassignmentInProgressError(f"no reassignment of {name}-{p} to cancel")
                    return None
                return dataclasses.replace(current, moves=others, controller_epoch=self._epoch())
            if move is not None and move.target == target:
                return None
            if move is not None and move.state == MOVE_SEALED:
                raise E.ReassignmentInProgressError(f"{name}-{p} is switching to group {move.target!r} now")
            if target not in self.node.view.live_groups():
                raise E.InvalidReplicaAssignmentError(f"broker group {target!r} has no live master")
            rf = current.replication_factor
            if rf > 1 and len(self.node.view.members_of(target)) < rf:
                raise E.InvalidReplicaAssignmentError(
                    f"{name} has replication factor {rf}; broker group {target!r} has fewer members"
                )
            return dataclasses.replace(
                current, moves=[*others, PartitionMove(p, target)], controller_epoch=self._epoch()
            )
        if move is None or move.target != target:  # cancelled or redirected meanwhile: the copier's step is stale
            raise E.NoReassignmentInProgressError(f"{name}-{p} is not moving to group {target!r}")
        if request.op == "move-seal":
            if move.state == MOVE_SEALED:
                return None
            sealed = dataclasses.replace(move, state=MOVE_SEALED)
            return dataclasses.replace(current, moves=[*others, sealed], controller_epoch=self._epoch())
        # "move-switch": the target holds every record (up to `offset`): the partition is the target's now, with
        # a leader epoch above every one it had
        if move.state != MOVE_SEALED:
            raise E.ReassignmentInProgressError(f"{name}-{p} is not sealed yet")
        masters = self.node.view.state.masters
        old_master, new_master = masters.get(source), masters.get(target)
        if new_master is None:
            raise E.LeaderNotAvailableError(f"broker group {target!r} has no master")
        old_epoch = current.epoch_base(p) + (old_master.epoch if old_master is not None else 0)
        bases = [current.epoch_base(i) for i in range(len(current.partitions))]
        bases[p] = old_epoch + 1 - new_master.epoch
        partitions = list(current.partitions)
        partitions[p] = (target, p)
        arrivals = [a for a in current.arrivals if a[0] != p] + [[p, old_epoch + 1, request.offset]]
        departures = [d for d in current.departures if d[0] != p or d[1] not in (source, target)]
        return dataclasses.replace(
            current,
            partitions=partitions,
            moves=others,
            epoch_bases=bases,
            arrivals=arrivals,
            departures=[*departures, [p, source, request.offset]],
            controller_epoch=self._epoch(),
        )


__all__ = ["OFFSETS_TOPIC", "Controller"]
