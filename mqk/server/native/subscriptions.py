"""RocketMQ subscription group configs (what `mqadmin updateSubGroup`, `deleteSubGroup` and the dashboard send):
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, GET_SUBSCRIPTIONGROUP_CONFIG, GET_ALL_SUBSCRIPTIONGROUP_CONFIG and
DELETE_SUBSCRIPTIONGROUP, answered as RocketMQ's AdminBrokerProcessor answers them.

A config is kept as sent (RocketMQ's defaults filled in) with the group's share state (mqk.groups.share, so it
survives restarts and a Kafka share group of the same name sees it). What mqk acts on: `consumeMessageOrderly`,
which makes the group a FIFO group: POP (remoting and gRPC) hands out a queue's messages one batch at a time, in
order, and the RocketMQ 5 SDKs are told `fifo` in their settings; `consumeEnable` false, which pauses the group:
its pulls, pops and RocketMQ 5 receives get NO_PERMISSION (FORBIDDEN over gRPC) until it is true again; and
`retryMaxTimes`, the retries a POP group's message gets before it goes to `%DLQ%group` (the first delivery and
that many more), unless the group sets its own `share.delivery.count.limit`. The other fields are kept and shown,
not applied.
"""

from __future__ import annotations

import json
from typing import Any

from mqk.broker.names import ROCKETMQ
from mqk.groups.share import ShareGroups
from mqk.protocol.native.codes import ResponseCode
from mqk.protocol.native.command import RemotingCommand
from mqk.server.native.remoting import Connection

#: RocketMQ's SubscriptionGroupConfig fields and their defaults
DEFAULTS: dict[str, Any] = {
    "consumeEnable": True,
    "consumeFromMinEnable": True,
    "consumeBroadcastEnable": True,
    "consumeMessageOrderly": False,
    "retryQueueNums": 1,
    "retryMaxTimes": 16,
    "brokerId": 0,
    "whichBrokerWhenConsumeSlowly": 1,
    "notifyConsumerIdsChangedEnable": True,
    "groupSysFlag": 0,
    "consumeTimeoutMinute": 15,
    "attributes": {},
}


def paused(share: ShareGroups, group: str) -> str | None:
    """Why `group` may take no message now, in RocketMQ's words (its config says `consumeEnable` false: what an
    operator pauses a group with), or None. Pulls, pops and RocketMQ 5 receives ask it."""
    return None if share.consumable(group) else f"subscription group no permission, {group}"


class SubscriptionGroupProcessor:
    def __init__(self, share: ShareGroups, store: Any) -> None:
        self.share = share
        self.store = store

    async def _loaded(self) -> None:
        await self.share.ensure_loaded(self.store)

    async def update(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        try:
            sent = json.loads(cmd.body or b"")
        except (ValueError, UnicodeDecodeError):
            sent = None
        if not isinstance(sent, dict):
            return cmd.response(ResponseCode.INVALID_PARAMETER, "the body is not a SubscriptionGroupConfig")
        group = sent.get("groupName")
        if not isinstance(group, str) or not ROCKETMQ.allows(group):
            return cmd.response(ResponseCode.INVALID_PARAMETER, f"the group name {str(group)[:300]!r} is not valid")
        config = {**DEFAULTS, **{k: v for k, v in sent.items() if k in DEFAULTS or k == "subscriptionDataSet"}}
        for key, default in DEFAULTS.items():
            if type(config[key]) is not type(default):
                return cmd.response(ResponseCode.INVALID_PARAMETER, f"{key} must be a {type(default).__name__}")
        config["groupName"] = group
        await self._loaded()
        self.share.subscriptions[group] = config
        await self.share.save([group])
        return cmd.response(ResponseCode.SUCCESS)

    async def get(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.get_str("group", required=True) or ""
        await self._loaded()
        found = self.share.subscriptions.get(group)
        if found is None:
            return cmd.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] not exist")
        return cmd.response(ResponseCode.SUCCESS, None, None, json.dumps(found).encode())

    async def get_all(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await self._loaded()
        wrapper = {
            "subscriptionGroupTable": dict(sorted(self.share.subscriptions.items())),
            "forbiddenTable": {},
            "dataVersion": {"timestamp": 0, "counter": len(self.share.subscriptions)},
        }
        return cmd.response(ResponseCode.SUCCESS, None, None, json.dumps(wrapper).encode())

    async def delete(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        """The group's config goes; with cleanOffset its share state (where it stands, what it holds) too."""
        group = cmd.get_str("groupName", required=True) or ""
        await self._loaded()
        self.share.subscriptions.pop(group, None)
        if cmd.get_bool("cleanOffset"):
            self.share.groups.pop(group, None)
        await self.share.save([group])
        return cmd.response(ResponseCode.SUCCESS)
