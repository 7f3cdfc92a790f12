"""Small builders shared by the unit tests of the core, and the one way they wait for something."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gpulane.core.baselines import make_ranking
from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import JobSubmitted, LaneUpdated
from gpulane.core.jobs import Job, ModelCatalog, ModelSpec
from gpulane.core.policy import Policy


async def until(check: Callable[[], object], what: str, timeout: float = 10) -> None:
    """Yield to the event loop until ``check()`` is true (the write or state that proves the event), or
    fail after ``timeout`` seconds naming ``what`` was awaited."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def until_now(check: Callable[[], object], what: str, timeout: float = 10) -> None:
    """``until`` for code that runs in threads: poll ``check()`` from this thread until it is true."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def dispatcher(
    *,
    lanes: dict[str, str | None] | None = None,
    models: list[ModelSpec] | None = None,
    policy: Policy | None = None,
    ranking: str = "gpulane",
    clock: Clock | None = None,
) -> tuple[Dispatcher, Clock]:
    clock = clock or Clock()
    policy = policy or Policy()
    d = Dispatcher(policy, clock, ModelCatalog(models or []), make_ranking(ranking, policy))
    for lane, resident in (lanes if lanes is not None else {"gpu-0": None}).items():
        d.handle(LaneUpdated(lane, resident=resident))
    return d, clock


def submit(
    d: Dispatcher,
    clock: Clock,
    name: str,
    model: str = "m",
    priority: int = 0,
    tier: str = "free",
    member: str | None = None,
    **extra: object,
) -> list:
    job = Job(name, model, priority, tier, member or name, clock.now, **extra)  # type: ignore[arg-type]
    return d.handle(JobSubmitted(job))


def names(decisions: list) -> list[str]:
    return [d.job.id for d in decisions]
