"""The one watch helper: list GpuJobs (or another of gpulane's kinds), then watch them from that list's
version, and list again when the watch breaks. Failed lists back off exponentially with jitter (tenacity), so
a down apiserver is not hammered; ``on_state`` tells the caller whether it is in step (readiness follows the watch)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from kubernetes.aio import watch

from gpulane.api.contract import Body
from gpulane.api.resources import GROUP, VERSION
from gpulane.kube.client import Kube, backoff

log = logging.getLogger(__name__)

# The apiserver ends each watch after this long; the client gives up on a silent one a little later.
WATCH_SECONDS = 60
Deliver = Callable[[str, Body], None]
_KINDS = {"gpujobs": "GpuJobs", "gpulanes": "GpuLanes", "gpumodels": "GpuModels", "gpuchains": "GpuChains",
          "gpupolicies": "GpuPolicies"}  # fmt: skip


async def watch_jobs(
    kube: Kube,
    namespace: str | None,
    selector: str | None,
    deliver: Deliver,
    on_state: Callable[[bool], None] = lambda listed: None,
    *,
    max_backoff: float = 30.0,
    plural: str = "gpujobs",
) -> None:
    """Call ``deliver(event type, object)`` for every GpuJob (all namespaces when ``namespace`` is None;
    ``plural`` names another kind) and every change to one, until cancelled. Each list is delivered as ADDED
    events, after ``on_state(False)`` when it follows a broken watch."""
    kind = _KINDS.get(plural, plural)
    retrying = backoff(log, f"listing {kind} failed", initial=0.5, max_backoff=max_backoff)
    while True:  # a fresh streak of retries after each list that worked
        async for attempt in retrying.copy():
            with attempt:
                version = await _list(kube, plural, namespace, selector, deliver)
        on_state(True)
        try:
            await _watch(kube, plural, namespace, selector, deliver, version)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # expired version, dropped connection, apiserver restart: list again
            log.debug("the %s watch ended (%s); listing again", kind, err)
        on_state(False)


def _lister(kube: Kube, plural: str, namespace: str | None) -> tuple[Callable[..., Any], tuple[str, ...]]:
    if namespace is None:
        return kube.custom.list_cluster_custom_object, (GROUP, VERSION, plural)
    return kube.custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, plural)


async def _list(kube: Kube, plural: str, namespace: str | None, selector: str | None, deliver: Deliver) -> str:
    lister, where = _lister(kube, plural, namespace)
    options = {"label_selector": selector} if selector else {}
    items = await kube.read(lister, *where, **options)
    for obj in items["items"]:
        deliver("ADDED", obj)
    version: str = items["metadata"]["resourceVersion"]
    return version


async def _watch(
    kube: Kube, plural: str, namespace: str | None, selector: str | None, deliver: Deliver, version: str
) -> None:
    """Watch from ``version`` while the apiserver keeps the watch open, resuming from the last event."""
    lister, where = _lister(kube, plural, namespace)
    options = {"label_selector": selector} if selector else {}
    while True:
        async with watch.Watch() as stream:  # type: ignore[no-untyped-call]
            events = stream.stream(
                lister,
                *where,
                resource_version=version,
                timeout_seconds=WATCH_SECONDS,
                allow_watch_bookmarks=True,
                _request_timeout=WATCH_SECONDS + 10,
                **options,
            )
            async for event in events:
                obj = event["object"]
                if event["type"] == "ERROR":
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                version = obj["metadata"]["resourceVersion"]
                if event["type"] != "BOOKMARK":
                    deliver(event["type"], obj)
