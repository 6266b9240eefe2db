"""The controller's request loop and the woken task under it: a request whose asker died (its lease gone, so etcd
refuses the answer) is dropped and the next one is answered; a run that raises does not end the task. No etcd: the
node is a stand-in."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from mqk.broker.cluster.controller import Controller
from mqk.broker.cluster.model import RequestRecord
from mqk.broker.cluster.woken import WokenTask
from mqk.clock import settle
from mqk.meta import LeaseExpired


def controller_over(requests: dict[str, tuple[int, RequestRecord]]) -> Controller:
    node: Any = SimpleNamespace(is_controller=True, view=SimpleNamespace(state=SimpleNamespace(requests=requests)))
    return Controller(node)


async def test_a_request_of_a_dead_asker_is_dropped_and_the_next_answered() -> None:
    requests = {
        "dead": (1, RequestRecord("create", "orphan", 1, lease=7)),
        "live": (2, RequestRecord("create", "wanted", 1, lease=8)),
    }
    controller = controller_over(requests)
    applied: list[str] = []

    async def apply(request_id: str, request: RequestRecord) -> None:
        applied.append(request_id)
        if request_id == "dead":
            raise LeaseExpired("etcdserver: requested lease not found")

    controller._apply = apply  # type: ignore[method-assign]  # the etcd transaction's outcome, stood in for
    assert await controller._answer_requests() is None
    assert applied == ["dead", "live"]
    # asked again before the dead request's key has left the view: not retried
    assert await controller._answer_requests() is None
    assert applied == ["dead", "live", "live"]
    del requests["dead"]
    await controller._answer_requests()
    assert controller._abandoned == set()


async def test_a_run_that_raises_is_logged_and_the_task_goes_on(caplog: Any) -> None:
    runs: list[int] = []
    again = asyncio.Event()

    async def work() -> float | None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise RuntimeError("a bug in one run")
        again.set()
        return None

    task = WokenTask("mqk-test-task", work)
    task.start()
    try:
        await asyncio.wait_for(again.wait(), 10)  # the retry after the failed run (about a second later)
        await settle()
        assert runs == [0, 1]
        assert any("a run failed" in r.getMessage() for r in caplog.records)
    finally:
        await task.stop()
