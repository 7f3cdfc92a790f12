"""Python's cyclic collector with a queue of 100,000 jobs.

A full collection walks every object the operator holds, about fifteen for each job it knows, and holds the
event loop meanwhile: 1.6 s at 100,000 pending on the project's machine, a dispatch waiting behind it. Jobs
arriving in a burst bring one after another (CPython collects in full whenever a quarter more objects have
survived since the last one), and then one more came at a random moment later.

So once a full collection has taken ``FREEZE_AFTER_SECONDS`` or longer, its survivors are frozen
(``gc.freeze``): later collections skip them, and walk only what came after. Frozen objects are still freed
by reference counting when dropped (a job's objects hold no reference cycle); only one in a cycle at the moment
of a freeze that later becomes garbage stays until the process ends: the few calls in flight then, once per
freeze, and a freeze comes only after the heap has grown by a long pause's worth.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

FREEZE_AFTER_SECONDS = 0.1


def time_collections(
    observe: Callable[[int, float], None],
    loop: asyncio.AbstractEventLoop,
    freeze_after: float = FREEZE_AFTER_SECONDS,
    frozen: Callable[[], None] = lambda: None,
) -> Callable[[], None]:
    """Each collection timed by its generation, and given to ``observe`` on ``loop``'s next turn; the survivors
    of a full one that took ``freeze_after`` or longer frozen then too, and ``frozen`` told. Nothing is done inside
    the collector's callback but the clock: it runs wherever an allocation set the collector off, and a metric's
    lock taken there would deadlock against that same metric's holder (prometheus_client's locks are not
    reentrant)."""
    started = 0.0

    def freeze() -> None:
        gc.freeze()
        frozen()

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
            return
        took, generation = time.perf_counter() - started, info["generation"]
        loop.call_soon_threadsafe(observe, generation, took)
        if generation == 2 and took >= freeze_after:
            loop.call_soon_threadsafe(freeze)

    gc.callbacks.append(callback)
    return lambda: gc.callbacks.remove(callback)
