"""Chaos: gpulane as the chart installs it on the real node gpu-0, with the faults production meets, while
jobs flow; an independent checker (bench/checker.py) says whether a promise broke.

    .venv/bin/python bench/chaos.py [--minutes 10 | --rounds 1] [--seed 1] [--profiles before,chart]

The chart runs with its defaults (``--profiles chart``): two operator replicas (one leads through its Lease),
admission by the apiserver's own policies where it serves them (else two webhook replicas), two bridge
replicas; ``before`` is the defaults before issue 39 (the webhook, one bridge replica). Several profiles run
one after the other with the same seed, side by side in one report. Everything runs on gpu-0, and so does
the one lane: gpu-0's GPU, whose backend pod (``gpulane fake-backend``) really serves. Two models, one
mostly, the other now and then (a swap). Jobs arrive two ways: GpuJobs created like kubectl does (the bench
completes them as their executor), and OpenAI calls through the bridge's Service, for the main model.

One fault at a time, in a seeded order that goes through every kind before repeating one. The run lasts
``--minutes``, or with ``--rounds N`` until every kind was injected N times, however long that takes on a
slow machine (the test in ``make test`` runs one round):

- ``leader``: the leading operator's pod deleted with ``--grace-period=0`` (SIGKILL) while a standby runs;
- ``webhook-pod``, ``bridge-pod``, ``backend-pod``: one such pod deleted the same way;
- ``apiserver``, ``etcd``: the process SIGKILLed and started again (``localcluster.restart``);
- ``webhook-outage``: the webhook scaled to 0 for ``--outage-seconds``; creates are refused meanwhile;
  with no webhook installed (admission by policies), the webhook's kinds do not apply and are skipped;
- ``kubelet``, ``containerd``: restarted on gpu-0, if possible while the real lane's pod serves a call.

After each fault the bench waits until a job is dispatched again (at most ``--bound`` seconds), then ``--pause``
seconds more (3 to 6, drawn; the test in ``make test`` takes 1 to 2). Every call and create that went wrong is put
down with the fault in force then (the last one injected before it): refused (a create the cluster refused for
being unavailable, a 429 or 503 to retry, or no bridge to connect to) or failed (taken, then lost: the backend
failed, the connection dropped). At the end the arrivals stop, every job must end, and the operator's metrics must
agree with the API. It prints a JSON report (with the seed) and exits non-zero when a promise broke.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import httpx2
import openai
import yaml
from checker import TERMINAL, Fault, Record, Watcher, metrics_problems
from harness import REPO, machine
from kubernetes import client, config

from tests.e2e.operator_support import World
from tests.e2e.support import Cluster, CommandFailed, localcluster, wait_until

CHART = REPO / "charts" / "gpulane"
KEY = "sk-chaos-key"
SELECTOR = "gpulane.io/chaos"
FAULTS = (
    "leader",
    "webhook-pod",
    "bridge-pod",
    "backend-pod",
    "apiserver",
    "etcd",
    "webhook-outage",
    "kubelet",
    "containerd",
)
ON_THE_NODE = ("kubelet", "containerd")  # wait for the real lane to serve first
# Components no fault targets: if one exits, the bench plays the supervisor a real control plane has.
WEBHOOK_FAULTS = ("webhook-pod", "webhook-outage")
# Values on top of the bench's own: "chart" is the chart's defaults, "before" the defaults before issue 39.
PROFILES: dict[str, dict[str, Any]] = {
    "chart": {},
    "before": {"admission": {"mode": "webhook"}, "bridge": {"replicas": 1}},
}
SUPERVISED = ("kube-scheduler", "kube-controller-manager", "kwok", "coredns", "kube-proxy", "gpu-device-plugin")


def wall(moment: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(moment)) + f"{moment % 1:.1f}"[1:]


class Chaos:
    """The release, its world and the run's threads."""

    def __init__(self, args: argparse.Namespace, profile: str) -> None:
        self.args, self.rng, self.profile = args, random.Random(args.seed), profile
        info = localcluster.up(log=lambda m: print(m, file=sys.stderr))
        if not info.real_node:
            raise SystemExit("the chaos run needs the real node gpu-0; the cluster runs with GPULANE_NODE=kwok")
        self.cluster = Cluster(info, info.started)
        self.api = config.new_client_from_config(config_file=str(self.cluster.kubeconfig))
        self.core, self.apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        tag = uuid.uuid4().hex[:5]
        self.ns, self.release = f"chaos-{tag}", f"chaos-{tag}"
        self.fullname = f"{self.release}-gpulane"
        self.work = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpulane-chaos-{tag}"
        self.work.mkdir(parents=True)
        self.world = World(self.cluster, self.api, self.ns)
        self.record = Record(capacity=lambda lane: 1, slots=1, at=wall)  # one lane, one GPU
        self.stop = threading.Event()
        self.rounds_done = threading.Event()  # --rounds: every kind injected that many times (or chaos gave up)
        self.counts: collections.Counter[str] = collections.Counter()
        self.executor: collections.Counter[str] = collections.Counter()  # outcomes written, or why not
        self.refusals: dict[str, str] = {}  # kind of refusal -> one message, as the client got it
        self.went_wrong: list[tuple[float, str, str]] = []  # (when, "bridge" or "kubectl", "refused" or "failed")
        self.kinds: list[str] = list(args.faults)  # those that apply to the release (install)
        self.created: list[str] = []
        self.created_at: list[float] = []  # when each kubectl create was taken (wall clock, as faults are)
        self.outage: tuple[float, float] | None = None
        self.errors: list[str] = []  # what kept the run from going as planned

    # -- the system ----------------------------------------------------------------------------------

    def install(self) -> None:
        self.cluster.kubectl("apply", "-f", str(REPO / "crds"))
        self.cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")  # the release brings its own
        self.core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=self.ns, labels={SELECTOR: self.ns}))
        )
        values = {
            "operator": {
                "leaderElection": {
                    "leaseSeconds": self.args.lease_seconds,
                    "renewDeadlineSeconds": max(2, self.args.lease_seconds * 2 // 3),
                    "retrySeconds": 1,
                }
            },
            "webhook": {"namespaceSelector": {SELECTOR: self.ns}},
            # The chart's GpuPolicy trusts its bridge; the bench's kubectl jobs come as the admin.
            "policy": {
                "spec": {
                    "admission": {
                        "trusted": {"users": ["gpulane-admin"]},
                        "rules": [{"name": "admins", "users": ["gpulane-admin"], "maxPriority": 100}],
                    }
                }
            },
            "bridge": {
                "enabled": True,
                "executeNamespaces": [self.ns],
                "keys": {"inline": {"keys": [{"name": "chaos", "key": KEY, "member": "api", "maxPriority": 100}]}},
            },
        }
        (values_file := self.work / "values.yaml").write_text(yaml.safe_dump(merged(values, PROFILES[self.profile])))
        started = time.monotonic()
        self.cluster.helm(
            "install", self.release, str(CHART), "-n", self.ns, "-f", str(values_file), "--wait", "--timeout", "180s"
        )
        self.counts["install seconds"] = round(time.monotonic() - started, 1)
        if not self.pods("webhook"):  # admission by the apiserver's policies: nothing of the webhook to fault
            self.kinds = [k for k in self.kinds if k not in WEBHOOK_FAULTS]
        wait_until(
            lambda: self.world.cluster_status("gpupolicies", "default").get("observedGeneration") == 1,
            timeout=60,
            what="the policy in effect",
        )
        # One lane, gpu-0's one GPU: a model cannot be pinned to a lane, so a kwok lane beside it would take
        # calls it cannot serve. Mostly one model, so that the pod is reused; the other forces swaps.
        self.lane = self.world.real_lane()
        self.models = [self.world.real_model(stem, load_seconds=1, expectedRunSeconds=1) for stem in ("main", "other")]
        self.real_model = self.models[0]
        service = self.core.read_namespaced_service(f"{self.fullname}-bridge", self.ns)
        self.bridge_url = f"http://{service.spec.cluster_ip}:8090/v1"
        api = openai.OpenAI(base_url=self.bridge_url, api_key=KEY, max_retries=0, timeout=30)
        wait_until(
            lambda: self.real_model in [m.id for m in api.models.list()],
            timeout=60,
            what="the bridge to list the real model",
        )

    def remove(self) -> None:
        self.world.cleanup()
        self.cluster.helm("uninstall", self.release, "-n", self.ns, "--wait", "--timeout", "120s", check=False)
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            self.cluster.kubectl("delete", kind, self.fullname, "--ignore-not-found", check=False)
        selector = f"app.kubernetes.io/instance={self.release}"
        self.cluster.kubectl(
            "delete", "clusterrolebindings,clusterroles", "-l", selector, "--ignore-not-found", check=False
        )
        self.core.delete_namespace(self.ns)

    def pods(self, component: str) -> list[client.V1Pod]:
        selector = f"app.kubernetes.io/component={component}"  # the backend pods are the operator's, not the chart's
        if component != "backend":
            selector += f",app.kubernetes.io/instance={self.release}"
        return [
            p
            for p in self.core.list_namespaced_pod(self.namespace_of(component), label_selector=selector).items
            if not p.metadata.deletion_timestamp
        ]

    def namespace_of(self, component: str) -> str:
        """The chart puts backend pods in a namespace of their own."""
        return f"{self.ns}-backends" if component == "backend" else self.ns

    def leader(self) -> str:
        lease = client.CoordinationV1Api(self.api).read_namespaced_lease("gpulane-operator", self.ns)
        holder = lease.spec.holder_identity or ""
        return next((p.metadata.name for p in self.pods("operator") if holder.startswith(p.metadata.name)), "")

    # -- arrivals and the executor -------------------------------------------------------------------

    def refused(self, what: str, message: str) -> None:
        kind = "webhook" if "webhook" in message else "apiserver" if "connect" in message.lower() else "other"
        self.counts[f"{what} refused ({kind})"] += 1
        self.refusals.setdefault(f"{what} ({kind})", message.strip().splitlines()[-1][:300])
        self.went_wrong.append((time.time(), what, "refused"))

    def submit(self) -> None:
        """GpuJobs as kubectl creates them."""
        i = 0
        while not self.stop.is_set():
            name = f"k{i:05d}"
            i += 1
            try:
                self.world.job(
                    name,
                    self.rng.choices(self.models, weights=(9, 1))[0],
                    member=self.rng.choice("abc"),
                    priority=self.rng.choice(["batch", "normal", "interactive"]),
                )
            except CommandFailed as err:
                self.refused("kubectl", str(err))
            else:
                self.created.append(name)
                self.created_at.append(time.time())
                self.counts["kubectl created"] += 1
            time.sleep(self.rng.expovariate(self.args.rate))

    def execute(self) -> None:
        """The kubectl jobs' executor: each runs for 0.2 s on the pod (which is not called: the
        bridge's calls are), then succeeds; retried until the outcome is stored."""
        started: dict[str, float] = {}
        while not (self.stop.is_set() and self.drained()):
            with self.record.lock:
                running = [n for n, t in self.record.jobs.items() if t.phase == "Running" and n.startswith("k")]
            for name in running:
                if time.monotonic() - started.setdefault(name, time.monotonic()) > 0.2:
                    try:
                        self.world.complete(name)
                        self.executor["completed"] += 1
                    except Exception as err:  # tried again next time round; the report counts them
                        self.executor[type(err).__name__] += 1
            time.sleep(0.1)

    def call(self) -> None:
        """OpenAI calls through the bridge's Service, for the model on gpu-0."""
        api = openai.OpenAI(base_url=self.bridge_url, api_key=KEY, max_retries=0, timeout=60)
        while not self.stop.is_set():
            try:
                priority = {"X-LlamaSwap-Priority": str(self.rng.choice([0, 50, 100]))}
                self.call_once(api, priority)
                self.counts["bridge ok"] += 1
            except openai.APIStatusError as err:
                self.counts[f"bridge {err.status_code}"] += 1
                self.refusals.setdefault(f"bridge {err.status_code}", str(err)[:300])
                self.went_wrong.append((time.time(), "bridge", call_outcome(err)))
                time.sleep(0.5)
            except openai.APIConnectionError as err:
                # Nothing took the connection (no bridge), or a bridge took it and went away with the call.
                connected = not isinstance(err.__cause__, httpx2.ConnectError | httpx2.ConnectTimeout)
                self.counts["bridge dropped" if connected else "bridge unreachable"] += 1
                self.went_wrong.append((time.time(), "bridge", "failed" if connected else "refused"))
                time.sleep(0.5)

    def call_once(self, api: openai.OpenAI, headers: dict[str, str]) -> None:
        """One call, connected again once if its connection found nobody: a killed bridge pod's address stays
        in kube-proxy's rules for a moment after the pod is gone, and a client tries a new connection (the
        OpenAI clients do, with their default max_retries of 2). Everything else counts at the first try."""
        messages: list[Any] = [{"role": "user", "content": "x"}]
        try:
            api.chat.completions.create(model=self.real_model, messages=messages, extra_headers=headers)
        except openai.APIConnectionError as err:
            if not isinstance(err.__cause__, httpx2.ConnectError | httpx2.ConnectTimeout):
                raise
            self.counts["bridge connected again"] += 1
            time.sleep(0.2)
            api.chat.completions.create(model=self.real_model, messages=messages, extra_headers=headers)

    def drained(self) -> bool:
        with self.record.lock:
            return all(t.phase in TERMINAL or t.deleted for t in self.record.jobs.values())

    # -- faults --------------------------------------------------------------------------------------

    def inject(self, kind: str) -> str:
        if kind in ON_THE_NODE:
            with contextlib.suppress(AssertionError):  # a call is usually in flight; if not, go on anyway
                wait_until(
                    lambda: any(t.lane == self.lane and t.phase == "Running" for t in list(self.record.jobs.values())),
                    timeout=20,
                    what="a call",
                )
        if kind in ("leader", "webhook-pod", "bridge-pod", "backend-pod"):
            # Between two backend pods (a swap) there is none; after an apiserver restart in policy mode the
            # operator's own writes are refused until the apiserver has set up its policies (up to half a
            # minute), and the lane makes no pod meanwhile: wait as long as a recovery may take.
            victim, deadline = "", time.monotonic() + self.args.bound
            while not victim and time.monotonic() < deadline:
                if kind == "leader":
                    victim = self.leader()
                else:
                    pods = self.pods(kind.removesuffix("-pod"))
                    victim = self.rng.choice(pods).metadata.name if pods else ""
                time.sleep(0 if victim else 0.5)
            if victim:
                self.fault(kind, victim)
                space = self.namespace_of(kind.removesuffix("-pod"))
                self.cluster.kubectl(
                    "delete", "pod", victim, "-n", space, "--grace-period=0", "--force", "--wait=false", check=False
                )
            return victim
        if kind == "webhook-outage":
            deployment = f"{self.fullname}-webhook"
            self.fault(kind, deployment)
            started = time.time()
            self.scale(deployment, 0)
            self.stop.wait(self.args.outage_seconds)
            self.outage = (started, time.time())
            self.scale(deployment, 2)
            return deployment
        component = {"apiserver": "kube-apiserver"}.get(kind, kind)
        self.fault(kind, component)
        seconds = localcluster.restart(component, self.cluster.info.state_dir)
        return f"{component}, healthy again after {seconds:.1f}s"

    def fault(self, kind: str, detail: str) -> None:
        with self.record.lock:
            self.record.faults.append(Fault(kind, time.time(), detail))

    def scale(self, deployment: str, replicas: int) -> None:
        self.cluster.kubectl("scale", "deployment", deployment, "-n", self.ns, f"--replicas={replicas}")
        if replicas:
            self.cluster.kubectl("rollout", "status", "deployment", deployment, "-n", self.ns, "--timeout=120s")

    def supervise(self) -> None:
        """A production control plane runs under a supervisor (the kubelet's static pods, systemd) that
        starts a crashed component again; the local cluster has none, so the bench is it. A component that
        the run does not fault (the scheduler, say) and that exited is started again, and counted."""
        while not self.stop.wait(2):
            for component in localcluster.dead(self.cluster.info.state_dir):
                if component in SUPERVISED:
                    print(f"{wall(time.time())} {component} exited; the bench restarts it", file=sys.stderr)
                    self.counts[f"{component} restarted by the bench (it exited)"] += 1
                    localcluster.restart(component, self.cluster.info.state_dir, crash=False)

    def chaos(self) -> None:
        try:
            self.inject_in_rounds()
        finally:
            self.rounds_done.set()

    def inject_in_rounds(self) -> None:
        order: list[str] = []
        rounds = 0
        while not self.stop.wait(self.rng.uniform(*self.args.pause)):
            if not self.kinds:
                continue
            if not order:
                if self.args.rounds and rounds == self.args.rounds:
                    return
                order = self.rng.sample(self.kinds, len(self.kinds))
                rounds += 1
            kind = order.pop()
            try:
                detail = self.inject(kind)
            except Exception as err:  # the run cannot go on as planned: say so in the verdict
                self.errors.append(f"injecting {kind}: {err!r}")
                return
            print(f"{time.strftime('%H:%M:%S')} fault {kind}: {detail}", file=sys.stderr)
            if not detail:
                self.errors.append(f"no target for the fault {kind}")
                continue
            fault = self.record.faults[-1]
            # Until the next dispatch (a missed bound is judged at the end, with the figures), or the end. After
            # an apiserver or etcd restart, also until the cluster takes a create again: in policy mode it refuses
            # creates until it has set its policies up, after the operator dispatches again, and those refusals
            # belong to the restart, not to the next fault's window (by_fault).
            deadline = time.monotonic() + self.args.bound
            while not self.recovered(kind, fault.at) and time.monotonic() < deadline:
                if self.stop.wait(0.2):
                    return

    def recovered(self, kind: str, since: float) -> bool:
        """A job was dispatched since the fault; after a control-plane restart, a create was taken too."""
        dispatched = any(t >= since for t in self.record.dispatch_times)
        return dispatched and (kind not in ("apiserver", "etcd") or any(t >= since for t in self.created_at))

    # -- the verdict ---------------------------------------------------------------------------------

    def metrics_agree(self, within: float = 90.0) -> list[str]:
        """Each operator replica's /metrics against the API, until they agree or ``within`` seconds pass.
        A replica may be restarting at the end (a leader that lost its Lease during an apiserver restart
        exits by design, and its container starts again), so an unreachable one is waited for, not fatal."""
        deadline = time.monotonic() + within
        while True:
            problems = self.compare_metrics()
            if not problems or time.monotonic() >= deadline:
                return problems
            time.sleep(2)

    def compare_metrics(self) -> list[str]:
        replicas: dict[str, str | OSError] = {}
        for pod in self.pods("operator"):
            try:
                with urllib.request.urlopen(f"http://{pod.status.pod_ip}:8080/metrics", timeout=10) as resp:
                    replicas[pod.metadata.name] = resp.read().decode()
            except OSError as err:  # URLError is one: refused while the container starts again
                replicas[pod.metadata.name] = err
        return metrics_problems(replicas, self.world.jobs(), self.lane, self.leader())

    def outage_report(self) -> dict[str, Any]:
        """What went on while the webhook was away: refusals (the clients saw them), dispatches and ends."""
        if self.outage is None:
            return {}
        start, end = self.outage
        with self.record.lock:
            dispatches = sum(1 for t in self.record.dispatch_times if start <= t <= end)
            ended = sum(1 for t in self.record.jobs.values()
                        if any(start <= at <= end and p in TERMINAL for at, p in t.phases))  # fmt: skip
        return {"seconds": round(end - start, 1), "dispatches": dispatches, "jobs_ended": ended}

    def by_fault(self, end: float) -> dict[str, dict[str, Any]]:
        """What went wrong, per path, under each kind of fault (from its injection to the next one's), with how
        long each path refused: from its first refusal to its last in a window, summed over the kind's windows."""
        with self.record.lock:
            faults = sorted(self.record.faults, key=lambda f: f.at)
        windows = [(f.kind, f.at, nxt.at if nxt else end) for f, nxt in zip(faults, [*faults[1:], None], strict=True)]
        if faults:
            windows.insert(0, ("none", 0.0, faults[0].at))
        table: dict[str, dict[str, Any]] = {}
        for kind, start, stop in windows:
            row = table.setdefault(kind, {"injected": 0, "refused seconds": collections.Counter()})
            row["injected"] += kind != "none"
            inside = [(at, path, what) for at, path, what in self.went_wrong if start <= at < stop]
            for _, path, what in inside:
                row[f"{path} {what}"] = row.get(f"{path} {what}", 0) + 1
            for path in ("bridge", "kubectl"):
                times = [at for at, p, what in inside if p == path and what == "refused"]
                if times:
                    row["refused seconds"][path] += round(max(times) - min(times), 1)
        for row in table.values():
            row["refused seconds"] = dict(row["refused seconds"])
        return table

    def keep_logs(self) -> None:
        """The release's logs (each container's and the one before it), to read the report against."""
        selector = f"app.kubernetes.io/instance={self.release}"
        pods = self.cluster.kubectl("get", "pods", "-n", self.ns, "-l", selector, "-o", "name", check=False)
        for pod in pods.stdout.split():
            # One pod at a time: a selector's --previous fails as a whole on the first pod never restarted.
            for previous in ("false", "true"):
                logs = self.cluster.kubectl("logs", "-n", self.ns, pod, "--all-containers", "--prefix",
                                            f"--previous={previous}", check=False)  # fmt: skip
                name = pod.removeprefix("pod/") + ("-previous" if previous == "true" else "")
                (self.work / f"{name}.log").write_text(logs.stdout + logs.stderr)
        print(f"the release's logs are in {self.work}", file=sys.stderr)

    def run(self) -> dict[str, Any]:
        length = f"{self.args.rounds} rounds" if self.args.rounds else f"{self.args.minutes} minutes"
        print(f"chaos run: seed {self.args.seed}, {length}, namespace {self.ns}", file=sys.stderr)
        self.install()
        watcher = Watcher(self.api, self.record, self.ns, self.namespace_of("backend"))
        workers = [
            threading.Thread(target=f, daemon=True)
            for f in (self.submit, self.call, self.call, self.call, self.chaos, self.supervise)
        ]
        executor = threading.Thread(target=self.execute, daemon=True)
        started = time.monotonic()
        for t in [*workers, executor]:
            t.start()
        if self.args.rounds:
            self.rounds_done.wait()
        else:
            self.stop.wait(self.args.minutes * 60)
        self.stop.set()
        for t in workers:
            t.join(timeout=300)
        ran, ended_at = time.monotonic() - started, time.time()
        drain_started = time.monotonic()
        drained = True
        try:
            wait_until(self.drained, timeout=self.args.drain_seconds, what="every job to end")
        except AssertionError:
            drained = False
        drain = time.monotonic() - drain_started
        executor.join(timeout=10)
        metrics = self.metrics_agree()
        self.keep_logs()
        watcher.stop()
        with self.record.lock:
            seen = list(self.record.jobs)
            unfinished = self.record.unfinished([*self.created, *seen])
            recoveries = self.record.recoveries()
            faults = collections.Counter(f.kind for f in self.record.faults)
            # A job deleted before it ended (a caller who went away) is not left unfinished: say so apart.
            outcomes = collections.Counter(
                t.phase if t.phase in TERMINAL or not t.deleted else f"deleted while {t.phase}"
                for t in self.record.jobs.values()
            )
        outage = self.outage_report()
        slow = {kind: s for kind, s in recoveries.items() if max(s) > self.args.bound}
        report = {
            "profile": self.profile,
            "admission": "webhook" if self.pods("webhook") else "policy",
            "bridge_replicas": len(self.pods("bridge")),
            "seed": self.args.seed,
            "minutes": round(ran / 60, 1),
            "jobs": len(seen),
            "arrivals": dict(self.counts),
            "refusals": self.refusals,
            "faults": dict(faults),
            "not_applicable": [k for k in self.args.faults if k not in self.kinds],
            "by_fault": self.by_fault(ended_at),
            "outcomes": dict(outcomes),
            "recovery_s": {
                kind: {"p50": round(statistics.median(s), 1), "max": max(s), "n": len(s)}
                for kind, s in sorted(recoveries.items())
            },
            "recovery_bound_s": self.args.bound,
            "webhook_outage": outage,
            "violations": self.record.broken[:20],
            "unfinished": dict(list(unfinished.items())[:20]),
            "metrics_disagree": metrics,
            "broken_watches": dict(watcher.broken_watches),
            "executor": dict(self.executor),
            "drain_seconds": round(drain, 1),
            "errors": self.errors,
            "logs": str(self.work),
        }
        report["promises_kept"] = drained and not self.record.broken and not unfinished and not metrics and not slow
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument(
        "--rounds", type=int, default=0, help="instead of --minutes: until every kind was injected this many times"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=2.0, help="kubectl jobs per second (Poisson)")
    parser.add_argument("--lease-seconds", type=int, default=6, help="the operators' Lease (leaderElection)")
    parser.add_argument("--outage-seconds", type=float, default=30.0, help="how long the webhook is away")
    parser.add_argument(
        "--pause", type=pause, default=(3.0, 6.0), help="seconds between a recovery and the next fault: MIN,MAX"
    )
    parser.add_argument("--bound", type=float, default=45.0, help="most seconds from a fault to a dispatch")
    parser.add_argument(
        "--faults",
        type=lambda s: [f for f in s.split(",") if f],
        default=list(FAULTS),
        help=f"the kinds, comma-separated (default all: {','.join(FAULTS)}); '' for none",
    )
    parser.add_argument("--keep", action="store_true", help="leave the release installed, to look at it")
    parser.add_argument("--drain-seconds", type=float, default=300.0, help="how long the jobs get to end")
    parser.add_argument(
        "--profiles",
        type=lambda s: [p for p in s.split(",") if p],
        default=["chart"],
        help=f"the release's values, run one after the other: {', '.join(PROFILES)} (default chart)",
    )
    args = parser.parse_args()
    if unknown := set(args.profiles) - set(PROFILES):
        parser.error(f"unknown profiles {sorted(unknown)}: choose from {', '.join(PROFILES)}")
    reports = {}
    for profile in args.profiles:
        chaos = Chaos(args, profile)
        try:
            reports[profile] = chaos.run()
        finally:
            if not args.keep:
                chaos.remove()
    # One profile: its report as it always was; several: side by side.
    report = next(iter(reports.values())) if len(reports) == 1 else {"profiles": reports}
    report["machine"] = machine()
    print(json.dumps(report, indent=1))
    sys.exit(0 if all(r["promises_kept"] for r in reports.values()) else 1)


def pause(text: str) -> tuple[float, float]:
    refused = argparse.ArgumentTypeError(f"{text!r}: MIN,MAX seconds with 0 <= MIN <= MAX")
    low, _, high = text.partition(",")
    try:
        bounds = (float(low), float(high or low))
    except ValueError:
        raise refused from None
    if not 0 <= bounds[0] <= bounds[1]:
        raise refused
    return bounds


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, dictionaries merged key by key (as helm merges values files)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def call_outcome(err: openai.APIStatusError) -> str:
    """A bridge error: "refused" when the call was turned away to retry (the cluster could not take its job,
    a replica draining, a full queue), "failed" when it was taken and then lost."""
    message = str(err)
    if err.status_code == 429 or (
        err.status_code == 503 and ("cannot take the job" in message or "draining" in message)
    ):
        return "refused"
    return "failed"


if __name__ == "__main__":
    main()
