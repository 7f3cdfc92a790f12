"""The one watch helper (gpulane/kube/watch.py): failed lists back off and are retried, a broken watch
lists again, and ``on_state`` follows it, so the bridge's /readyz turns false while it is out of step."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from kubernetes.aio.client.exceptions import ApiException

from gpulane.kube import watch

from .helpers import until

Body = dict[str, Any]


class FlakyKube:
    """Lists fail ``failures`` times, then answer with one job at resourceVersion 1."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.lists = 0
        self.custom = self  # only its methods' identities are used, as the listers handed to `read`

    def list_cluster_custom_object(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("called through read()")

    async def read(self, fn: Any, *args: Any, **kwargs: Any) -> Body:
        self.lists += 1
        if self.lists <= self.failures:
            raise ApiException(status=500, reason="Internal Server Error")
        return {"items": [{"metadata": {"name": "j1", "resourceVersion": "1"}}], "metadata": {"resourceVersion": "1"}}


def test_failed_lists_back_off_and_readiness_follows_the_watch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    watches = 0
    broken = asyncio.Event()

    async def fake_watch(kube: Any, plural: str, namespace: Any, selector: Any, deliver: Any, version: str) -> None:
        nonlocal watches
        watches += 1
        assert version == "1"
        if watches == 1:
            await broken.wait()
            raise RuntimeError("the connection dropped")  # the apiserver restarted
        await asyncio.Event().wait()  # in step until cancelled

    monkeypatch.setattr(watch, "_watch", fake_watch)

    async def scenario() -> None:
        kube = FlakyKube(failures=3)
        states: list[bool] = []
        delivered: list[str] = []
        task = asyncio.create_task(
            watch.watch_jobs(
                kube,
                None,
                None,
                lambda kind, obj: delivered.append(kind),
                states.append,
                max_backoff=0.01,
            )
        )
        await until(lambda: states == [True], "the first successful list")
        assert kube.lists == 4 and delivered == ["ADDED"]
        broken.set()
        await until(lambda: states == [True, False, True], "out of step, then listed again")
        assert kube.lists == 5 and watches == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.WARNING, logger="gpulane.kube.watch"):
        asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3
    assert all(w.startswith("listing GpuJobs failed (HTTP 500 Internal Server Error); retrying in") for w in warnings)
