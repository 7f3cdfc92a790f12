"""What the web page shows, as the watches last delivered it: every GpuJob, GpuLane, GpuModel and GpuChain, and the
GpuPolicy. One list and watch per kind for the whole server, however many pages are open; a page's stream waits on
``changed`` instead of asking again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpulane.api.contract import Body

KINDS = ("gpujobs", "gpulanes", "gpumodels", "gpuchains", "gpupolicies")


def _key(obj: Body) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


@dataclass
class Kind:
    """One kind's objects. A list that follows a broken watch leaves out what was deleted meanwhile: each object is
    stamped with its list's generation, and those a new list did not bring are dropped once it is complete."""

    objects: dict[str, Body] = field(default_factory=dict)
    stamps: dict[str, int] = field(default_factory=dict)
    generation: int = 0
    listed: bool = False


class Store:
    def __init__(self) -> None:
        self.kinds = {plural: Kind() for plural in KINDS}
        self.version = 0  # one more with each change: a stream recomputes its view only when it moved
        self._changed = asyncio.Event()

    def deliver(self, plural: str, kind: str, obj: Body) -> None:
        """A watch event (ADDED, MODIFIED, DELETED) of ``plural``."""
        store = self.kinds[plural]
        key = _key(obj)
        if kind == "DELETED":
            store.objects.pop(key, None)
            store.stamps.pop(key, None)
        else:
            store.objects[key], store.stamps[key] = obj, store.generation
        self._bump()

    def in_step(self, plural: str, listed: bool) -> None:
        """The watch's state: False before a list that follows a broken watch, True once a list is complete."""
        store = self.kinds[plural]
        if not listed:
            store.generation += 1
            return
        gone = [k for k, stamp in store.stamps.items() if stamp != store.generation]
        for key in gone:
            del store.objects[key], store.stamps[key]
        store.listed = True
        self._bump()

    @property
    def ready(self) -> bool:
        """Every kind listed at least once: before that a page would show an empty cluster."""
        return all(k.listed for k in self.kinds.values())

    def items(self, plural: str) -> list[Body]:
        return list(self.kinds[plural].objects.values())

    def get(self, plural: str, namespace: str, name: str) -> Body | None:
        return self.kinds[plural].objects.get(f"{namespace}/{name}")

    async def wait(self, version: int) -> int:
        """Until the store moves past ``version``; its version then."""
        while self.version == version:
            await self._changed.wait()
        return self.version

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()  # the waiters of this change wake; later ones wait for the next


Watch = Callable[[str, Callable[[str, Body], None], Callable[[bool], None]], Awaitable[None]]


async def follow(store: Store, watch: Watch) -> None:
    """Keep ``store`` in step with the cluster, every kind at once, until cancelled. ``watch(plural, deliver,
    on_state)`` is the one watch helper bound to a client."""

    def watching(plural: str) -> Awaitable[None]:
        return watch(plural, lambda kind, obj: store.deliver(plural, kind, obj), lambda s: store.in_step(plural, s))

    await asyncio.gather(*(watching(plural) for plural in KINDS))
