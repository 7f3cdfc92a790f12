"""What the cluster benchmarks share: a local control plane with gpulane's CRDs, the operator as its own
process and a fresh namespace (as the e2e suite runs them), and the statistics they report."""

from __future__ import annotations

import contextlib
import os
import platform
import queue
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpulane.admission.review import finalizers_on_create  # noqa: E402
from tests.e2e.operator_support import API, GROUP, VERSION, OperatorProcess, World  # noqa: E402
from tests.e2e.support import Cluster, localcluster, wait_until  # noqa: E402


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident memory (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def machine() -> str:
    """The machine a figure was measured on, as docs/benchmarks.md records it."""
    return f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, user and system (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_quiet(
    operators: list[OperatorProcess],
    quiet: float = 3.0,
    busy_share: float = 0.05,
    timeout: float = 600.0,
    apiserver_share: float = 0.2,
    machine_share: float = 0.5,
    whole_forecasts: int = 0,
) -> tuple[float, float, bool]:
    """Until the operators have written nothing to the API and used under ``busy_share`` of a core, the
    apiserver under ``apiserver_share`` and the whole machine under ``machine_share`` (etcd, the controllers and
    the bench too), for ``quiet`` seconds, or ``timeout`` passes: a queue's first positions and forecast are done,
    and so is the cluster's digestion of them (at 100,000 GpuJobs the apiserver's garbage collector ran a 3.5 s
    cycle every 7.5 s for a minute after the operator went quiet, at half a core or more), so a timed window
    measures steady dispatches. With ``whole_forecasts``, quiet counts only once the operators have forecast the
    whole queue that many times since the wait began: the first one after a burst rewrites the far positions that
    moved meanwhile, a catch-up a steady queue does not have. Returns the seconds waited, the API writes made
    meanwhile, and whether they went quiet."""
    pids = [o.proc.pid for o in operators if o.proc is not None]
    apiserver = pids_named("kube-apiserver")[:1]

    def machine() -> float:  # CPU seconds the machine has been busy, all cores
        ticks = machine_ticks()
        return (sum(ticks.values()) - ticks["idle"] - ticks["iowait"]) / os.sysconf("SC_CLK_TCK")

    def counters() -> tuple[float, float]:
        """The operators' API writes (a leader's Lease renewals go on all the time: not counted) and their
        forecasts of the whole queue, from one read of each one's /metrics."""
        samples = [(k, v) for o in operators for k, v in o.metrics().items()]
        writes = sum(v for k, v in samples if k.startswith("gpulane_api_writes_total{") and 'kind="lease"' not in k)
        return writes, sum(v for k, v in samples if k == 'gpulane_forecast_seconds_count{scope="queue"}')

    started = time.monotonic()
    first, forecast_first = counters()
    last, cpu, api_cpu, busy = first, sum(map(cpu_seconds, pids)), sum(map(cpu_seconds, apiserver)), machine()
    calm = 0.0
    while calm < quiet:
        if time.monotonic() - started > timeout:
            return time.monotonic() - started, last - first, False
        time.sleep(1.0)
        (now_writes, forecast_now), now_busy = counters(), machine()
        now_cpu, now_api = sum(map(cpu_seconds, pids)), sum(map(cpu_seconds, apiserver))
        still = (
            now_writes == last
            and now_cpu - cpu < busy_share
            and now_api - api_cpu < apiserver_share
            and now_busy - busy < machine_share
        )
        caught_up = forecast_now - forecast_first >= whole_forecasts
        calm = calm + 1.0 if still and caught_up else 0.0
        last, cpu, api_cpu, busy = now_writes, now_cpu, now_api, now_busy
    return time.monotonic() - started, last - first, True


def machine_ticks() -> dict[str, int]:
    """The machine's CPU time so far by state, in clock ticks (the first line of /proc/stat)."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    values = Path("/proc/stat").read_text().splitlines()[0].split()[1 : 1 + len(names)]
    return dict(zip(names, map(int, values), strict=True))


def pids_named(name: str) -> list[int]:
    """The processes whose command name is ``name`` (the local cluster's kube-apiserver, etcd, ...)."""
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if comm.read_text().strip() == name:
                found.append(int(comm.parent.name))
    return found


def create_jobs(world: World, docs: list[dict[str, Any]], threads: int = 16) -> None:
    """GpuJobs created through the API in ``world``'s namespace, from ``threads`` at once: a kubectl process
    would be timed too, and one ``kubectl apply`` of thousands outlasts its timeout. Each carries the operator's
    finalizer, as admission (which the benches do not install) and the bridge create them."""

    def one(doc: dict[str, Any]) -> None:
        if (held := finalizers_on_create(doc["metadata"].get("finalizers") or [])) is not None:
            doc["metadata"]["finalizers"] = held
        world.custom.create_namespaced_custom_object(GROUP, VERSION, world.namespace, "gpujobs", doc)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, docs))


def delete_jobs(world: World, threads: int = 16) -> None:
    """Every GpuJob of ``world``'s namespace deleted from ``threads`` at once, finalizers first: a namespace's
    own deletion removes them one at a time (the apiserver's one delete-collection worker), which took this
    machine up to a quarter of an hour for 5,000 while the next run was being timed."""
    world.strip_finalizers(threads)

    def one(name: str) -> None:
        with contextlib.suppress(client.ApiException):
            world.custom.delete_namespaced_custom_object(GROUP, VERSION, world.namespace, "gpujobs", name)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, [job["metadata"]["name"] for job in world.jobs()]))


