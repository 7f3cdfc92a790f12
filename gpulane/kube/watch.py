"""The one watch helper: list, then watch, GpuJobs, and list again when the watch breaks."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from kubernetes import watch

from gpulane.api.resources import GROUP, VERSION
from gpulane.kube.client import Kube

log = logging.getLogger(__name__)


def watch_jobs(
    kube: Kube,
    namespace: str | None,
    selector: str | None,
    deliver: Callable[[str, dict[str, Any]], None],
    stop: threading.Event,
    listed: Callable[[], None] = lambda: None,
) -> None:
    """List, then watch GpuJobs (all namespaces when ``namespace`` is None) until ``stop``; call
    ``deliver(event type, object)`` for each, listing again after an expired version or a dropped
    connection. Runs in a thread: the official client's watch blocks."""
    custom = kube.custom
    if namespace is None:
        lister: Callable[..., Any] = custom.list_cluster_custom_object
        where: tuple[str, ...] = (GROUP, VERSION, "gpujobs")
    else:
        lister, where = custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, "gpujobs")
    options = {"label_selector": selector} if selector else {}
    version: str | None = None
    while not stop.is_set():
        try:
            if version is None:
                items = cast(dict[str, Any], lister(*where, **options))
                version = items["metadata"]["resourceVersion"]
                for obj in items["items"]:
                    deliver("ADDED", obj)
                listed()
            stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                lister, *where, resource_version=version, timeout_seconds=60, **options
            )
            for event in stream:
                version = event["object"]["metadata"]["resourceVersion"]
                deliver(event["type"], event["object"])
                if stop.is_set():
                    return
        except Exception as err:
            log.debug("job watch restarts: %s", err)
            version = None
            time.sleep(0.5)
