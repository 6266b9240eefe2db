"""Leader elections asked for by an operator (Kafka's ElectLeaders): PREFERRED and UNCLEAN, for a broker group.

mqk replicates broker groups, not partitions: every partition placed in a group is led by the group's master. So an
election asked for one partition moves the mastership of its whole group, and with it every partition placed there.

- **Preferred member**: the first member of the group in node order (the lowest node id of `groups/<g>/members`),
  as Kafka's preferred replica is the first of a partition's assignment. A PREFERRED election hands the mastership
  back to it when it is live and in the group's in-sync set; ELECTION_NOT_NEEDED when it is master already,
  PREFERRED_LEADER_NOT_AVAILABLE when it is not live or not in sync (it first has to catch up).
- **UNCLEAN** (only when asked for): a group without a master gets one: a live in-sync member if there is one, else
  the first live member outside the set (records only the lost in-sync members held are gone, as in Kafka);
  ELECTION_NOT_NEEDED while the group has a master, ELIGIBLE_LEADERS_NOT_AVAILABLE when no member is live.

No consensus of mqk's own: the mastership moves in one etcd transaction, compared on the revisions of the master
key, the epoch counter, the in-sync set and the new master's registration. It puts the master key under the new
master's own lease (so it still vanishes when that broker dies), bumps the master epoch and writes the in-sync set
under the new epoch. The old master sees a later epoch and resigns (its pending acks=all answers fail with
NOT_LEADER_OR_FOLLOWER and it follows the new master, cutting whatever it had not replicated, as after a failover);
the new master sees itself named and takes the mastership (mqk.broker.cluster.node, `_accept_handover`). An
acknowledged acks=all record is on every in-sync member, the new master included, so none is lost.
"""

from __future__ import annotations

import logging
from typing import Literal

from mqk import errors as E
from mqk.broker.cluster.model import (
    BrokerRecord,
    Malformed,
    MasterRecord,
    SyncStateRecord,
    dump,
    load_int,
    load_members,
)
from mqk.broker.cluster.node import ClusterNode
from mqk.meta import Compare, Put, Record

log = logging.getLogger("mqk.cluster")

ElectionType = Literal["preferred", "unclean"]
#: Kafka's ElectLeaders election_type values
ELECTION_TYPES: dict[int, ElectionType] = {0: "preferred", 1: "unclean"}
#: compare-and-set attempts before the election is answered as not possible now (retriable)
ATTEMPTS = 5


def _guard(key: str, record: Record | None) -> Compare:
    return Compare(key, "mod", "==", record.mod_revision) if record is not None else Compare(key, "version", "==", 0)


async def elect(node: ClusterNode, group: str, kind: ElectionType) -> int:
    """Run election `kind` for broker group `group`; the new master epoch. Raises ElectionNotNeededError,
    PreferredLeaderNotAvailableError, EligibleLeadersNotAvailableError (what the partitions are answered with),
    or MetaUnavailable / LeaseExpired when etcd cannot be asked."""
    for _ in range(ATTEMPTS):
        epoch = await _attempt(node, group, kind)
        if epoch:
            log.info("cluster: %s election moved group %s's mastership (epoch %d)", kind, group, epoch)
            return epoch
    raise E.EligibleLeadersNotAvailableError(f"group {group}'s state kept changing during the election; try again")


async def _attempt(node: ClusterNode, group: str, kind: ElectionType) -> int:
    keys, meta = node.keys, node.meta
    registered, _revision = await meta.get_prefix(keys.brokers)
    live: dict[int, Record] = {}
    for record in registered:
        try:
            registration = BrokerRecord.decode(record.value)
        except Malformed:
            continue
        if registration.group == group:
            live[registration.node_id] = record
    members_record = await meta.get(keys.members(group))
    members = sorted({*(load_members(members_record.value, keys.members(group)) if members_record else ()), *live})
    if not members:
        raise E.EligibleLeadersNotAvailableError(f"group {group} has no members")
    master_record = await meta.get(keys.master(group))
    master = MasterRecord.decode(master_record.value) if master_record is not None else None
    isr_record = await meta.get(keys.isr(group))
    isr = SyncStateRecord.decode(isr_record.value).members if isr_record is not None else []
    if kind == "preferred":
        preferred = members[0]
        if master is not None and master.node_id == preferred:
            raise E.ElectionNotNeededError(f"node {preferred}, group {group}'s preferred member, is its master")
        if preferred not in live:
            raise E.PreferredLeaderNotAvailableError(f"node {preferred}, group {group}'s preferred member, is down")
        if isr_record is not None and preferred not in isr:
            raise E.PreferredLeaderNotAvailableError(
                f"node {preferred}, group {group}'s preferred member, is not in sync (in-sync: {isr})"
            )
        target = preferred
        in_sync = {preferred, *(m for m in isr if m in live)}
    else:
        if master is not None:
            raise E.ElectionNotNeededError(f"group {group} has a master (node {master.node_id})")
        live_isr = [m for m in isr if m in live]
        if live_isr:
            target, in_sync = live_isr[0], set(live_isr)
        else:
            candidates = [m for m in members if m in live]
            if not candidates:
                raise E.EligibleLeadersNotAvailableError(f"no member of group {group} is live")
            target, in_sync = candidates[0], {candidates[0]}
            log.warning(
                "cluster: unclean election in group %s: node %d is not in sync %s; what only they held is lost",
                group,
                target,
                isr,
            )
    broker = live[target]
    epoch_record = await meta.get(keys.master_epoch(group))
    epoch = (load_int(epoch_record.value, keys.master_epoch(group)) if epoch_record is not None else 0) + 1
    guards = [
        _guard(keys.master(group), master_record),
        _guard(keys.master_epoch(group), epoch_record),
        _guard(keys.isr(group), isr_record),
        _guard(keys.broker(target), broker),
    ]
    puts = [
        Put(keys.master(group), dump(MasterRecord(target, epoch)), broker.lease),
        Put(keys.master_epoch(group), str(epoch).encode()),
        Put(keys.isr(group), dump(SyncStateRecord(sorted(in_sync), epoch))),
    ]
    if not await meta.txn(guards, puts):
        return 0
    await node.view.wait_until(lambda s: (m := s.masters.get(group)) is not None and m.epoch >= epoch, 5.0)
    return epoch


__all__ = ["ELECTION_TYPES", "ElectionType", "elect"]
