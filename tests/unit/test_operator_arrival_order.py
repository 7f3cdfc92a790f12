"""Precise arrival order across restarts (issue 17): creationTimestamp has 1-s resolution, so jobs created
in the same second used to be ordered by name after a restart. The operator writes when it first saw each
job (status.submittedAt, to the microsecond) and a restarted operator orders them by it."""

from __future__ import annotations

import asyncio

from gpulane.operator.controller import Controller
from gpulane.operator.settings import Settings

from .test_operator_controller import NS, SYSTEM, T0, World, no_lane_loops  # noqa: F401 (the autouse fixture)


def dispatch_order(w: World, ctl: Controller) -> list[str]:
    """The waiting jobs in the order the core dispatches them onto the lane of "m": its picks, one by one,
    on a copy of the ranking."""
    ranking, order = ctl.dispatcher.ranking.copy(), []
    while (best := ranking.best({"m": 1.0}, 0.0)) is not None:
        ranking.take(best[2], w.clock())
        order.append(best[2].id.removeprefix(f"{NS}/"))
    return order


def test_jobs_of_the_same_second_keep_their_arrival_order_after_a_restart():
    async def scenario() -> None:
        w = World()
        await w.warm("busy")
        # "zulu" arrives first, "alpha" 300 ms later, both created in the second T0 + 10.
        w.clock.now = T0 + 10.1
        w.submit("zulu", created=T0 + 10)
        w.clock.now = T0 + 10.4
        w.submit("alpha", created=T0 + 10)
        await w.ctl.status.flush()
        assert dispatch_order(w, w.ctl) == ["zulu", "alpha"]
        assert w.kube.job("zulu")["status"]["submittedAt"] == "2024-05-01T12:00:10.100000Z"

        w.clock.now = T0 + 60
        again = Controller(w.kube, Settings(namespace=SYSTEM), clock=w.clock)
        await again.rebuild()
        assert dispatch_order(w, again) == ["zulu", "alpha"], "the restart reordered jobs of the same second"

    asyncio.run(scenario())


def test_jobs_seen_after_their_second_ended_stay_apart_and_keep_their_order_after_a_takeover():
    """Seen only once their creation second had ended (a loaded machine), jobs all fell on its last
    millisecond, tied, and the next leader ordered them by name (test_leader_election.py, twice)."""

    async def scenario() -> None:
        w = World()
        await w.warm("busy")
        for i, name in enumerate(["wait-c", "wait-b", "wait-a"]):
            w.clock.now = T0 + 11.2 + i / 10  # created at T0 + 10, seen in the next second
            w.submit(name, created=T0 + 10)
        await w.ctl.status.flush()
        written = [w.kube.job(n)["status"]["submittedAt"] for n in ["wait-c", "wait-b", "wait-a"]]
        assert written == ["2024-05-01T12:00:10.999000Z", "2024-05-01T12:00:10.999001Z",
                           "2024-05-01T12:00:10.999002Z"]  # fmt: skip
        w.clock.now = T0 + 60
        again = Controller(w.kube, Settings(namespace=SYSTEM), clock=w.clock)
        await again.rebuild()
        assert dispatch_order(w, again) == ["wait-c", "wait-b", "wait-a"], "the takeover reordered them"

    asyncio.run(scenario())
