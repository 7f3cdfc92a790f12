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
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from gpulane.api.backend_pods import PodState
from gpulane.api.contract import BACKEND_SELECTOR, Body
from gpulane.kube.client import why
from gpulane.kube.protocol import KubeClient
from gpulane.operator.observed import Observed
from gpulane.operator.shards import Router

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


class Host(Protocol):
    kube: KubeClient
    observed: Observed
    sightings: Sightings
    router: Router

    def policy_event(self, kind: str | None, body: Body) -> None: ...
    def model_event(self, kind: str | None, body: Body) -> None: ...
    def node_event(self, kind: str | None, body: Body) -> None: ...
    def lane_event(self, kind: str | None, body: Body, *, online: bool = True) -> None: ...
    def pod_gone(self, state: PodState) -> None: ...


def _listers(host: Host) -> dict[str, Callable[[], Awaitable[list[Body]]]]:
    kube, shard = host.kube, host.router.shard
    return {
        "gpupolicies": lambda: kube.list_cluster("gpupolicies"),
        "gpumodels": lambda: kube.list_cluster("gpumodels"),
        "nodes": kube.list_nodes,
        "gpulanes": lambda: kube.list_cluster("gpulanes", shard.selector),
        "pods": lambda: kube.list_pods(f"{BACKEND_SELECTOR},{shard.selector}"),
    }


def _forget(host: Host, kind: str, name: str, uid: str) -> None:
    body: Body = {"metadata": {"name": name, "uid": uid}}
    if kind == "pods":
        host.sightings.note(kind, "DELETED", body)
        for state in [s for s in host.observed.pods.values() if s.uid == uid]:
            host.pod_gone(state)
        return
    handler = {
        "gpupolicies": host.policy_event,
        "gpumodels": host.model_event,
        "nodes": host.node_event,
        "gpulanes": host.lane_event,
    }[kind]
    handler("DELETED", body)


async def resync(host: Host) -> list[tuple[str, str]]:
    """One pass over ``KINDS``: what was gone without a DELETED event is deleted now. Returns it, as
    ``(kind, name)``."""
    gone: list[tuple[str, str]] = []
    for kind, lister in _listers(host).items():
        before = host.sightings.known(kind)
        listed = await lister()
        for name, uid in host.sightings.vanished(kind, before, listed):
            log.warning("%s %s is gone, and no watch event said so: it is deleted now", kind, name)
            _forget(host, kind, name, uid)
            gone.append((kind, name))
    return gone


async def run(host: Host, every: float, found: Callable[[str], None], synced: Callable[[], None]) -> None:
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
            gone = await resync(host)
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