@dataclass
class Bench:
    cluster: Cluster
    api: client.ApiClient
    world: World
    operator: OperatorProcess
    namespace: str
    work: Path


@contextlib.contextmanager
def bench_world(*operator_args: str, crds: Path = REPO / "crds") -> Iterator[Bench]:
    """The local control plane (started if none runs), ``crds`` applied (a base commit's, to set its rules
    beside this tree's), the operator running, and a namespace of the bench's own; all but the cluster
    removed afterwards."""
    info = localcluster.up(log=lambda m: print(m, file=sys.stderr))
    cluster = Cluster(info, info.started)
    cluster.kubectl("apply", "-f", str(crds))
    cluster.kubectl("create", "namespace", "gpulane-system", check=False)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    namespace = f"bench-{uuid.uuid4().hex[:5]}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    work = Path(tempfile.mkdtemp(prefix="gpulane-bench-"))
    operator = OperatorProcess(cluster, work, *operator_args).start()
    print(f"operator log: {operator.log_path}", file=sys.stderr)
    world = World(cluster, api, namespace)
    # The bench is its jobs' executor without a Lease: a job Running longer than runLimits.executorGraceSeconds
    # (300 s) would fail NoExecutor, as the blockers of a 100,000-job burst did while it was positioned.
    world.apply({"apiVersion": API, "kind": "GpuPolicy", "metadata": {"name": "default"},
                 "spec": {"runLimits": {"executorGraceSeconds": 0}}})  # fmt: skip
    world.cluster_objects.append(("gpupolicies", "default"))
    try:
        yield Bench(cluster, api, world, operator, namespace, work)
    finally:
        if crds != REPO / "crds":  # this tree's again, however the run ended
            cluster.kubectl("apply", "-f", str(REPO / "crds"))
        operator.stop()  # first: it would answer each job's finalizer coming off, and add one again near the head
        delete_jobs(world)
        world.cleanup()
        core = client.CoreV1Api(api)
        core.delete_namespace(namespace)
        # Deleting thousands of jobs keeps the apiserver and etcd busy for minutes: the next run (a --base
        # round, the next side) must not be timed against it.
        started = time.monotonic()
        wait_until(lambda: namespace not in {n.metadata.name for n in core.list_namespace().items},
                   timeout=900, what=f"namespace {namespace} gone")  # fmt: skip
        print(f"namespace {namespace} gone after {time.monotonic() - started:.0f}s", file=sys.stderr)


