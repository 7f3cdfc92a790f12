"""Deletions no watch reports.

The rebuild reads the cluster, then kopf's watches list it again and stream changes from there. An
object deleted between the two reads, or while a watch lists again after it expired, is never reported
DELETED: the operator would keep a GpuLane that is gone and dispatch to it (each job failing with
BackendLost), serve a deleted GpuModel, or trust a node or a backend pod that no longer exists. Jobs are
safe: they hold the operator's finalizer. A resync lists the other kinds again and treats whatever is
missing as deleted. Only what the operator knew before it asked counts: an object seen since may be
newer than the list.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from gpulane.api.backend_pods import PodState
from gpulane.api.contract import BACKEND_SELECTOR, Body
from gpulane.api.shards import Shard
from gpulane.kube.client import why
from gpulane.kube.protocol import KubeClient
from gpulane.operator.observed import Observed

log = logging.getLogger(__name__)

KINDS = ("gpupolicies", "gpumodels", "nodes", "gpulanes", "pods")
FIRST_ROUNDS = (0.5, 5.0)  # seconds after the rebuild, then every resync period
RETRY_SECONDS = 5.0


class Sightings:
    """The uid of every object of ``KINDS`` the operator knows, by kind and name (pods: backend pods only)."""

    def __init__(self) -> None:
        self._known: dict[str, dict[str, str]] = {kind: {} for kind in KINDS}

    def note(self, kind: str, event: str | None, body: Body) -> None:
        meta = body.get("metadata") or {}
        known = self._known[kind]
        if event == "DELETED":
            if meta.get("uid") in (None, known.get(meta.get("name", ""))):  # not one created again since
                known.pop(meta.get("name", ""), None)
        else:
            known[meta.get("name", "")] = meta.get("uid", "")

    def known(self, kind: str) -> dict[str, str]:
        return dict(self._known[kind])

    def vanished(self, kind: str, before: dict[str, str], listed: Iterable[Body]) -> list[tuple[str, str]]:
        """``(name, uid)`` of what was known ``before`` the list, is not in it, and is still known as such."""
        present = {((b.get("metadata") or {}).get("name"), (b.get("metadata") or {}).get("uid", "")) for b in listed}
        known = self._known[kind]
        return [(name, uid) for name, uid in before.items() if (name, uid) not in present and known.get(name) == uid]


@dataclass(frozen=True)
class Ports:
    """What the resync lists and knows, and where what it finds gone goes: each kind's handler, as for a DELETED
    event (a backend pod's: ``pod_gone``); the controller builds it once."""

    kube: KubeClient
    shard: Shard  # lists only this shard's lanes and pods
    observed: Observed  # read: the backend pods
    sightings: Sightings
    deleted: Mapping[str, Callable[[str | None, Body], None]]  # kind -> its watch event's handler
    pod_gone: Callable[[PodState], None]


def _listers(ports: Ports) -> dict[str, Callable[[], Awaitable[list[Body]]]]:
    kube, shard = ports.kube, ports.shard
    return {
        "gpupolicies": lambda: kube.list_cluster("gpupolicies"),
        "gpumodels": lambda: kube.list_cluster("gpumodels"),
        "nodes": kube.list_nodes,
        "gpulanes": lambda: kube.list_cluster("gpulanes", shard.selector),
        "pods": lambda: kube.list_pods(f"{BACKEND_SELECTOR},{shard.selector}"),
    }


def _forget(ports: Ports, kind: str, name: str, uid: str) -> None:
    body: Body = {"metadata": {"name": name, "uid": uid}}
    if kind == "pods":
        ports.sightings.note(kind, "DELETED", body)
        for state in [s for s in ports.observed.pods.values() if s.uid == uid]:
            ports.pod_gone(state)
        return
    ports.deleted[kind]("DELETED", body)


async def resync(ports: Ports) -> list[tuple[str, str]]:
    """One pass over ``KINDS``: what was gone without a DELETED event is deleted now. Returns it, as
    ``(kind, name)``."""
    gone: list[tuple[str, str]] = []
    for kind, lister in _listers(ports).items():
        before = ports.sightings.known(kind)
        listed = await lister()
        for name, uid in ports.sightings.vanished(kind, before, listed):
            log.warning("%s %s is gone, and no watch event said so: it is deleted now", kind, name)
            _forget(ports, kind, name, uid)
            gone.append((kind, name))
    return gone


async def run(ports: Ports, every: float, found: Callable[[str], None], synced: Callable[[], None]) -> None:
    """Resync after the rebuild, once the watches have listed (they start as the rebuild ends and list
    within milliseconds), once more for a watch the apiserver was slow to answer, then every ``every``
    seconds: a watch that lists again after it expired loses deletions too. ``found`` is called with the
    kind of each object found gone; ``synced`` after the first round that succeeds (until then what the
    operator knows may still hold what was deleted while it started). A failed round is tried again."""
    delays = iter(FIRST_ROUNDS)
    delay, first = next(delays), True
    while True:
        await asyncio.sleep(min(delay, every))
        try:
            gone = await resync(ports)
        except Exception as err:  # an apiserver away now is one missed round, not a dead loop
            delay = RETRY_SECONDS
            log.warning("resync failed (%s); next in %.0fs", why(err), min(delay, every))
            continue
        for kind, _name in gone:
            found(kind)
        if first:
            synced()
            first = False
        delay = next(delays, every)
