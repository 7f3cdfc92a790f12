"""Unit tests of gpulane/operator/resync.py: objects deleted with no watch event for it (between the
rebuild's read and the watches' first list, or while a watch lists again) are found by a resync list."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpulane.core.policy import Policy
from gpulane.operator import resync
from gpulane.operator.controller import Controller
from gpulane.operator.settings import Settings

from .helpers import until
from .test_operator_controller import NS, SYSTEM, World, job_body, no_lane_loops, pod_body  # noqa: F401 (fixture)


async def restarted(w: World) -> Controller:
    """A new operator's controller, rebuilt from what the fake API holds now."""
    ctl = Controller(w.kube, Settings(namespace=SYSTEM), clock=w.clock)
    await ctl.rebuild()
    return ctl


def test_a_lane_deleted_after_the_rebuild_read_it_gets_no_job():
    """The failure this fixes: the lane and its node went between the rebuild's read and the watch's
    list. Without the resync every job for the lane was dispatched to it and failed with BackendLost."""

    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane("gpu-0")
        ctl = await restarted(w)
        assert "gpu-0" in ctl.lanes
        w.kube.vanish("gpulanes/gpu-0")
        w.kube.vanish("nodes/node-0")

        assert await resync.resync(ctl._resync) == [("nodes", "node-0"), ("gpulanes", "gpu-0")]
        assert "gpu-0" not in ctl.lanes and not ctl.dispatcher.lanes["gpu-0"].online
        assert "node-0" not in ctl.observed.nodes
        ctl.job_event("ADDED", w.kube.put("gpujobs", job_body("j1")))
        assert ctl.jobs[f"{NS}/j1"].state == "pending", "no lane is left to take it"
        assert w.kube.calls_of("create_pod") == []
        assert await resync.resync(ctl._resync) == [], "what was forgotten is not found again"

    asyncio.run(scenario())


def test_a_model_a_backend_pod_and_the_policy_deleted_unseen_are_forgotten():
    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane("gpu-0")
        w.kube.put("pods", pod_body("gpu-0", "m"))
        w.kube.put("gpupolicies", {"metadata": {"name": "default", "generation": 1}, "spec": {"bandSpacing": 1000}})
        ctl = await restarted(w)
        assert ctl.dispatcher.policy.band_spacing == 1000 and "gpu-0" in ctl.observed.pods
        for target in ("gpumodels/m", f"pods/{SYSTEM}/gpulane-gpu-0", "gpupolicies/default"):
            w.kube.vanish(target)

        gone = await resync.resync(ctl._resync)
        assert sorted(gone) == [("gpumodels", "m"), ("gpupolicies", "default"), ("pods", "gpulane-gpu-0")]
        assert "m" not in ctl.observed.models
        assert "gpu-0" not in ctl.observed.pods
        assert ctl.dispatcher.policy.band_spacing == Policy().band_spacing
        assert "gpu-0" in ctl.lanes, "the lane stays: only its pod went"

    asyncio.run(scenario())


def test_what_appears_while_the_list_is_in_flight_is_kept():
    """The list may be older than the events delivered while it was read: a lane created meanwhile is not
    in it, and a lane created again under the same name is in it with its old uid. Neither is forgotten:
    only what the operator knew before it asked counts, as it knew it."""

    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane("gpu-0")
        ctl = w.ctl
        listed_before = w.kube.list_cluster

        async def racing_list(plural: str, selector: str = "") -> list[dict[str, Any]]:
            listed = await listed_before(plural, selector)
            if plural == "gpulanes":  # events delivered after the list was read, before it is answered
                ctl.lane_event("ADDED", w.kube.put("gpulanes", {"metadata": {"name": "gpu-1"}, "spec": {}}))
            return listed

        w.kube.list_cluster = racing_list  # type: ignore[method-assign]
        assert await resync.resync(ctl._resync) == []
        assert {"gpu-0", "gpu-1"} <= set(ctl.lanes)

    asyncio.run(scenario())


def test_a_lane_created_again_under_its_name_is_forgotten_once_and_comes_back_with_its_event():
    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane("gpu-0")
        ctl = w.ctl
        w.kube.vanish("gpulanes/gpu-0")
        again = w.kube.put("gpulanes", {"metadata": {"name": "gpu-0", "uid": "second"}, "spec": {}})

        assert await resync.resync(ctl._resync) == [("gpulanes", "gpu-0")], "the lane the operator knew is gone"
        ctl.lane_event("ADDED", again)
        assert ctl.lanes["gpu-0"].uid == "second"
        assert await resync.resync(ctl._resync) == []

    asyncio.run(scenario())


def test_the_loop_survives_a_failed_list_and_counts_what_it_finds(monkeypatch: pytest.MonkeyPatch):
    async def scenario() -> None:
        w = World()
        w.model("m")
        w.lane("gpu-0")
        listed_before, failures = w.kube.list_cluster, [TimeoutError("the apiserver did not answer")]

        async def flaky_list(plural: str, selector: str = "") -> list[dict[str, Any]]:
            if failures:
                raise failures.pop()
            return await listed_before(plural, selector)

        w.kube.list_cluster = flaky_list  # type: ignore[method-assign]
        w.kube.vanish("gpulanes/gpu-0")
        found: list[str] = []
        synced: list[bool] = []
        monkeypatch.setattr(resync, "RETRY_SECONDS", 0.001)
        monkeypatch.setattr(resync, "FIRST_ROUNDS", (0.001,))
        loop = asyncio.create_task(resync.run(w.ctl._resync, 60, found.append, lambda: synced.append(True)))
        try:
            await until(lambda: found, "the second round to find the lane gone")
        finally:
            loop.cancel()
        assert found == ["gpulanes"] and not failures
        assert synced == [True], "synced once the first round succeeded"
        assert "gpu-0" not in w.ctl.lanes

    asyncio.run(scenario())


def test_the_controller_is_synced_after_its_first_resync_and_counts_what_it_found():
    async def scenario() -> None:
        w = World(Settings(namespace=SYSTEM, resync_seconds=0.001))
        w.model("m")
        w.kube.vanish("gpumodels/m")
        assert not w.ctl.synced
        w.ctl.start()
        try:
            await until(lambda: w.ctl.synced, "the first resync")
            assert w.ctl.metrics.registry.get_sample_value("gpulane_resync_deletions_total", {"kind": "gpumodels"}) == 1
        finally:
            await w.ctl.stop()

    asyncio.run(scenario())
