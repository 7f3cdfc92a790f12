"""The queue's summary per band (``Dispatcher.waiting``): what ``gpulane_queue_depth`` and
``gpulane_oldest_wait_seconds`` show. It is read from the (member, band) queues, not by walking every job: a
scrape walked all 100,000 waiting jobs (75 ms with the loop held, issue 35)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from gpulane.core.baselines import RANKINGS
from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import JobCancelled, JobFinished, LoadLost
from gpulane.core.jobs import ModelSpec
from gpulane.core.ranking import FairShareRanking
from gpulane.operator.metrics import Metrics, queue_snapshot

from .helpers import dispatcher, submit

# (what, a number that picks the job or its priority, member and model)
Step = tuple[str, int]
STEPS = st.lists(st.tuples(st.sampled_from(["submit", "submit", "finish", "cancel", "lose"]), st.integers(0, 999)),
                 max_size=60)  # fmt: skip


def walked(d: Dispatcher) -> dict[int, tuple[int, float]]:
    """The summary by walking every waiting job: what the scrape used to do."""
    out: dict[int, tuple[int, float]] = {}
    for job in d.pending():
        count, first = out.get(band := d.policy.band(job.priority), (0, math.inf))
        out[band] = (count + 1, min(first, job.submitted_at))
    return out


def play(ranking: str, steps: list[Step]) -> Dispatcher:
    d, clock = dispatcher(lanes={"gpu-0": None, "gpu-1": "b"}, models=[ModelSpec("a", 2), ModelSpec("b")],
                          ranking=ranking)  # fmt: skip
    for i, (what, n) in enumerate(steps):
        clock.now += n % 7
        if what == "submit":
            submit(d, clock, f"j{i}", "ab"[n % 2], priority=(n % 3 - 1) * 100 + n % 5, member=f"m{n % 4}")
        elif what == "finish" and d.running:
            d.handle(JobFinished(sorted(d.running)[n % len(d.running)]))
        elif what == "cancel" and (waiting := sorted(job.id for job in d.pending())):
            d.handle(JobCancelled(waiting[n % len(waiting)]))
        elif what == "lose":  # a load lost: its jobs wait again in their places (the ranking's untake)
            d.handle(LoadLost(f"gpu-{n % 2}"))
    return d


@pytest.mark.parametrize("ranking", RANKINGS)
@settings(max_examples=60, deadline=None)
@given(steps=STEPS)
def test_the_summary_per_band_is_what_walking_the_queue_finds(ranking: str, steps: list[Step]) -> None:
    d = play(ranking, steps)
    assert d.waiting() == walked(d)


def test_a_scrape_of_the_queue_metrics_walks_no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    d = play("gpulane", [("submit", n) for n in range(40)] + [("finish", 0), ("cancel", 3), ("lose", 1)])
    expected = walked(d)
    assert len(expected) == 3, expected  # three bands wait

    def walk(self: FairShareRanking) -> None:
        raise AssertionError("the scrape walked the whole queue")

    monkeypatch.setattr(FairShareRanking, "pending", walk)
    now = d.clock()
    metrics = Metrics(lambda: queue_snapshot(d, now))
    text = generate_latest(metrics.registry).decode()
    for band, (count, first) in expected.items():
        label = str(band * d.policy.band_spacing)
        assert f'gpulane_queue_depth{{band="{label}"}} {float(count)}' in text
        assert f'gpulane_oldest_wait_seconds{{band="{label}"}} {float(now - first)}' in text
