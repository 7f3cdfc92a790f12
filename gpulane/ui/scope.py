"""Who looks at the page, and what of the cluster they may see.

A viewer sees the jobs and chains of their own namespaces in full (a bridge key: its own member's jobs in the
bridge's namespace). Everything else is anonymous load: a hidden job keeps its model, band, tier, phase, lane,
position and times, which the queue and the lanes need, and loses its name, namespace and member. The views are
computed from what ``visible`` returns, never from the store itself, so no view can show more than this allows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpulane.api.contract import Body

HIDDEN = ""  # a hidden job's name and namespace: the views show it as "a job of another namespace"
_KEPT_SPEC = ("model", "priority", "tier", "expectedRunSeconds")
_KEPT_STATUS = ("phase", "position", "positionExact", "estimatedStart", "expectedLane", "lane", "dispatchedAt",
                "startedAt", "finishedAt", "score", "story")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Viewer:
    name: str  # shown on the page: "key film-app", "user alice", "anonymous"
    namespaces: frozenset[str] | None  # seen in full; None: every namespace (a cluster-wide reader)
    members: frozenset[str] | None = None  # only these members' jobs there (a bridge key's); None: all of them

    def sees_namespace(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    def sees_member(self, namespace: str, member: str | None) -> bool:
        if not self.sees_namespace(namespace):
            return False
        if self.members is None:
            return True
        # A trusted key's users count as "<member>/<user>": the key sees them all.
        return member is not None and any(member == m or member.startswith(f"{m}/") for m in self.members)

    def sees(self, job: Body) -> bool:
        return self.sees_member(job["metadata"].get("namespace") or "", (job.get("spec") or {}).get("member"))

    def sees_key(self, key: str) -> bool:
        """Whether a job named ``namespace/name`` in a lane's status is shown (a key's member is not known there:
        only a namespace reader sees such names)."""
        namespace = key.split("/", 1)[0]
        return self.sees_namespace(namespace) and self.members is None


def hidden_job(job: Body) -> Body:
    """A job as anonymous load: what places it in the queue and on a lane, without who or what it is. Its story
    stays only as its load flag (the story names other jobs)."""
    meta, spec, status = job["metadata"], job.get("spec") or {}, dict(job.get("status") or {})
    story = status.get("story")
    status["story"] = None if story is None else {"load": bool(story.get("load"))}
    return {
        "metadata": {"name": HIDDEN, "namespace": HIDDEN, "creationTimestamp": meta.get("creationTimestamp")},
        "spec": {k: spec[k] for k in _KEPT_SPEC if k in spec},
        "status": {k: status[k] for k in _KEPT_STATUS if status.get(k) is not None},
    }


def hidden_lane(lane: Body, viewer: Viewer) -> Body:
    """A lane with the jobs it names cut to what ``viewer`` may see: its running list and dispatch history name
    jobs of every namespace, and its usage entries name members."""
    status = dict(lane.get("status") or {})
    status["running"] = [k if viewer.sees_key(k) else HIDDEN for k in status.get("running") or []]
    history = []
    for record in status.get("history") or []:
        if not viewer.sees_key(record.get("job", "")):
            record = {**record, "job": HIDDEN, "member": None, "changedBy": None}
        history.append(record)
    status["history"] = history
    status["usage"] = [u for u in status.get("usage") or [] if viewer.sees_key(str(u.get("member", "")))]
    status["teamUsage"] = [u for u in status.get("teamUsage") or [] if viewer.sees_namespace(u.get("namespace", ""))]
    status.pop("lastServed", None)
    return {**lane, "status": status}


def visible(
    viewer: Viewer, jobs: list[Body], lanes: list[Body], chains: list[Body], hide: Callable[[Body], Body] = hidden_job
) -> tuple[list[Body], ...]:
    """The jobs, lanes and chains as ``viewer`` may see them: hidden jobs as anonymous load (``hide``: the same for
    every viewer, so a caller may keep its copies), other namespaces' chains left out."""
    shown_jobs = [job if viewer.sees(job) else hide(job) for job in jobs]
    shown_lanes = [hidden_lane(lane, viewer) for lane in lanes]
    shown_chains = [c for c in chains if viewer.sees_namespace(c["metadata"].get("namespace", ""))]
    if viewer.members is not None:  # a chain has one member; a key sees its own
        shown_chains = [c for c in shown_chains if viewer.sees_member(c["metadata"]["namespace"],
                                                                      (c.get("spec") or {}).get("member"))]  # fmt: skip
    return shown_jobs, shown_lanes, shown_chains
