"""Python's cyclic collector with a queue of 100,000 jobs.

A full collection walks every object the operator holds, about fifteen for each job it knows, and holds the
event loop meanwhile: 1.6 s at 100,000 pending on the project's machine, a dispatch waiting behind it. Jobs
arriving in a burst bring one after another (CPython collects in full whenever a quarter more objects have
survived since the last one), and then one more came at a random moment later.

So once a full collection has taken ``FREEZE_AFTER_SECONDS`` or longer, its survivors are frozen
(``gc.freeze``): later collections skip them, and walk only what came after. That alone left the first long
one to come whenever it came: a queue of 20,000 built without one (the young threshold makes full ones rare),
and the first, 0.39 s, fell among dispatches minutes later. So the operator also freezes, right after a young
collection, once it holds ``FREEZE_EVERY_JOBS`` more jobs than at the last freeze: a full collection then walks
at most that many jobs' objects (about 40 ms). Frozen objects are still freed by reference counting when dropped
(a job's objects hold no reference cycle); only one in a cycle at the moment of a freeze that later becomes
garbage stays until the process ends: the few calls in flight then, once per freeze, and a freeze comes only
after the queue or the heap has grown by thousands of jobs or a long pause's worth.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

FREEZE_AFTER_SECONDS = 0.1
FREEZE_EVERY_JOBS = 2_000


def time_collections(
    observe: Callable[[int, float], None],
    loop: asyncio.AbstractEventLoop,
    freeze_after: float = FREEZE_AFTER_SECONDS,
    frozen: Callable[[], None] = lambda: None,
    held: Callable[[], int] = lambda: 0,
    freeze_every: int = FREEZE_EVERY_JOBS,
) -> Callable[[], None]:
    """Each collection timed by its generation, and given to ``observe`` on ``loop``'s next turn; the survivors
    of a full one that took ``freeze_after`` or longer frozen then too, and ``frozen`` told; and after a young one
    (generation 1, which collected generation 0 too), everything frozen if ``held()`` (the jobs the operator holds)
    has grown by ``freeze_every`` since the last freeze. Nothing is done inside the collector's callback but the
    clock: it runs wherever an allocation set the collector off, and a metric's lock taken there would deadlock
    against that same metric's holder (prometheus_client's locks are not reentrant)."""
    started = 0.0
    mark = held()  # the jobs held at the last freeze, or fewer if some have gone since

    def freeze() -> None:
        nonlocal mark
        gc.freeze()
        mark = held()
        frozen()

    def grown() -> None:
        nonlocal mark
        now = held()
        if now - mark >= freeze_every:
            freeze()
        mark = min(mark, now)  # a queue drained and filled again is walked no more than one filled once

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
            return
        took, generation = time.perf_counter() - started, info["generation"]
        loop.call_soon_threadsafe(observe, generation, took)
        if generation == 2 and took >= freeze_after:
            loop.call_soon_threadsafe(freeze)
        elif generation == 1:
            loop.call_soon_threadsafe(grown)

    gc.callbacks.append(callback)
    return lambda: gc.callbacks.remove(callback)
