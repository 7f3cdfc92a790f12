"""The bridge's job queue at start: transient API errors (a fresh install's 429) are waited out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.aio.client.exceptions import ApiException

from gpulane.api.contract import REPLICA_LABEL, Body
from gpulane.bridge import job_queue
from gpulane.bridge.job_queue import KubeJobQueue


class FakeKube:
    namespace = "gpulane-system"

    def __init__(self, failures: list[Exception], orphans: list[Body]) -> None:
        self.failures = failures  # raised by the next lists, in order
        self.orphans = orphans
        self.leases: list[str] = []
        self.deleted: list[str] = []
        self.lists = 0

    async def apply_lease(self, name: str, holder: str, duration: int, now: float) -> None:
        self.leases.append(name)

    async def list_namespaced_jobs(self, namespace: str, selector: str) -> list[Body]:
        self.lists += 1
        assert selector == f"{REPLICA_LABEL}=r1"
        if self.failures:
            raise self.failures.pop(0)
        return self.orphans

    async def delete_job(self, namespace: str, name: str) -> None:
        self.deleted.append(name)


def test_a_429_at_start_is_retried_and_the_orphans_still_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    async def watch(*args: Any, **kwargs: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(job_queue, "watch_jobs", watch)
    initializing = ApiException(status=429, reason="storage is (re)initializing")
    orphans = [{"metadata": {"name": "old-call"}, "status": {"phase": "Pending"}},
               {"metadata": {"name": "done-call"}, "status": {"phase": "Succeeded"}}]  # fmt: skip
    kube = FakeKube([initializing, TimeoutError()], orphans)

    async def scenario() -> None:
        queue = KubeJobQueue(kube, "r1")  # type: ignore[arg-type]
        await asyncio.wait_for(queue.start(), timeout=10)
        for task in queue._tasks:
            task.cancel()

    asyncio.run(scenario())
    assert kube.lists == 3
    assert kube.deleted == ["old-call"]
