"""Handing GpuJobs and GpuChains to the shard that serves their model (``gpulane/api/shards.py``).

Every shard sees every GpuModel and keeps, for the models of other shards, which shard that is. A job or a
chain in this shard's watch whose model is another shard's is given that shard's label (the label removed for
the default shard): it leaves this watch and enters the other's. A job first gets the condition
``Dispatched=False``, reason ``HandedToShard``, which its shard's operator replaces once it takes it (one that
stays says no operator serves that shard). A job whose model no shard has is this shard's to park, as without
shards (``ModelNotFound`` on its status)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from gpulane.api.conditions import condition
from gpulane.api.contract import Body
from gpulane.api.shards import HANDED_TO_SHARD, SHARD_LABEL, Shard, described, shard_of
from gpulane.kube.client import Gone, backoff
from gpulane.kube.protocol import KubeClient
from gpulane.operator.job_table import JobTable

log = logging.getLogger(__name__)

HANDING_SECONDS = 60.0  # a job's later events within this are its hand-over's own (which retries until it lands)
HANDING_LIMIT = 10_000


class Router:
    def __init__(self, shard: Shard, kube: KubeClient, clock: Callable[[], float],
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:  # fmt: skip
        self.shard = shard
        self.kube, self.clock, self.spawn = kube, clock, spawn
        self.elsewhere: dict[str, str | None] = {}  # GpuModel -> the other shard that serves it
        # What is being handed over, and when: the condition lands before the label, and its own watch event must
        # not hand the job over a second time (it did: two label and two status writes per job in the bench).
        self._handed: dict[tuple[str, str | None], float] = {}  # (uid, shard) -> when

    def model_event(self, kind: str | None, body: Body) -> bool:
        """Note where a GpuModel belongs. True when it is another shard's: this one then serves it no more."""
        name = body["metadata"]["name"]
        if kind == "DELETED" or self.shard.owns(body):
            self.elsewhere.pop(name, None)
            return False
        self.elsewhere[name] = shard_of(body)
        return True

    def hand_over(self, plural: str, body: Body) -> bool:
        """Send a job or chain on to its model's shard if that is another: True if it was."""
        model = (body.get("spec") or {}).get("model")
        if model not in self.elsewhere:
            return False
        target, now = self.elsewhere[model], self.clock()
        key = (str(body["metadata"].get("uid")), target)
        if now - self._handed.get(key, -HANDING_SECONDS) >= HANDING_SECONDS:
            self._handed[key] = now
            self.spawn(self._label(plural, body, target))
        if len(self._handed) > 2 * HANDING_LIMIT:  # forget the ones long gone from this watch
            self._handed = {k: at for k, at in self._handed.items() if now - at < HANDING_SECONDS}
        return True

    def hand_over_parked(self, jobs: JobTable, model: str) -> None:
        """The waiting jobs of a model that went to another shard follow it."""
        for view in jobs.unpark(model):
            jobs.release(view)
            body = {"metadata": {"name": view.name, "namespace": view.namespace, "uid": view.uid},
                    "spec": {"model": model}}  # fmt: skip
            self.hand_over("gpujobs", body)

    async def _label(self, plural: str, body: Body, target: str | None) -> None:
        meta, model = body["metadata"], body["spec"]["model"]
        patch = {"metadata": {"labels": {SHARD_LABEL: target}}}  # null removes it: the default shard's
        message = (f"GpuModel {model} is served by {described(target)}: this job is handed to its operator "
                   f"({SHARD_LABEL}), which writes its status from here; none has yet if this stays")  # fmt: skip
        status = {"conditions": [condition("Dispatched", False, HANDED_TO_SHARD, message, self.clock())]}
        # Until it lands (a restarting apiserver, a 429): no later event of the job hands it over again.
        async for attempt in backoff(log, f"handing {plural} {meta['namespace']}/{meta['name']} over failed",
                                     initial=0.2, max_backoff=10.0):  # fmt: skip
            with attempt:
                try:
                    if plural == "gpujobs":  # first, so that it never lands over what its shard writes
                        await self.kube.patch_job_status(meta["namespace"], meta["name"], {"status": status})
                    await self.kube.patch_namespaced(plural, meta["namespace"], meta["name"], patch)
                except Gone:
                    return
        # No Event: the label and the condition say where it went, and an Event would be one more write for every
        # job created outside its shard (docs/benchmarks.md).
        log.debug("%s/%s/%s: GpuModel %s is served by %s", plural, meta["namespace"], meta["name"], model,
                  described(target))  # fmt: skip
