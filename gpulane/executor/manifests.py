"""The executor of GpuJobs applied with kubectl that carry ``spec.request``: gpulane sends the call itself.

It serves only the namespaces it is given (``--execute-namespace``), one watch each: the rights it needs
there (patch GpuJobs and their status, create ConfigMaps) are granted namespace by namespace, never
cluster-wide.

A bridge replica claims a waiting job by writing its executor Lease into the job's annotation, with a
resourceVersion precondition: exactly one replica wins, and the operator fails the job with
``DataPlaneLost`` if that replica dies. When the job runs, the claimant sends the request to the job's
endpoint, stores the answer in a ConfigMap owned by the job (so deleting the job deletes it), and
writes the outcome, with a reference to the ConfigMap, through the executor's contract.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from aiohttp import ClientSession, ClientTimeout

from gpulane.api.contract import EXECUTOR_LEASE, Body
from gpulane.api.resources import API_VERSION, TERMINAL_PHASES
from gpulane.bridge.backends import NoBackend, lane_backend
from gpulane.bridge.calls import CallError, sent_headers
from gpulane.bridge.catalog import Catalog, ServedModel, outgoing
from gpulane.bridge.job_queue import outcome_patch
from gpulane.bridge.results import Chunks, ResultStore
from gpulane.bridge.tickets import TicketError, issues_ticket, settle
from gpulane.core.priority import parse_priority
from gpulane.executor.job_calls import job_call
from gpulane.kube.client import Conflict, Gone, Kube, why, write_outcome
from gpulane.kube.watch import watch_jobs

log = logging.getLogger(__name__)

RESULT_KEY = "response.json"  # a text answer (JSON, as every OpenAI endpoint but audio answers)
BINARY_KEY = "response.bin"  # any other answer, under binaryData
# How long a finished job's uid is remembered: late watch events of it (still showing Running) are ignored.
FORGET_AFTER_SECONDS = 600.0
DRAIN_POLL_SECONDS = 0.2
# A ConfigMap holds at most 1 MiB; leave room for its metadata.
MAX_ANSWER_BYTES = 900 * 1024
# A request is a GpuJob's field: etcd keeps an object under 1.5 MB.
MAX_REQUEST_BYTES = 3 * 1024 * 1024


class Held:
    """An answer already read, streamed to where answers go as the server's own would be."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        for start in range(0, len(self.data), n):
            yield self.data[start : start + n]


