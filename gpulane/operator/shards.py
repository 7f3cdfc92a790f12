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

from gpulane.api.contract import Body
from gpulane.api.shards import HANDED_TO_SHARD, SHARD_LABEL, Shard, described, shard_of
from gpulane.kube.client import Gone, Kube
from gpulane.operator.job_table import JobTable
from gpulane.operator.translate import condition

log = logging.getLogger(__name__)


class Router:
    def __init__(self, shard: Shard, kube: Kube, clock: Callable[[], float],
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:  # fmt: skip
        self.shard = shard
        self.kube, self.clock, self.spawn = kube, clock, spawn
        self.elsewhere: dict[str, str | None] = {}  # GpuModel -> the other shard that serves it

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
        self.spawn(self._label(plural, body, self.elsewhere[model]))
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
        try:
            if plural == "gpujobs":  # first, so that it never lands over what the shard writes once it has it
                message = (
                    f"GpuModel {model} is served by {described(target)}: this job is handed to its operator "
                    f"({SHARD_LABEL}), which writes its status from here; none has yet if this stays"
                )
                status = {"conditions": [condition("Dispatched", False, HANDED_TO_SHARD, message, self.clock())]}
                await self.kube.patch_job_status(meta["namespace"], meta["name"], {"status": status})
            await self.kube.patch_namespaced(plural, meta["namespace"], meta["name"], patch)
        except Gone:
            return
        # No Event: the label and the condition say where it went, and an Event would be one more write for every
        # job created outside its shard (docs/benchmarks.md).
        log.debug("%s/%s/%s: GpuModel %s is served by %s", plural, meta["namespace"], meta["name"], model,
                  described(target))  # fmt: skip
