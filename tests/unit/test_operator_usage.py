"""Fair share by GPU time across operator restarts (issue 18, part 1): each member's decayed usage is kept on
the lanes' status beside lastServed, and a new operator starts from it instead of from zero."""

from __future__ import annotations

import asyncio

import pytest

from gpulane.operator.controller import Controller
from gpulane.operator.rebuild import usage_entries
from gpulane.operator.settings import Settings

from .test_operator_controller import NS, SYSTEM, World, no_lane_loops, settles  # noqa: F401 (the autouse fixture)


def test_usage_is_written_on_the_lane_and_a_restarted_operator_goes_on_from_it(monkeypatch):
    async def scenario() -> None:
        w = World()
        await w.warm("render", member="film")
        w.clock.now += 960  # a 16-minute render
        w.ctl.job_event("MODIFIED", w.executor_finishes("render"))
        await w.reconcile()
        await w.ctl.status.flush()
        status = w.kube.get("gpulanes/gpu-0")["status"]
        [entry] = status["usage"]
        assert (entry["member"], entry["band"]) == (f"{NS}/film", 0)  # a member inside its namespace
        # 960 GPU-seconds, dated at the run's middle and so decayed by 480 s of a 3600-s half-life.
        assert entry["gpuSeconds"] == pytest.approx(960 * 2 ** (-480 / 3600), rel=0.001)
        [team] = status["teamUsage"]  # the job's namespace: the upper level of fair share's tree
        assert (team["namespace"], team["band"], team["gpuSeconds"]) == (NS, 0, entry["gpuSeconds"])

        w.clock.now += 3600  # down for one half-life
        again = Controller(w.kube, Settings(namespace=SYSTEM), clock=w.clock)
        settled = settles(monkeypatch)
        await again.rebuild()
        # The clocks and usage the lanes kept reach the core in one pass.
        assert ["QueueServed", "UsageRestored", "TeamUsageRestored"] in settled, settled
        assert again.dispatcher.usage(w.clock())[(f"{NS}/film", 0)] == pytest.approx(entry["gpuSeconds"] / 2, rel=0.001)
        assert again.dispatcher.team_usage(w.clock())[(NS, 0)] == pytest.approx(team["gpuSeconds"] / 2, rel=0.001)

    asyncio.run(scenario())


def test_the_latest_entry_wins_and_hand_written_garbage_is_skipped():
    lanes = [
        {"status": {"usage": [{"member": "a", "band": 100, "gpuSeconds": 10, "at": "2026-12-01T10:00:00Z"},
                              {"member": "b", "band": "x", "gpuSeconds": 5, "at": "2026-12-01T10:00:00Z"}]}},
        {"status": {"usage": [{"member": "a", "band": 100, "gpuSeconds": 30, "at": "2026-12-01T11:00:00Z"},
                              {"member": "c", "band": 0, "gpuSeconds": -1, "at": "2026-12-01T11:00:00Z"}]}},
        {"status": {}},
    ]  # fmt: skip
    [(member, band, seconds, _at)] = usage_entries(lanes)
    assert (member, band, seconds) == ("a", 100, 30)