class PodWatch:
    """Timestamps (monotonic, as a watch delivers them) of the backend pods' milestones: created, scheduled,
    its container running, Ready, deletion asked, gone. The API's own timestamps have one-second resolution."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.core, self.namespace = client.CoreV1Api(api), namespace
        # By uid: a lane's next pod has the same name as the one before it.
        self.seen: dict[str, dict[str, float]] = {}  # pod uid -> milestone -> first time seen
        self.lanes: dict[str, str] = {}  # pod uid -> its lane
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._rv = self.core.list_namespaced_pod(namespace).metadata.resource_version
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stream = watch.Watch().stream(
                    self.core.list_namespaced_pod, self.namespace, resource_version=self._rv, timeout_seconds=30
                )
                for event in stream:
                    self._note(time.monotonic(), event["type"], event["object"])
            except Exception:
                time.sleep(0.1)

    def _note(self, at: float, kind: str, pod: client.V1Pod) -> None:
        self._rv = pod.metadata.resource_version
        lane = (pod.metadata.annotations or {}).get("gpulane.io/lane")
        if lane is None:
            return
        statuses = (pod.status and pod.status.container_statuses) or []
        conditions = (pod.status and pod.status.conditions) or []
        reached = {
            "added": True,
            "running": any(c.state and c.state.running for c in statuses),
            "ready": any(c.type == "Ready" and c.status == "True" for c in conditions),
            "deleting": pod.metadata.deletion_timestamp is not None,
            "deleted": kind == "DELETED",
        }
        with self._lock:
            self.lanes[pod.metadata.uid] = lane
            marks = self.seen.setdefault(pod.metadata.uid, {})
            for milestone, now in reached.items():
                if now:
                    marks.setdefault(milestone, at)

    def swap_phases(self, lane: str, since: float, until: float) -> dict[str, float] | None:
        """Where a swap's time went, from a job's create (``since``) to its ``Running`` (``until``): the old
        pod's deletion asked, the old pod gone, the new one created, its container running, Ready."""
        with self._lock:
            pods = {uid: dict(m) for uid, m in self.seen.items() if self.lanes.get(uid) == lane}
        old = [m for m in pods.values() if since <= m.get("deleting", -1) <= until and "deleted" in m]
        new = [m for m in pods.values() if since <= m["added"] <= until and "ready" in m]
        if len(old) != 1 or len(new) != 1:
            return None
        (o,), (n,) = old, new
        marks = [since, o["deleting"], o["deleted"], n["added"], n["running"], n["ready"], until]
        names = ["job to delete asked", "old pod stopping", "gone to new pod created", "pod to container running",
                 "container to Ready", "Ready to job Running"]  # fmt: skip
        return {name: b - a for name, a, b in zip(names, marks, marks[1:], strict=False)}

    def stop(self) -> None:
        self._stop.set()


class PhaseWatch:
    """Timestamps (monotonic) of each job's phases as a watch delivers them."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.events: queue.Queue[tuple[float, str, str | None, dict[str, Any]]] = queue.Queue()
        self._stop = threading.Event()
        self.seen = 0  # events taken from the watch so far, the awaited ones included
        rv = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "gpujobs")["metadata"]
        self._rv = rv["resourceVersion"]
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    "gpujobs",
                    resource_version=self._rv,
                    timeout_seconds=30,
                ):
                    obj = event["object"]
                    self._rv = obj["metadata"]["resourceVersion"]
                    phase = (obj.get("status") or {}).get("phase")
                    self.events.put((time.monotonic(), obj["metadata"]["name"], phase, obj))
            except Exception:
                time.sleep(0.1)

    def until(self, test: Any, timeout: float = 30.0) -> tuple[float, str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            at, name, phase, obj = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            self.seen += 1
            if test(name, phase, obj):
                return at, name, obj

    def stop(self) -> None:
        self._stop.set()
