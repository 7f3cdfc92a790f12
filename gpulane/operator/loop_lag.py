"""How late the operator's event loop runs what is due: a probe sleeps a short interval and records by how much it
woke late. Every watch event, write, forecast slice and dispatch shares this one loop, so whatever holds it (a long
pass, a burst of events, a collection of a large heap) delays each dispatch waiting behind it; the histogram says
by how much and how often, beside the apiserver's own latency."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PROBE_SECONDS = 0.05  # twenty samples a second: a hold of tens of milliseconds is seen, at no cost worth counting


async def probe(observe: Callable[[float], None], interval: float = PROBE_SECONDS) -> None:
    while True:
        started = time.monotonic()
        await asyncio.sleep(interval)
        observe(max(0.0, time.monotonic() - started - interval))
