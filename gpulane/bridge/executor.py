"""The executor of GpuJobs applied with kubectl that carry ``spec.request``: gpulane sends the call itself.

A bridge replica claims a waiting job by writing its executor Lease into the job's annotation, with a
resourceVersion precondition: exactly one replica wins, and the operator fails the job with
``DataPlaneLost`` if that replica dies. When the job runs, the claimant sends the request to the job's
endpoint, stores the answer in a ConfigMap owned by the job (so deleting the job deletes it), and
writes the outcome, with a reference to the ConfigMap, through the executor's contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiohttp import ClientSession, ClientTimeout

from gpulane.api.contract import EXECUTOR_LEASE, Body
from gpulane.api.resources import API_VERSION, TERMINAL_PHASES
from gpulane.bridge.jobs import outcome_patch
from gpulane.kube.client import Conflict, Gone, Kube
from gpulane.kube.watch import watch_jobs

log = logging.getLogger(__name__)

RESULT_KEY = "response.json"
# A ConfigMap holds at most 1 MiB; leave room for its metadata.
MAX_ANSWER_BYTES = 900 * 1024


class ManifestExecutor:
    def __init__(
        self,
        kube: Kube,
        lease: str,
        endpoints: dict[str, str],
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.kube = kube
        self.lease = lease  # our executor Lease, in the bridge's namespace
        self.session: ClientSession | None = None
        self.endpoints = endpoints
        self.max_answer_bytes = max_answer_bytes
        self._running: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=10))

        def deliver(kind: str, obj: dict[str, Any]) -> None:
            if kind != "DELETED" and (obj.get("spec") or {}).get("request"):
                self._seen(obj)

        self._spawn(watch_jobs(self.kube, None, None, deliver))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.session is not None:
            await self.session.close()

    def _qualified(self) -> str:
        return f"{self.kube.namespace}/{self.lease}"

    def _seen(self, obj: Body) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        phase = status.get("phase")
        if phase in TERMINAL_PHASES or meta.get("deletionTimestamp"):
            return
        claimed = (meta.get("annotations") or {}).get(EXECUTOR_LEASE)
        if not claimed:
            self._spawn(self._claim(meta))
        elif claimed == self._qualified() and phase == "Running" and key not in self._running:
            self._running.add(key)
            self._spawn(self._run(obj))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _claim(self, meta: Body) -> None:
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"],
                              "annotations": {EXECUTOR_LEASE: self._qualified()}}}  # fmt: skip
        with contextlib.suppress(Conflict, Gone):  # another replica was first, or the job is gone
            await self.kube.patch_job(meta["namespace"], meta["name"], patch)

    async def _run(self, obj: Body) -> None:
        meta, spec, status = obj["metadata"], obj["spec"], obj.get("status") or {}
        namespace, name = meta["namespace"], meta["name"]
        request = spec["request"]
        base = self.endpoints.get(spec["model"]) or status.get("endpoint")
        try:
            if not base or self.session is None:
                raise RuntimeError("the job runs without an endpoint")
            async with self.session.post(base.rstrip("/") + request["path"], json=request.get("body") or {}) as resp:
                answer = await resp.content.read(self.max_answer_bytes + 1)
                upstream = resp.status
            if len(answer) > self.max_answer_bytes:
                raise RuntimeError(f"the answer is over the limit of {self.max_answer_bytes} bytes; it was not stored")
            config_map = f"{name}-result"
            await self.kube.create_config_map(namespace, {
                "metadata": {"name": config_map, "ownerReferences": [{
                    "apiVersion": API_VERSION, "kind": "GpuJob", "name": name, "uid": meta["uid"]}]},
                "data": {RESULT_KEY: answer.decode(errors="replace")},
            })  # fmt: skip
            result = {"configMap": config_map, "key": RESULT_KEY, "status": upstream}
            ok = upstream < 400
            patch = outcome_patch(ok, None if ok else f"the backend answered {upstream}", result)
        except (TimeoutError, OSError, RuntimeError, Conflict) as err:
            patch = outcome_patch(False, f"the request failed: {err}")
        with contextlib.suppress(Conflict, Gone):
            await self.kube.patch_job_status(namespace, name, patch)
        log.info("executed %s/%s: %s", namespace, name, json.dumps(patch[1]["value"]))
