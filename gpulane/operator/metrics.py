"""Prometheus metrics, fed from the core's decisions. Labels are bands, lanes, namespaces and the top members.

Queue depth and oldest wait are computed when scraped (a collector reads the controller's state),
so keeping them right costs nothing per event.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import Dispatch
from gpulane.core.jobs import Job
from gpulane.core.ranking import MemberLevel
from gpulane.operator.translate import band_name

# Waits run from seconds (interactive) to hours (a film's shots).
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 57600, float("inf"))
LOAD_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, float("inf"))
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, float("inf"))
LAG_BUCKETS = (0.001, *LATENCY_BUCKETS)  # a loop held even a millisecond is worth seeing

# (band label) -> (queue depth, oldest wait in seconds)
QueueSnapshot = Callable[[], dict[str, tuple[int, float]]]


def queue_snapshot(dispatcher: Dispatcher, now: float) -> dict[str, tuple[int, float]]:
    """Per band label, the jobs waiting and the oldest one's wait (the core's summary: a scrape walks no queue)."""
    return {band_name(band, dispatcher.policy): (count, max(0.0, now - first))
            for band, (count, first) in dispatcher.waiting().items()}  # fmt: skip


class _QueueCollector(Collector):
    def __init__(self, snapshot: QueueSnapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily("gpulane_queue_depth", "Jobs waiting, per priority band", labels=["band"])
        oldest = GaugeMetricFamily(
            "gpulane_oldest_wait_seconds", "How long the oldest waiting job of the band has waited", labels=["band"]
        )
        for band, (count, wait) in sorted(self._snapshot().items()):
            depth.add_metric([band], count)
            oldest.add_metric([band], wait)
        yield depth
        yield oldest


TOP_MEMBERS = 20  # members with a gpulane_gpu_seconds_total series of their own


def chargeable(job: Job, usage: dict[MemberLevel, float]) -> str:
    """The member label of a job's GPU seconds: its member if among the top ``TOP_MEMBERS`` by usage, else other."""
    totals: dict[str, float] = {}
    for (who, _band), seconds in usage.items():
        totals[who] = totals.get(who, 0.0) + seconds
    top = heapq.nlargest(TOP_MEMBERS, totals, key=totals.__getitem__)
    return job.member if job.account in top else "other"


class Metrics:
    def __init__(self, snapshot: QueueSnapshot) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.registry.register(_QueueCollector(snapshot))
        self.dispatches = Counter("gpulane_dispatches_total", "Jobs dispatched, per band", ["band"], registry=r)
        self.wait = Histogram(
            "gpulane_wait_seconds", "Submission to dispatch, per band", ["band"], buckets=WAIT_BUCKETS, registry=r
        )
        self.order_changes = Counter(
            "gpulane_order_changes_total",
            "Dispatches whose winner a term changed (aging, affinity, fairShare)",
            ["term"],
            registry=r,
        )
        self.swaps = Counter("gpulane_swaps_total", "Model swaps (a resident model replaced by another)", registry=r)
        self.model_load = Histogram(
            "gpulane_model_load_seconds", "Backend pod creation to Ready", buckets=LOAD_BUCKETS, registry=r
        )
        self.lane_busy = Gauge("gpulane_lane_busy", "Jobs running on the lane", ["lane"], registry=r)
        self.dispatch_latency = Histogram(
            "gpulane_dispatch_latency_seconds",
            "From the event that freed room on a warm lane to the next job's Running write",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.loop_lag = Histogram(
            "gpulane_event_loop_lag_seconds",
            "How late the operator's event loop woke a timer due every 50 ms: what holds the loop delays dispatches",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.forecast = Histogram(
            "gpulane_forecast_seconds",
            "A status pass's forecast, the loop's turns between its slices left out: of the whole queue, or of the "
            "lanes' heads",
            ["scope"],
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.forecast_hold = Histogram(
            "gpulane_forecast_hold_seconds",
            "The longest a status pass's forecast held the event loop at once (its first step forks the dispatcher): "
            "a dispatch arriving then waits",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        self.collections = Histogram(
            "gpulane_gc_pause_seconds",
            "Python's cyclic collections, by generation: each holds the event loop for as long",
            ["generation"],
            buckets=LAG_BUCKETS,
            registry=r,
        )
        # A count, not a gauge of the objects frozen: counting them walks them all (gc.get_freeze_count), 0.2 s of
        # the loop at each scrape with 100,000 pending.
        self.freezes = Counter(
            "gpulane_gc_freezes_total",
            "Times the survivors of a long full collection were frozen out of Python's later collections",
            registry=r,
        )
        self.api_writes = Counter("gpulane_api_writes_total", "Writes to the Kubernetes API", ["kind"], registry=r)
        self.leader = Gauge("gpulane_leader", "1 while this replica leads (the one that writes), else 0", registry=r)
        self.leader_transitions = Counter(
            "gpulane_leader_transitions_total", "Times this replica took the operator's Lease or lost it", registry=r
        )
        self.jobs_expired = Counter(
            "gpulane_jobs_expired_total", "Finished jobs deleted after their ttlSecondsAfterFinished", registry=r
        )
        self.resync_deletions = Counter(
            "gpulane_resync_deletions_total",
            "Objects found deleted by a resync list, with no watch event for it, per kind",
            ["kind"],
            registry=r,
        )
        self.job_failures = Counter(
            "gpulane_job_failures_total", "Jobs failed by gpulane, per reason", ["reason"], registry=r
        )
        # Per team (namespace): what chargeback and a team's dashboard read. Members are the top ones by usage,
        # the rest summed as "other", so that a namespace of thousands of bridge users stays a few series.
        self.gpu_seconds = Counter(
            "gpulane_gpu_seconds_total",
            "GPU seconds held by ended jobs (their load included), per namespace and member (the top members by "
            "fair-share usage, then other); it only grows, unlike the decayed usage fair share ranks by",
            ["namespace", "member"],
            registry=r,
        )
        self.namespace_dispatches = Counter(
            "gpulane_namespace_dispatches_total", "Jobs dispatched, per band and namespace", ["band", "namespace"],
            registry=r,
        )  # fmt: skip
        self.namespace_wait = Counter(
            "gpulane_namespace_wait_seconds_total",
            "Submission to dispatch, summed per band and namespace (divide by the dispatches for the mean)",
            ["band", "namespace"],
            registry=r,
        )
        self.lane_ready = Gauge(
            "gpulane_lane_ready", "1 while the lane's backend serves its model", ["lane"], registry=r
        )

    def dispatched(self, decision: Dispatch) -> None:
        waited, band = max(0.0, decision.at - decision.job.submitted_at), str(decision.band)
        self.dispatches.labels(band).inc()
        self.wait.labels(band).observe(waited)
        namespace = decision.job.team or ""
        self.namespace_dispatches.labels(band, namespace).inc()
        self.namespace_wait.labels(band, namespace).inc(waited)
        for term in decision.changed_by:
            self.order_changes.labels(term).inc()
        if decision.replaces is not None:
            self.swaps.inc()

    def held(self, job: Job, seconds: float, usage: dict[MemberLevel, float]) -> None:
        """A job ended after holding its lane ``seconds``: its namespace and member are charged them."""
        self.gpu_seconds.labels(job.team or "", chargeable(job, usage)).inc(max(0.0, seconds))
