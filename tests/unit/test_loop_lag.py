"""The event loop's lag probe (``operator/loop_lag.py``): a hold of the loop shows as a late wake-up of that size."""

from __future__ import annotations

import asyncio
import time

from gpulane.operator import loop_lag
from gpulane.operator.metrics import Metrics


def test_a_held_loop_is_recorded_as_late_by_about_the_hold() -> None:
    seen: list[float] = []
    wrote = asyncio.Event()

    def observe(late: float) -> None:
        seen.append(late)
        wrote.set()

    async def recorded(count: int) -> None:
        """Until the probe has written ``count`` samples (a probe that never writes fails here, not by hanging)."""
        while len(seen) < count:
            wrote.clear()
            await asyncio.wait_for(wrote.wait(), timeout=5)

    async def scenario() -> list[float]:
        task = asyncio.create_task(loop_lag.probe(observe, interval=0.02))
        await recorded(3)
        before = len(seen)
        time.sleep(0.2)  # the event under test: something holds the loop (no await)
        await recorded(before + 1)  # the sample the probe writes once the loop is free again
        task.cancel()
        return seen[before:]

    late = asyncio.run(scenario())
    assert late[0] >= 0.15, f"the 200 ms hold was recorded as {late[0] * 1000:.0f} ms late"


def test_the_lag_is_a_histogram_of_the_operators_metrics() -> None:
    metrics = Metrics(dict)
    metrics.loop_lag.observe(0.03)
    [family] = [m for m in metrics.registry.collect() if m.name == "gpulane_event_loop_lag_seconds"]
    counts = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert counts["0.025"] == 0 and counts["0.05"] == 1
