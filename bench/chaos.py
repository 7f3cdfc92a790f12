"""Chaos: kill the operator, the bridge or a backend pod at random moments while jobs flow, then check the
brief's promises: no job lost, never more jobs on a lane than its capacity, every job ending in a terminal
phase, and recovery within seconds.

    .venv/bin/python bench/chaos.py [--minutes 3] [--seed 1]

Three kwok lanes and three models (concurrency 1). Jobs arrive two ways: GpuJobs applied like kubectl,
which the bench completes as their executor once they run, and OpenAI calls through ``gpulane bridge``
(its backend is a ``gpulane fake-backend`` on the host, through ``--endpoint``). Every few seconds one
fault: SIGKILL the operator, SIGKILL the bridge (both restarted a moment later; the bridge under the same
replica name, as a crashed container would be), or force-delete a busy lane's backend pod. A watch on the
jobs counts, at every event, the jobs each lane holds (Dispatching or Running). At the end the faults
stop, the arrivals stop, and every job must reach Succeeded, Failed or Cancelled.

It exits non-zero when a promise is broken, so it can gate a release.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import random
import sys
import threading
import time
from typing import Any

import openai
import yaml
from harness import bench_world
from kubernetes import client

from gpulane.api.resources import TERMINAL_PHASES
from gpulane.kube.client import Kube, load_client
from gpulane.kube.watch import watch_jobs
from tests.e2e.operator_support import (
    OPERATOR_NAMESPACE,
    BridgeProcess,
    FakeBackendProcess,
    GpulaneProcess,
)
from tests.e2e.support import wait_until

ACTIVE = ("Dispatching", "Running")
TERMINAL = tuple(TERMINAL_PHASES)
KEY = "sk-chaos-key"


class Ledger:
    """Every job's latest phase and lane as the watch delivers them, and the most any lane held at once."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        self.jobs: dict[str, tuple[str | None, str | None, str | None]] = {}  # name -> (phase, lane, reason)
        self.peak: collections.Counter[str] = collections.Counter()
        self.over: list[str] = []  # descriptions of moments a lane held more than one job
        self.lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=asyncio.run, args=(self._watch(kubeconfig, namespace),), daemon=True).start()

    async def _watch(self, kubeconfig: str, namespace: str) -> None:
        """The project's own watch, on an event loop of its own beside the bench's threads."""
        kube = Kube(await load_client(kubeconfig), namespace)
        task = asyncio.create_task(watch_jobs(kube, namespace, None, self._seen))
        while not self._stop.is_set():
            await asyncio.sleep(0.2)
        task.cancel()
        await kube.close()

    def _seen(self, kind: str, obj: dict[str, Any]) -> None:
        name, status = obj["metadata"]["name"], obj.get("status") or {}
        with self.lock:
            if kind == "DELETED":
                phase, lane, _ = self.jobs.get(name, (None, None, None))
                self.jobs[name] = ("Deleted" if phase not in TERMINAL else phase, lane, "deleted")
            else:
                self.jobs[name] = (status.get("phase"), status.get("lane"), status.get("reason"))
            held = collections.Counter(lane for phase, lane, _ in self.jobs.values() if phase in ACTIVE and lane)
            for lane, n in held.items():
                self.peak[lane] = max(self.peak[lane], n)
                if n > 1:
                    self.over.append(f"{lane} held {n} jobs at {time.strftime('%H:%M:%S')}")

    def stop(self) -> None:
        self._stop.set()


