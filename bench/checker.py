"""An independent checker for chaos runs. It watches GpuJobs, backend pods and Events with the official
client only (no gpulane code, so it cannot share a bug with the operator), keeps what it saw, and says
which promise broke:

- every job ends in exactly one terminal phase, and none is lost;
- a lane never holds more active (Dispatching or Running) jobs than it allows, nor two backend pods;
- no job is dispatched twice (once more per time it went back to the queue: ``LoadYielded``, ``LoadLost``);
- dispatching resumes after each fault within a bound.

``Record`` is pure bookkeeping fed with (time, kind, object), so its rules are unit-tested on histories;
``Watcher`` feeds it from the API, re-listing after every broken watch (an apiserver or etcd restart).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

ACTIVE = ("Dispatching", "Running")
TERMINAL = ("Succeeded", "Failed", "Cancelled")
LANE_ANNOTATION = "gpulane.io/lane"
Feed = Callable[[float, str, dict[str, Any]], None]
# The Events of a job the operator put back in the queue before it started: its load yielded to a better job,
# or the pod it waited for was lost (docs/job-lifecycle.md). Each allows one more Dispatched.
BACK_IN_QUEUE = ("LoadYielded", "LoadLost")


@dataclass
class Track:
    """What the checker saw of one job: its phases in order (repeats folded) and its dispatches."""

    phases: list[tuple[float, str]] = field(default_factory=list)
    lane: str | None = None
    dispatched: dict[str, int] = field(default_factory=dict)  # Dispatched Event name -> its count
    requeued: dict[str, int] = field(default_factory=dict)
    deleted: bool = False

    @property
    def phase(self) -> str | None:
        return self.phases[-1][1] if self.phases else None


@dataclass
class Fault:
    kind: str
    at: float  # when it was injected
    detail: str = ""


class Record:
    """The jobs, pods and dispatches seen, and the moments a promise broke, in the order they happened."""

    def __init__(
        self, capacity: Callable[[str], int], slots: int, at: Callable[[float], str] = "{:.1f}".format
    ) -> None:
        self.capacity = capacity  # a lane's most active jobs at once
        self.at = at  # how a moment reads in a report
        self.slots = slots  # all lanes' together: fewer active jobs than this means a GPU could take one
        self.jobs: dict[str, Track] = {}
        self.pods: dict[str, str] = {}  # backend pod -> its lane
        self.dispatch_times: list[float] = []  # moments a job entered Dispatching (or Running unseen)
        self.pending_since: dict[str, float] = {}  # jobs waiting now -> since when (as seen)
        self.waiting_at: list[tuple[float, int, int]] = []  # (moment, jobs waiting, jobs active) after a change
        self.broken: list[str] = []
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self._listing = False

    # -- what the watches deliver --------------------------------------------------------------------

    def job(self, now: float, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        track = self.jobs.setdefault(name, Track())
        if kind == "DELETED":
            track.deleted = True
            self.pending_since.pop(name, None)
            self._waiting(now)
            return
        status = obj.get("status") or {}
        phase, lane = status.get("phase") or "Pending", status.get("lane")
        before = track.phase
        if phase != before:
            if before in TERMINAL:
                self.broken.append(f"{name} went from {before} to {phase} at {self.at(now)}")
            if phase in ACTIVE and before not in ACTIVE:
                self.dispatch_times.append(now)
            track.phases.append((now, phase))
        if lane:
            track.lane = lane
        if phase == "Pending":
            self.pending_since.setdefault(name, now)
        else:
            self.pending_since.pop(name, None)
        self._waiting(now)
        if phase in ACTIVE and lane and not self._listing:
            self._check_jobs(now, lane)

    def _check_jobs(self, now: float, lane: str) -> None:
        held = sorted(n for n, t in self.jobs.items() if t.lane == lane and t.phase in ACTIVE and not t.deleted)
        if len(held) > self.capacity(lane):
            jobs = ", ".join(f"{n} {self.jobs[n].phase}" for n in held)
            self.broken.append(
                f"lane {lane} held {len(held)} active jobs at {self.at(now)} (allows {self.capacity(lane)}): {jobs}"
            )

    def pod(self, now: float, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        lane = (meta.get("annotations") or {}).get(LANE_ANNOTATION)
        if not lane:
            return
        if kind == "DELETED":
            self.pods.pop(meta["name"], None)
            return
        self.pods[meta["name"]] = lane
        if not self._listing:
            self._check_pods(now, lane)

    def _check_pods(self, now: float, lane: str) -> None:
        on_lane = sorted(p for p, lane_of in self.pods.items() if lane_of == lane)
        if len(on_lane) > 1:
            self.broken.append(f"lane {lane} had {len(on_lane)} backend pods at {self.at(now)}: {', '.join(on_lane)}")

    def event(self, now: float, kind: str, obj: dict[str, Any]) -> None:
        involved, reason = obj.get("involvedObject") or {}, obj.get("reason")
        if kind == "DELETED" or involved.get("kind") != "GpuJob" or reason not in ("Dispatched", *BACK_IN_QUEUE):
            return
        track = self.jobs.setdefault(involved["name"], Track())
        counts = track.dispatched if reason == "Dispatched" else track.requeued
        counts[obj["metadata"]["name"]] = max(int(obj.get("count") or 1), 1)
        dispatches, allowed = sum(track.dispatched.values()), 1 + sum(track.requeued.values())
        if dispatches > allowed:
            self.broken.append(f"{involved['name']} was dispatched {dispatches} times at {self.at(now)}")

    def listed(self, now: float, what: str, items: list[dict[str, Any]], feed: Feed) -> None:
        """A (re-)list, taken as one moment: what it no longer holds was deleted while the watch was down,
        and the lanes are checked once it is all in (one item at a time, a new job beside a stale one
        would look like two on a lane)."""
        names = {i["metadata"]["name"] for i in items}
        self._listing = True
        try:
            if what == "pods":
                for gone in [p for p in self.pods if p not in names]:
                    del self.pods[gone]
            elif what == "jobs":
                for name, track in self.jobs.items():
                    if name not in names and track.phases and not track.deleted:
                        self.job(now, "DELETED", {"metadata": {"name": name}})
            for item in items:
                feed(now, "LISTED", item)
        finally:
            self._listing = False
        if what == "pods":
            for lane in set(self.pods.values()):
                self._check_pods(now, lane)
        elif what == "jobs":
            for lane in {t.lane for t in self.jobs.values() if t.lane}:
                self._check_jobs(now, lane)

    def _waiting(self, now: float) -> None:
        active = sum(1 for t in self.jobs.values() if t.phase in ACTIVE and not t.deleted)
        self.waiting_at.append((now, len(self.pending_since), active))

    # -- verdicts ------------------------------------------------------------------------------------

    def unfinished(self, created: Iterable[str]) -> dict[str, str]:
        """Jobs created (by the run's clients) that were never seen or did not end: name -> what was seen."""
        out = {}
        for name in created:
            track = self.jobs.get(name)
            if track is None or not track.phases:
                out[name] = "never seen"
            elif track.phase not in TERMINAL and not track.deleted:
                out[name] = f"still {track.phase}"
        return out

    def recovery(self, fault: Fault) -> float | None:
        """Seconds after the fault that a GPU could have taken a waiting job but none was dispatched: from the
        injection, or the first moment after it that a job waited with a slot free, to the next dispatch.
        None: no job waited with a slot free before the run ended."""

        def idle(waiting: int, active: int) -> bool:
            return waiting > 0 and active < self.slots

        before = [(n, a) for t, n, a in self.waiting_at if t < fault.at]
        if before and idle(*before[-1]):
            since: float | None = fault.at
        else:
            since = next((t for t, n, a in self.waiting_at if t >= fault.at and idle(n, a)), None)
        if since is None:
            return None
        nxt = next((t for t in self.dispatch_times if t >= since), None)
        return None if nxt is None else nxt - since

    def recoveries(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = collections.defaultdict(list)
        for fault in self.faults:
            seconds = self.recovery(fault)
            if seconds is not None:
                out[fault.kind].append(round(seconds, 2))
        return dict(out)


class Watcher:
    """Feeds a ``Record`` from three watches (the namespace's GpuJobs and Events, the backend pods), each on
    its own thread; a broken watch is re-listed after a short pause, so an apiserver restart only delays."""

    def __init__(self, api: client.ApiClient, record: Record, jobs_ns: str, pods_ns: str) -> None:
        self.api, self.record, self.stopping = api, record, threading.Event()
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

        def jobs(**kw: Any) -> Any:
            return custom.list_namespaced_custom_object("gpulane.io", "v1alpha1", jobs_ns, "gpujobs", **kw)

        def pods(**kw: Any) -> Any:
            return core.list_namespaced_pod(pods_ns, label_selector="app.kubernetes.io/component=backend", **kw)

        def events(**kw: Any) -> Any:
            return core.list_namespaced_event(jobs_ns, field_selector="involvedObject.kind=GpuJob", **kw)

        self.broken_watches: collections.Counter[str] = collections.Counter()
        feeds = (("jobs", jobs, record.job), ("pods", pods, record.pod), ("events", events, record.event))
        self.threads = [threading.Thread(target=self._follow, args=feed, daemon=True) for feed in feeds]
        for t in self.threads:
            t.start()

    def _follow(self, what: str, lister: Callable[..., Any], feed: Feed) -> None:
        serialize = self.api.sanitize_for_serialization
        while not self.stopping.is_set():
            try:
                listed = lister(_request_timeout=10)
                items = [i if isinstance(i, dict) else serialize(i) for i in _items(listed)]
                with self.record.lock:
                    self.record.listed(time.time(), what, items, feed)
                version = _resource_version(listed)
                for ev in watch.Watch().stream(lister, resource_version=version, timeout_seconds=30,
                                               _request_timeout=40):  # fmt: skip
                    if self.stopping.is_set():
                        return
                    obj = ev["object"] if isinstance(ev["object"], dict) else serialize(ev["object"])
                    if ev["type"] == "ERROR":
                        break  # 410 Gone and the like: list again
                    with self.record.lock:
                        feed(time.time(), ev["type"], obj)
            except Exception:  # the apiserver is restarting, or a stream broke: list again shortly
                self.broken_watches[what] += 1
                self.stopping.wait(0.5)

    def stop(self) -> None:
        self.stopping.set()


def metrics_problems(replicas: dict[str, str | OSError], jobs: list[dict[str, Any]], lane: str,
                     holder: str) -> list[str]:  # fmt: skip
    """The operator replicas' /metrics (their text, or the error that reading it raised) against the API's
    jobs: exactly one replica leads, the Lease's ``holder``, and the leader's queue depth and ``lane``'s
    busy count are what the API holds."""
    problems, leaders = [], []
    phases = [(j.get("status") or {}) for j in jobs]
    pending = sum(1 for s in phases if s.get("phase", "Pending") == "Pending")
    running = sum(1 for s in phases if s.get("phase") == "Running" and s.get("lane") == lane)
    for name, text in replicas.items():
        if isinstance(text, OSError):
            problems.append(f"{name}: /metrics unreachable: {text}")
            continue
        samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
        if float(samples.get("gpulane_leader", 0)) != 1:
            continue
        leaders.append(name)
        depth = sum(float(v) for k, v in samples.items() if k.startswith("gpulane_queue_depth{"))
        if depth != pending:
            problems.append(f"{name}: queue depth {depth:g}, the API has {pending} pending jobs")
        busy = float(samples.get(f'gpulane_lane_busy{{lane="{lane}"}}', 0))
        if busy != running:
            problems.append(f"{name}: lane {lane} busy {busy:g}, the API has {running}")
    if leaders != [holder]:
        problems.append(f"replicas reporting gpulane_leader 1: {leaders}; the Lease names {holder!r}")
    return problems


def _items(listed: Any) -> list[Any]:
    return list(listed["items"] if isinstance(listed, dict) else listed.items)


def _resource_version(listed: Any) -> str:
    return str(listed["metadata"]["resourceVersion"] if isinstance(listed, dict) else listed.metadata.resource_version)
