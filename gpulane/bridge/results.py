"""Answers stored as files on the results volume (``spec.request.output: volume``), and the endpoint that
streams one back to whoever may read its GpuJob.

A file is ``<dir>/<namespace>/<job>-<uid[:8]>/answer``, written under a temporary name and renamed once
complete, so nobody reads half an answer; its path, size and SHA-256 go on the job's
``status.result.volume``. It is removed when the job is deleted (its TTL, say), as a result ConfigMap is
through its owner. A tenant reads its own answer with ``GET /results/NAMESPACE/JOB`` and a Kubernetes bearer
token: the bridge asks the apiserver who holds the token (TokenReview) and whether they may get that GpuJob
(SubjectAccessReview). Anyone else gets a 403 before any file is looked at.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from kubernetes.aio.client.exceptions import ApiException

from gpulane.api.contract import BRIDGE_AUDIENCE, Body
from gpulane.bridge.calls import CallError, kind_of
from gpulane.kube.client import Gone
from gpulane.kube.protocol import Reviews

log = logging.getLogger(__name__)
ANSWER = "answer"
CHUNK = 1 << 20


class Chunks(Protocol):
    def iter_chunked(self, n: int) -> Any: ...


class ResultStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def folder(meta: Body) -> str:
        return f"{meta['namespace']}/{meta['name']}-{meta['uid'][:8]}"

    async def store(self, job: Body, content: Chunks) -> dict[str, Any]:
        """Stream the answer to its file; returns what ``status.result.volume`` records."""
        relative = f"{self.folder(job['metadata'])}/{ANSWER}"
        target = self.directory / relative
        partial = target.with_name(f".{ANSWER}.partial")
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        try:
            with partial.open("wb") as out:  # each write in a thread: a slow volume must not stall every call
                async for chunk in content.iter_chunked(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    await asyncio.to_thread(out.write, chunk)
            await asyncio.to_thread(partial.replace, target)
        except BaseException:  # a full volume, a backend that broke off: no half answer stays behind
            partial.unlink(missing_ok=True)
            raise
        return {"path": relative, "bytes": size, "sha256": digest.hexdigest()}

    def remove(self, job: Body) -> None:
        meta = job["metadata"]
        if meta.get("uid"):
            shutil.rmtree(self.directory / self.folder(meta), ignore_errors=True)

    def sweep(self, namespace: str, present: set[str]) -> list[str]:
        """Remove the answers of this namespace's jobs that no longer exist (deleted while no bridge ran);
        ``present`` holds the ``<job>-<uid[:8]>`` folders of the jobs listed. Returns what it removed."""
        root = self.directory / namespace
        gone = [p for p in root.iterdir() if p.is_dir() and p.name not in present] if root.is_dir() else []
        for folder in gone:
            shutil.rmtree(folder, ignore_errors=True)
        return [f"{namespace}/{p.name}" for p in gone]

    def path(self, job: Body, relative: str) -> Path | None:
        """The file ``job``'s status names, if it lies inside that job's own folder: a status is not trusted to
        stay there (an executor may write its own job's status, naming another job's answer)."""
        found = (self.directory / relative).resolve()
        own = (self.directory / self.folder(job["metadata"])).resolve()
        return found if found.is_relative_to(own) and found.is_file() else None


class ResultReader:
    """``GET /results/{namespace}/{name}``: the job's answer file, for a caller who may get the job."""

    def __init__(self, kube: Reviews, store: ResultStore) -> None:
        self.kube, self.store = kube, store

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/results/{namespace}/{name}", self.get)

    async def get(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._get(request)
        except ApiException as err:  # the bridge's own rights, or a failing apiserver: say so, not a bare 500
            log.warning("serving a result: the apiserver answered %s %s", err.status, err.reason)
            return _error(502, f"the apiserver refused the bridge's check: {err.status} {err.reason}")

    async def _get(self, request: web.Request) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            return _error(401, "a Kubernetes bearer token is needed (Authorization: Bearer TOKEN)")
        who = await self.kube.authenticate(auth[7:].strip(), BRIDGE_AUDIENCE)
        if who is None:
            return _error(401, f"the token was not accepted: it must be one for audience {BRIDGE_AUDIENCE} "
                          f"(kubectl create token NAME --audience {BRIDGE_AUDIENCE})")  # fmt: skip
        user, groups = who
        if not await self.kube.may_read_jobs(user, groups, namespace, name):
            return _error(403, f"{user} may not get GpuJob {namespace}/{name}")
        try:
            job = await self.kube.get_job(namespace, name)
        except Gone:
            return _error(404, f"GpuJob {namespace}/{name} does not exist")
        volume = ((job.get("status") or {}).get("result") or {}).get("volume") or {}
        found = self.store.path(job, str(volume.get("path", ""))) if volume else None
        if found is None:
            return _error(404, f"GpuJob {namespace}/{name} has no answer on the results volume")
        headers = {"X-Gpulane-Sha256": str(volume.get("sha256", "")), "Content-Type": "application/octet-stream"}
        return web.FileResponse(found, headers=headers)


def _error(status: int, message: str) -> web.Response:
    return web.json_response(CallError(status, message, kind=kind_of(status)).body(), status=status)