class ManifestExecutor:
    def __init__(
        self,
        kube: Kube,
        lease: str,
        endpoints: dict[str, str],
        namespaces: Sequence[str],
        backend_namespace: str | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        results: ResultStore | None = None,
        *,
        models: Callable[[], Awaitable[Catalog]],
    ) -> None:
        self.kube = kube
        self.models = models  # the GpuModels as the bridge serves them: their priorityPassthrough
        self.backend_namespace = backend_namespace or kube.namespace  # where the operator's backend pods are
        self.namespaces = tuple(dict.fromkeys(namespaces))
        self.lease = lease  # our executor Lease, in the bridge's namespace
        self.session: ClientSession | None = None
        self.endpoints = endpoints
        self.max_answer_bytes = max_answer_bytes
        self.results = results  # the results volume, for requests with output: volume
        self._running: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runs: set[asyncio.Task[None]] = set()  # executions in progress (the rest are watches and claims)
        self._claims: dict[str, Body] = {}  # uid -> the latest metadata of a job we claimed that has not run yet
        self.draining = False

    def start(self) -> None:
        self.session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=10))

        def deliver(kind: str, obj: dict[str, Any]) -> None:
            if kind == "DELETED":
                self._claims.pop(obj["metadata"].get("uid", ""), None)
                if self.results is not None:  # its answer file goes with it, as a ConfigMap does with its owner
                    self.results.remove(obj)
            elif (obj.get("spec") or {}).get("request"):
                self._seen(obj)

        for namespace in self.namespaces:
            self._spawn(watch_jobs(self.kube, namespace, None, deliver))
            if self.results is not None:
                self._spawn(self._sweep(namespace))

    @property
    def running(self) -> int:
        return len(self._runs)

    async def drain(self, seconds: float) -> int:
        """Claim nothing new and give back the claims of jobs that have not started (another replica takes
        them), then let running executions finish, up to ``seconds``. Returns how many were still running."""
        self.draining = True
        await asyncio.gather(*(self._unclaim(meta) for meta in list(self._claims.values())))
        deadline = time.monotonic() + seconds
        while self._runs and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        return len(self._runs)

    async def _unclaim(self, meta: Body) -> None:
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": {EXECUTOR_LEASE: None}}}
        with contextlib.suppress(Conflict, Gone):  # it changed (it may run now: then we run it) or is gone
            await self.kube.patch_job(meta["namespace"], meta["name"], patch)

    async def stop(self) -> None:
        for task in [*self._tasks, *self._runs]:
            task.cancel()
        if self.session is not None:
            await self.session.close()

    def _qualified(self) -> str:
        return f"{self.kube.namespace}/{self.lease}"

    def _seen(self, obj: Body) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        phase = status.get("phase")
        if phase in TERMINAL_PHASES or meta.get("deletionTimestamp"):
            self._claims.pop(meta["uid"], None)
            return
        claimed = (meta.get("annotations") or {}).get(EXECUTOR_LEASE)
        ours = claimed == self._qualified()
        if ours and phase != "Running":
            self._claims[meta["uid"]] = meta
        if not claimed and not self.draining:
            self._spawn(self._claim(meta))
        elif ours and phase == "Running" and meta["uid"] not in self._running:
            # By uid: a job deleted and created again under its name is another job, and runs.
            self._claims.pop(meta["uid"], None)
            self._running.add(meta["uid"])
            run = asyncio.create_task(self._run(obj))
            self._runs.add(run)
            run.add_done_callback(self._runs.discard)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep(self, namespace: str) -> None:
        """Answers of jobs deleted while no bridge watched are removed once, at start."""
        assert self.results is not None
        jobs = await self.kube.list_namespaced_jobs(namespace, "")
        removed = self.results.sweep(namespace, {self.results.folder(j["metadata"]).split("/")[1] for j in jobs})
        if removed:
            log.info("removed %d answers of deleted jobs from the results volume: %s", len(removed), removed)

    async def _claim(self, meta: Body) -> None:
        patch = {"metadata": {"resourceVersion": meta["resourceVersion"],
                              "annotations": {EXECUTOR_LEASE: self._qualified()}}}  # fmt: skip
        with contextlib.suppress(Conflict, Gone):  # another replica was first, or the job is gone
            await self.kube.patch_job(meta["namespace"], meta["name"], patch)

    async def _run(self, obj: Body) -> None:
        meta = obj["metadata"]
        try:
            patch = await self._execute(obj)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # whatever went wrong, the job ends: a Running job with no outcome holds its lane
            log.warning("executing %s/%s failed", meta["namespace"], meta["name"], exc_info=True)
            patch = outcome_patch(False, f"the request failed: {why(err)}")
        try:
            await self._write_outcome(meta["namespace"], meta["name"], patch)
        finally:
            # Its outcome is written (or the job is gone): a later Running event of this uid is stale.
            # The uid stays known for as long as events of it may still arrive, then is dropped.
            self._forget_later(meta["uid"])

    def _forget_later(self, uid: str) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(FORGET_AFTER_SECONDS, self._running.discard, uid)

    async def _execute(self, obj: Body) -> list[Body]:
        meta, spec, status = obj["metadata"], obj["spec"], obj.get("status") or {}
        namespace, name = meta["namespace"], meta["name"]
        request = spec["request"]
        try:
            base = self.endpoints.get(spec["model"]) or await lane_backend(
                self.kube, self.backend_namespace, status.get("lane"), spec["model"]
            )
        except NoBackend as err:
            return outcome_patch(False, f"the request was not sent: {err}")
        assert self.session is not None, "start() opens the session"
        if request.get("output") == "volume" and self.results is None:
            return outcome_patch(False, "output: volume, but this bridge has no results volume (--results-dir)")
        try:
            call = job_call(request, spec["model"], MAX_REQUEST_BYTES)
        except (ValueError, CallError) as err:  # the CRD's rule says the same: a job stored before it was
            return outcome_patch(False, f"the request was not sent: {err}")
        served = (await self.models()).models.get(spec["model"]) or ServedModel(spec["model"])
        # The model's filters, useModelName and its passthrough of the job's priority, as the bridge applies them.
        body, target = outgoing(call, served, parse_priority(spec.get("priority")))
        async with self.session.request(
            call.method, base.rstrip("/") + target, data=body or None, headers=sent_headers(call)
        ) as resp:
            content: Chunks = resp.content
            upstream, content_type = resp.status, resp.content_type
            if upstream < 400 and issues_ticket(served.ticket, call.method, target):
                assert served.ticket is not None
                try:  # the lane stays this job's until the server's work is done
                    settled = await settle(self.session, base, served.ticket, await resp.read())
                except TicketError as err:
                    return outcome_patch(False, str(err))
                content, content_type = Held(settled.answer), settled.content_type
            if request.get("output") == "volume":
                assert self.results is not None
                try:
                    stored_file = await self.results.store(obj, content)
                except OSError as err:  # the volume is full, or not writable
                    return outcome_patch(False, f"the answer could not be stored on the results volume: {err}")
                ok = upstream < 400
                result = {"volume": stored_file, "status": upstream, "contentType": content_type}
                return outcome_patch(ok, None if ok else f"the backend answered {upstream}", result)
            answer = bytearray()
            async for chunk in content.iter_chunked(64 * 1024):
                answer += chunk
                if len(answer) > self.max_answer_bytes:
                    return outcome_patch(
                        False, f"the answer is over the limit of {self.max_answer_bytes} bytes; it was not stored"
                    )
        key, stored = answer_entry(bytes(answer))
        # Named after this job's uid too: a job deleted and created again under its name never meets the
        # old one's ConfigMap (collected a moment later through its owner), and create is the only right needed.
        config_map = f"{name[:235]}-result-{meta['uid'][:8]}"
        manifest = {
            "metadata": {"name": config_map, "ownerReferences": [{
                "apiVersion": API_VERSION, "kind": "GpuJob", "name": name, "uid": meta["uid"]}]},
            **stored,
        }  # fmt: skip
        await self.kube.create_config_map(namespace, manifest)
        result = {"configMap": config_map, "key": key, "status": upstream, "contentType": content_type}
        ok = upstream < 400
        return outcome_patch(ok, None if ok else f"the backend answered {upstream}", result)

    async def _write_outcome(self, namespace: str, name: str, patch: list[Body]) -> None:
        await write_outcome(self.kube, namespace, name, patch, log)
        log.info("executed %s/%s: %s", namespace, name, json.dumps(patch[1]["value"]))


def answer_entry(answer: bytes) -> tuple[str, Body]:
    """Where an answer goes in its ConfigMap: text under ``data``, anything else (audio, images) base64
    under ``binaryData``, so that the bytes read back are the bytes the backend sent."""
    try:
        return RESULT_KEY, {"data": {RESULT_KEY: answer.decode("utf-8")}}
    except UnicodeDecodeError:
        return BINARY_KEY, {"binaryData": {BINARY_KEY: base64.b64encode(answer).decode("ascii")}}