class Restartable:
    """A gpulane process that chaos may kill; ``revive`` starts it again with the same arguments."""

    def __init__(self, proc: GpulaneProcess) -> None:
        self.proc = proc
        self.kills = 0
        self.recoveries: list[float] = []  # seconds from the restart to ready

    def kill(self) -> None:
        self.proc.kill()
        self.kills += 1

    def revive(self) -> None:
        started = time.monotonic()
        self.proc.start()
        self.recoveries.append(time.monotonic() - started)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    with bench_world() as bench:
        world, work = bench.world, bench.work
        lanes = [world.lane(f"chaos{i}") for i in range(3)]
        models = [world.model(f"m{i}", ready_delay="1s", expectedRunSeconds=1) for i in range(3)]
        backend = FakeBackendProcess(bench.cluster, work, "--any-model", "--request-seconds", "0.3").start()
        keys = work / "keys.yaml"
        keys.write_text(yaml.safe_dump({"keys": [{"name": "chaos", "key": KEY, "member": "api", "maxPriority": 100}]}))
        endpoints = [a for m in models for a in ("--endpoint", f"{m}={backend.url}")]
        bridge = Restartable(BridgeProcess(bench.cluster, work, bench.namespace, keys, *endpoints,
                                           "--replica", "chaos", "--lease-seconds", "3"))  # fmt: skip
        bridge.proc.start()
        operator = Restartable(bench.operator)
        ledger = Ledger(str(bench.cluster.kubeconfig), bench.namespace)
        stop = threading.Event()
        counts: collections.Counter[str] = collections.Counter()
        submitted: list[str] = []
        faults: collections.Counter[str] = collections.Counter()

        def submit() -> None:  # GpuJobs as kubectl applies them, about two a second
            i = 0
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    world.job(f"k{i:05d}", rng.choice(models), member=rng.choice("abc"),
                              priority=rng.choice(["batch", "normal", "interactive"]))  # fmt: skip
                    counts["kubectl"] += 1
                    submitted.append(f"k{i:05d}")
                i += 1
                time.sleep(rng.expovariate(2.0))

        def execute() -> None:  # the kubectl jobs' executor: each runs for a moment, then succeeds
            started: dict[str, float] = {}
            while not stop.is_set() or any(p in ACTIVE for p, _, _ in list(ledger.jobs.values())):
                with ledger.lock:
                    running = [n for n, (p, _, _) in ledger.jobs.items() if p == "Running" and n.startswith("k")]
                for name in running:
                    if time.monotonic() - started.setdefault(name, time.monotonic()) > 0.5:
                        with contextlib.suppress(Exception):
                            world.complete(name)
                time.sleep(0.1)

        def call() -> None:  # OpenAI calls through the bridge
            while not stop.is_set():
                api = openai.OpenAI(base_url=f"{bridge.proc.url}/v1", api_key=KEY, max_retries=0, timeout=60)
                try:
                    api.chat.completions.create(model=rng.choice(models), messages=[{"role": "user", "content": "x"}])
                    counts["bridge ok"] += 1
                except openai.APIStatusError as err:  # e.g. 503: its job ended before it ran (BackendLost)
                    counts[f"bridge {err.status_code}"] += 1
                    time.sleep(0.5)
                except openai.APIConnectionError:  # the bridge is down
                    counts["bridge unreachable"] += 1
                    time.sleep(0.5)

        def chaos() -> None:
            while not stop.wait(rng.uniform(3, 8)):
                fault = rng.choice(["operator", "bridge", "pod"])
                faults[fault] += 1
                if fault == "pod":
                    pods = world.core.list_namespaced_pod(OPERATOR_NAMESPACE).items
                    ours = [p for p in pods if (p.metadata.annotations or {}).get("gpulane.io/lane") in lanes]
                    if ours:
                        victim = rng.choice(ours).metadata.name
                        with contextlib.suppress(client.ApiException):
                            world.core.delete_namespaced_pod(victim, OPERATOR_NAMESPACE, grace_period_seconds=0)
                    continue
                target = operator if fault == "operator" else bridge
                target.kill()
                time.sleep(rng.uniform(0.5, 2.0))
                target.revive()

        workers = [threading.Thread(target=f, daemon=True) for f in (submit, call, call, chaos)]
        executor = threading.Thread(target=execute, daemon=True)
        for t in [*workers, executor]:
            t.start()
        time.sleep(args.minutes * 60)
        stop.set()
        for t in workers:
            t.join(timeout=120)
        drain_started = time.monotonic()

        def settled() -> bool:
            with ledger.lock:
                return bool(ledger.jobs) and all(p in (*TERMINAL, "Deleted") for p, _, _ in ledger.jobs.values())

        drained = True
        try:
            wait_until(settled, timeout=args.drain_seconds, what="every job terminal")
        except AssertionError:
            drained = False
        drain = time.monotonic() - drain_started
        executor.join(timeout=10)
        ledger.stop()
        bridge.proc.stop()
        backend.stop()
        created = {j["metadata"]["name"] for j in world.jobs()}
        outcomes = collections.Counter(
            f"{phase}{'/' + reason if reason and phase != 'Succeeded' else ''}"
            for phase, _, reason in ledger.jobs.values()
        )
        stuck = sorted(n for n, (p, _, _) in ledger.jobs.items() if p not in (*TERMINAL, "Deleted"))
        lost = sorted(n for n in submitted if n not in created)  # nobody deletes them but the bench
        result = {
            "minutes": args.minutes,
            "seed": args.seed,
            "jobs_seen": len(ledger.jobs),
            "arrivals": dict(counts),
            "faults": dict(faults),
            "outcomes": dict(outcomes),
            "max_jobs_on_a_lane": max(ledger.peak.values(), default=0),
            "over_capacity": ledger.over[:10],
            "not_terminal_after_drain": stuck[:10],
            "kubectl_jobs_lost": lost,
            "drain_seconds": round(drain, 1),
            "operator_restart_to_ready_s": [round(s, 1) for s in operator.recoveries],
            "bridge_restart_to_ready_s": [round(s, 1) for s in bridge.recoveries],
        }
        result["promises_kept"] = drained and not stuck and not lost and not ledger.over
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--drain-seconds", type=float, default=180.0, help="how long the jobs get to end")
    args = parser.parse_args()
    result = run(args)
    result["machine"] = f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"
    print(json.dumps(result, indent=1))
    sys.exit(0 if result["promises_kept"] else 1)


if __name__ == "__main__":
    main()
