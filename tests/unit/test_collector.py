"""Python's collector in the operator (``operator/collector.py``): each collection timed by its generation, and the
survivors of a long full one frozen out of the next ones."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from gpulane.operator import collector
from gpulane.operator.metrics import Metrics


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the suite collects as usual


async def after_queued() -> None:
    """Once every callback the loop had queued before this call has run (the loop runs them in order)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.call_soon_threadsafe(done.set_result, None)
    await asyncio.wait_for(done, timeout=5)


def test_each_collection_is_timed_by_its_generation_on_the_loops_next_turn_until_stopped() -> None:
    async def scenario() -> None:
        seen: list[tuple[int, float]] = []
        full = asyncio.Event()

        def observe(generation: int, seconds: float) -> None:
            seen.append((generation, seconds))
            if generation == 2:
                full.set()

        stop = collector.time_collections(observe, asyncio.get_running_loop(), 60.0)
        gc.collect(2)  # the event under test: a full collection
        assert seen == [], "observed inside the collector's callback, where a metric's lock may be held"
        await asyncio.wait_for(full.wait(), timeout=5)
        assert all(s >= 0 for _, s in seen), seen
        stop()
        count = len(seen)
        gc.collect(2)
        await after_queued()
        assert len(seen) == count, "a stopped timer still observed collections"

    asyncio.run(scenario())


def test_a_long_full_collection_freezes_its_survivors_on_the_loops_next_turn_and_counts_it() -> None:
    async def scenario(freeze_after: float) -> tuple[int, int]:
        freezes: list[int] = []
        stop = collector.time_collections(
            lambda g, s: None, asyncio.get_running_loop(), freeze_after, lambda: freezes.append(gc.get_freeze_count())
        )
        try:
            gc.collect(2)  # the event under test
            assert gc.get_freeze_count() == 0, "frozen inside the collector's callback"
            assert freezes == [], "counted inside the collector's callback"
            await after_queued()  # the freeze, if the collection asked for one, has run
            assert all(n > 0 for n in freezes), "counted before the freeze"
            return gc.get_freeze_count(), len(freezes)
        finally:
            stop()

    frozen, counted = asyncio.run(scenario(freeze_after=0.0))
    assert frozen > 0, "a full collection as long as the bound froze nothing"
    assert counted >= 1, "a freeze went uncounted"
    gc.unfreeze()
    assert asyncio.run(scenario(freeze_after=60.0)) == (0, 0), "a short full collection froze its survivors"


def test_a_queue_grown_by_thousands_of_jobs_is_frozen_after_the_next_young_collection() -> None:
    """A queue of 20,000 built without a full collection, and the first one (0.39 s) fell among dispatches
    minutes later: a queue that grew by ``freeze_every`` jobs since the last freeze is frozen after the next young
    collection, so that no full one walks more than that many jobs' objects."""
    held = [0]

    async def scenario() -> list[int]:
        freezes: list[int] = []

        async def young(generation: int = 1) -> None:
            gc.collect(generation)  # the event under test: a young collection
            assert len(freezes) == before, "frozen inside the collector's callback"
            await after_queued()

        stop = collector.time_collections(
            lambda g, s: None, asyncio.get_running_loop(), 60.0, lambda: freezes.append(gc.get_freeze_count()),
            held=lambda: held[0], freeze_every=100,
        )  # fmt: skip
        try:
            for jobs, generation, frozen in (
                (99, 1, False),  # not yet grown enough
                (100, 0, False),  # only generation 0 collected: generation 1 holds what it promoted
                (100, 1, True),  # grown by freeze_every since the start
                (199, 1, False),  # since the freeze, 99 more
                (10, 1, False),  # drained: the mark follows it down
                (109, 1, False),
                (110, 1, True),  # grown by freeze_every since the drain
            ):
                held[0], before = jobs, len(freezes)
                await young(generation)
                assert len(freezes) == before + frozen, (jobs, generation, freezes)
            return freezes
        finally:
            stop()

    freezes = asyncio.run(scenario())
    assert len(freezes) == 2 and all(n > 0 for n in freezes), "a freeze counted before it froze anything"


def test_a_scrape_does_not_walk_the_frozen_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting the frozen objects walks every one of them: 0.2 s of the operator's loop at each scrape with
    100,000 pending. A scrape reads the freezes' counter instead."""

    def walked() -> int:
        raise AssertionError("a scrape counted the frozen objects")

    monkeypatch.setattr(gc, "get_freeze_count", walked)
    metrics = Metrics(dict)
    metrics.freezes.inc()
    gc.freeze()
    [family] = [m for m in metrics.registry.collect() if m.name == "gpulane_gc_freezes"]
    assert [s.value for s in family.samples if s.name == "gpulane_gc_freezes_total"] == [1.0]
