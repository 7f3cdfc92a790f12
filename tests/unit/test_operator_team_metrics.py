"""Per-team metrics (issue 37): GPU seconds per namespace and member for chargeback, a counter that only grows,
with the members beyond the top ones by usage summed as other; dispatches and waits per band and namespace;
lane readiness."""

from __future__ import annotations

import asyncio

from gpulane.core.jobs import Job
from gpulane.operator.metrics import TOP_MEMBERS, chargeable

from .test_operator_controller import NS, World, no_lane_loops  # noqa: F401 (the autouse fixture)


def samples(w: World, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for m in w.ctl.metrics.registry.collect()
        for s in m.samples
        if s.name == name
    }


def test_an_ended_job_charges_its_namespace_and_member_the_time_it_held_the_lane():
    async def scenario() -> None:
        w = World()
        await w.warm("render", member="film")
        assert samples(w, "gpulane_lane_ready") == {}  # set when the lane's status is written
        await w.ctl.status.flush()
        assert samples(w, "gpulane_lane_ready") == {(("lane", "gpu-0"),): 1.0}
        w.clock.now += 960
        w.ctl.job_event("MODIFIED", w.executor_finishes("render"))
        await w.settle()
        assert samples(w, "gpulane_gpu_seconds_total") == {(("member", "film"), ("namespace", NS)): 960.0}
        assert samples(w, "gpulane_namespace_dispatches_total") == {(("band", "0"), ("namespace", NS)): 1.0}
        assert samples(w, "gpulane_namespace_wait_seconds_total") == {(("band", "0"), ("namespace", NS)): 0.0}

    asyncio.run(scenario())


def test_members_beyond_the_top_by_usage_are_charged_as_other():
    usage = {(f"ns/m{i}", 0): float(i) for i in range(TOP_MEMBERS + 5)}  # m0..m4 used least
    job = Job("ns/j", "m", member="m0", team="ns")
    assert chargeable(job, usage) == "other"
    top = Job("ns/j", "m", member=f"m{TOP_MEMBERS + 4}", team="ns")
    assert chargeable(top, usage) == f"m{TOP_MEMBERS + 4}"
    assert chargeable(Job("ns/j", "m", member="new", team="ns"), {}) == "other"  # no usage yet
