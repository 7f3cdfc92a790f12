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


def test_a_long_full_collection_freezes_its_survivors_on_the_loops_next_turn() -> None:
    async def scenario(freeze_after: float) -> int:
        stop = collector.time_collections(lambda g, s: None, asyncio.get_running_loop(), freeze_after)
        try:
            gc.collect(2)  # the event under test
            assert gc.get_freeze_count() == 0, "frozen inside the collector's callback"
            await after_queued()  # the freeze, if the collection asked for one, has run
            return gc.get_freeze_count()
        finally:
            stop()

    assert asyncio.run(scenario(freeze_after=0.0)) > 0, "a full collection as long as the bound froze nothing"
    gc.unfreeze()
    assert asyncio.run(scenario(freeze_after=60.0)) == 0, "a short full collection froze its survivors"


def test_the_frozen_count_is_a_gauge_of_the_operators_metrics() -> None:
    metrics = Metrics(dict)

    def frozen() -> float:
        [family] = [m for m in metrics.registry.collect() if m.name == "gpulane_gc_frozen_objects"]
        return family.samples[0].value

    gc.freeze()
    assert frozen() > 0
    gc.unfreeze()
    assert frozen() == 0
