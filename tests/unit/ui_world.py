"""A small cluster for the web page's unit tests: lane gpu-0, two namespaces' jobs, and a chain in each."""

from __future__ import annotations

from typing import Any

from gpulane.api.times import format_time
from gpulane.ui.store import Store

T0 = 1_800_000_000.0
NOW = T0 + 600


def job(
    namespace: str, name: str, model: str, phase: str, *, member: str | None = None, **status: Any
) -> dict[str, Any]:
    times = {k: format_time(v) if isinstance(v, float) else v for k, v in status.items()}
    return {
        "metadata": {"namespace": namespace, "name": name, "creationTimestamp": format_time(T0),
                     "labels": times.pop("labels", {})},
        "spec": {"model": model, "priority": times.pop("priority", 0), "member": member or namespace},
        "status": {"phase": phase, **times},
    }  # fmt: skip


def world() -> dict[str, list[dict[str, Any]]]:
    jobs = [
        # team-a's film: two renders done (the first loaded its model), one running
        job(
            "team-a",
            "film-1",
            "flux",
            "Succeeded",
            dispatchedAt=T0 + 10,
            startedAt=T0 + 70,
            finishedAt=T0 + 200,
            lane="gpu-0",
            labels={"gpulane.io/chain": "film"},
            story={"load": True, "ranAhead": []},
        ),
        job(
            "team-a",
            "film-2",
            "flux",
            "Succeeded",
            dispatchedAt=T0 + 300,
            startedAt=T0 + 300,
            finishedAt=T0 + 400,
            lane="gpu-0",
            labels={"gpulane.io/chain": "film"},
        ),
        job(
            "team-a",
            "film-3",
            "flux",
            "Running",
            dispatchedAt=T0 + 400,
            startedAt=T0 + 400,
            lane="gpu-0",
            labels={"gpulane.io/chain": "film"},
        ),
        # waiting: team-b's secret job first on gpu-0, then team-a's chat
        job(
            "team-b",
            "secret-plan",
            "llama",
            "Pending",
            member="bob",
            position=1,
            positionExact=True,
            expectedLane="gpu-0",
            estimatedStart=T0 + 700,
            priority=100,
            score={"priority": 100, "tier": 0, "affinity": 0, "aging": 2.0, "total": 102.0},
        ),
        job(
            "team-a",
            "chat",
            "llama",
            "Pending",
            member="alice",
            position=2,
            positionExact=True,
            expectedLane="gpu-0",
            estimatedStart=T0 + 760,
            score={"priority": 0, "tier": 0, "affinity": 0, "aging": 2.0, "total": 2.0},
        ),
    ]
    lanes = [{
        "metadata": {"name": "gpu-0"},
        "spec": {"nodeName": "node-a"},
        "status": {
            "residentModel": "flux", "ready": True, "running": ["team-a/film-3"],
            "history": [
                {"job": "team-b/old-secret", "at": format_time(T0 + 5), "lane": "gpu-0", "model": "llama",
                 "load": True, "member": "bob", "priority": 0, "tier": "free",
                 "score": {"priority": 0, "tier": 0, "affinity": 0, "aging": 0, "total": 0}},
                {"job": "team-a/film-3", "at": format_time(T0 + 400), "lane": "gpu-0", "model": "flux",
                 "load": False, "member": "team-a", "priority": 0, "tier": "free",
                 "score": {"priority": 0, "tier": 0, "affinity": 10, "aging": 0, "total": 10}},
            ],
            "usage": [{"member": "team-b/bob", "band": 0, "gpuSeconds": 50, "at": format_time(T0)}],
            "teamUsage": [{"namespace": "team-b", "band": 0, "gpuSeconds": 50, "at": format_time(T0)}],
        },
    }]  # fmt: skip
    chains = [
        {"metadata": {"namespace": "team-a", "name": "film"}, "spec": {"model": "flux"},
         "status": {"phase": "Running", "progress": "2/5", "completed": 2, "total": 5, "gpuSeconds": 230,
                    "estimatedCompletion": format_time(NOW + 900),
                    "current": {"job": "film-3", "phase": "Running"}}},
        {"metadata": {"namespace": "team-b", "name": "secret-chain"}, "spec": {"model": "llama"},
         "status": {"phase": "Running", "progress": "1/9", "completed": 1, "total": 9}},
    ]  # fmt: skip
    models = [{"metadata": {"name": "flux"}, "status": {"runSeconds": 120.0}}, {"metadata": {"name": "llama"}}]
    return {"gpujobs": jobs, "gpulanes": lanes, "gpuchains": chains, "gpumodels": models, "gpupolicies": []}


def filled() -> Store:
    """A store that has listed every kind of ``world()``, as the watches would leave it."""
    store = Store()
    for plural, objs in world().items():
        for obj in objs:
            store.deliver(plural, "ADDED", obj)
        store.in_step(plural, True)
    return store
