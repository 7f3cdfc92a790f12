"""A GpuModel's laneSelector in the operator (issue 37): the lanes whose labels match serve it, the match follows
the lanes' labels as they change, and the model's status names them."""

from __future__ import annotations

import asyncio

from .test_operator_controller import World, no_lane_loops, settles  # noqa: F401 (the autouse fixture)


def labelled(w: World, name: str, labels: dict[str, str]) -> None:
    body = w.kube.put("gpulanes", {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels}, "spec": {}})
    w.ctl.lane_event("MODIFIED", body)


def test_a_model_goes_only_to_the_lanes_its_selector_matches_and_follows_their_labels():
    async def scenario() -> None:
        w = World()
        labelled(w, "gpu-0", {"gpu": "l4"})
        labelled(w, "gpu-1", {"gpu": "a100"})
        w.model("big", laneSelector={"matchLabels": {"gpu": "a100"}})
        w.model("small")
        assert w.ctl.dispatcher.model("big").lanes == {"gpu-1"}
        key = w.submit("big-1", model="big")
        assert w.ctl.jobs.lane_of(w.ctl.jobs[key]) == "gpu-1"
        key2 = w.submit("big-2", model="big")  # gpu-0 is idle, but is no a100
        assert w.ctl.jobs.lane_of(w.ctl.jobs[key2]) is None
        small = w.submit("small-1", model="small")
        assert w.ctl.jobs.lane_of(w.ctl.jobs[small]) == "gpu-0"
        labelled(w, "gpu-1", {"gpu": "l4"})  # relabelled: no lane matches; the running job stays
        assert w.ctl.dispatcher.model("big").lanes == frozenset()
        await w.ctl.status.flush()
        assert w.kube.get("gpumodels/big")["status"]["lanes"] == []
        labelled(w, "gpu-0", {"gpu": "a100"})
        assert w.ctl.dispatcher.model("big").lanes == {"gpu-0"}
        await w.ctl.status.flush()
        assert w.kube.get("gpumodels/big")["status"]["lanes"] == ["gpu-0"]
        assert (w.kube.get("gpumodels/small").get("status") or {}).get("lanes") is None  # no selector
        w.ctl.lane_event("DELETED", w.kube.get("gpulanes/gpu-0"))
        assert w.ctl.dispatcher.model("big").lanes == frozenset()

    asyncio.run(scenario())


def test_what_a_lane_event_tells_the_core_is_settled_at_once(monkeypatch):
    """A new lane that is reserved, has its memory and matches two models' selectors: the core hears all four in
    one ``settle``, before the lane comes online, not one pass each."""

    async def scenario() -> None:
        w = World()
        for name in ("big", "bigger"):
            w.model(name, laneSelector={"matchLabels": {"gpu": "a100"}})
        settled = settles(monkeypatch)
        meta = {"name": "gpu-1", "uid": "uid-gpu-1", "labels": {"gpu": "a100"}}
        spec = {"reservedFor": {"namespaces": ["lab"]}, "memoryMib": 80000}
        body = w.kube.put("gpulanes", {"metadata": meta, "spec": spec})
        w.ctl.lane_event("ADDED", body)
        assert settled == [["LaneReserved", "LaneMemory", "ModelUpdated", "ModelUpdated"], ["LaneUpdated"]], settled
        assert w.ctl.dispatcher.model("bigger").lanes == {"gpu-1"}
        assert w.ctl.dispatcher.lane_state("gpu-1").owners == {"lab"}

    asyncio.run(scenario())
