"""Finished jobs and when each is deleted: ``spec.ttlSecondsAfterFinished``, else the GpuPolicy's default
for its source (``ttlSecondsAfterFinished.bridge`` for the bridge's calls, ``.kubectl`` for the rest).

The expiry is fixed when the operator sees the job finished (at its event, or at the rebuild, which sees
every finished job again), from ``status.finishedAt``. What outlives a job is kept elsewhere on purpose:
the lane's dispatch history on the GpuLane, learned load and run times on the GpuModel, and the metrics
in the operator's counters; deleting the job touches none of them."""

from __future__ import annotations

import heapq
import logging

from gpulane.api.contract import API_KEY_LABEL, Body
from gpulane.api.retention import Retention
from gpulane.api.times import parse_time
from gpulane.kube.client import Conflict, Gone
from gpulane.kube.protocol import KubeClient

log = logging.getLogger(__name__)
RETRY_SECONDS = 30.0


class Expiries:
    def __init__(self) -> None:
        self._heap: list[tuple[float, str, str, str]] = []  # (when, namespace, name, uid); stale entries skipped
        self._when: dict[str, float] = {}  # uid -> when it goes, for finished jobs that still exist

    def __len__(self) -> int:
        return len(self._when)

    def finished(self, body: Body, retention: Retention, now: float) -> None:
        """Every event of a finished job: its expiry follows an edited ttlSecondsAfterFinished too."""
        meta, spec = body["metadata"], body.get("spec") or {}
        uid = meta.get("uid", "")
        if meta.get("deletionTimestamp"):
            return
        ttl = retention.seconds(spec.get("ttlSecondsAfterFinished"), API_KEY_LABEL in (meta.get("labels") or {}))
        if ttl is None:
            self._when.pop(uid, None)
            return
        ended = min(parse_time((body.get("status") or {}).get("finishedAt")) or now, now)
        if self._when.get(uid) != ended + ttl:
            self._push(ended + ttl, meta["namespace"], meta["name"], uid)

    def _push(self, when: float, namespace: str, name: str, uid: str) -> None:
        self._when[uid] = when
        heapq.heappush(self._heap, (when, namespace, name, uid))

    def gone(self, uid: str) -> None:
        self._when.pop(uid, None)

    def due(self, now: float) -> list[tuple[str, str, str]]:
        """``(namespace, name, uid)`` of the jobs to delete now, each once."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            when, namespace, name, uid = heapq.heappop(self._heap)
            if self._when.get(uid) == when:
                del self._when[uid]
                out.append((namespace, name, uid))
        return out

    async def delete(self, kube: KubeClient, namespace: str, name: str, uid: str, now: float) -> bool:
        """Delete one due job (only that uid); a failed call is tried again later. True if it was deleted."""
        try:
            await kube.delete_job(namespace, name, uid)
        except (Gone, Conflict):  # deleted already, or a new job under its name: not ours to delete
            return False
        except Exception as err:  # an unreachable or busy apiserver: the job stays until the next try
            log.warning(
                "deleting finished GpuJob %s/%s failed, retrying in %.0fs: %s", namespace, name, RETRY_SECONDS, err
            )
            self._push(now + RETRY_SECONDS, namespace, name, uid)
            return False
        log.info("deleted GpuJob %s/%s: its ttlSecondsAfterFinished passed", namespace, name)
        return True
