"""Finished jobs and etcd: a run of N bridge-like calls (GpuJobs labelled as the bridge labels its calls),
once with the GpuPolicy's ttlSecondsAfterFinished.bridge set and once with it -1 (kept forever), on the
same cluster, one after the other. It samples the apiserver's count of stored GpuJobs
(``apiserver_resource_objects``) and etcd's database file (``apiserver_storage_size_bytes``), and etcd's
live data, compacted, before and after each side (``etcd_mvcc_db_total_size_in_use_in_bytes``).

    .venv/bin/python bench/retention.py [--calls 10000] [--ttl 30] [--lanes 4] [--concurrency 16]

The bench is the callers and the executor: it keeps ``--in-flight`` calls waiting, and completes each job
as soon as the operator writes it Running (kwok lanes; the model serves ``--concurrency`` jobs at once).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import re
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harness import PhaseWatch, bench_world
from kubernetes import client

from gpulane.api.contract import API_KEY_LABEL
from gpulane.api.retention import KEEP
from tests.e2e.operator_support import API, GROUP, VERSION
from tests.e2e.support import wait_until

METRICS = {
    "jobs": re.compile(r'^apiserver_resource_objects\{group="gpulane.io",resource="gpujobs"\} (\S+)$', re.M),
    "etcd_bytes": re.compile(r"^apiserver_storage_size_bytes\{[^}]*\} (\S+)$", re.M),
}


def etcd_in_use(bench: Any) -> float:
    """etcd's live data after a compaction to its current revision (what the apiserver does every 5
    minutes anyway): ``etcd_mvcc_db_total_size_in_use_in_bytes``. Unlike the database file, a high-water
    mark that only a defragmentation shrinks, this falls when objects are deleted."""
    url = f"http://127.0.0.1:{bench.cluster.info.ports.etcd_client}"

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
        return answer

    revision = int(post("/v3/maintenance/status", {})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as resp:
        found = re.search(r"^etcd_mvcc_db_total_size_in_use_in_bytes (\S+)$", resp.read().decode(), re.M)
    if found is None:
        raise RuntimeError(f"etcd at {url} reports no etcd_mvcc_db_total_size_in_use_in_bytes")
    return float(found[1])


def sample(bench: Any) -> dict[str, float]:
    """The apiserver's metrics (its object count lags by up to a minute), and the exact count of the
    namespace's GpuJobs from a one-item list (``remainingItemCount``)."""
    text = bench.cluster.kubectl("get", "--raw", "/metrics").stdout
    found = {k: pattern.search(text) for k, pattern in METRICS.items()}
    listed = client.CustomObjectsApi(bench.api).list_namespaced_custom_object(
        GROUP, VERSION, bench.namespace, "gpujobs", limit=1
    )
    count = len(listed["items"]) + int(listed["metadata"].get("remainingItemCount") or 0)
    return {"listed": float(count), **{k: float(m[1]) for k, m in found.items() if m}}


def side(bench: Any, calls: int, ttl: int | None, args: argparse.Namespace) -> dict[str, Any]:
    api, world, namespace = bench.api, bench.world, bench.namespace
    tag = "keep" if ttl is None else f"ttl{ttl}"
    kept = KEEP if ttl is None else ttl  # a null would be pruned, and the default (an hour) applied
    policy = {"ttlSecondsAfterFinished": {"bridge": kept}, "runLimits": {"executorGraceSeconds": 0}}
    world.apply({"apiVersion": API, "kind": "GpuPolicy", "metadata": {"name": "default"}, "spec": policy})
    wait_until(lambda: world.cluster_status("gpupolicies", "default").get("observedGeneration"), what="policy")
    model = world.model(f"calls-{tag}", ready_delay="0s", maxConcurrency=args.concurrency)
    custom = client.CustomObjectsApi(api)
    watcher = PhaseWatch(api, namespace)
    samples: list[dict[str, float]] = []
    stop = threading.Event()
    slots = threading.Semaphore(args.in_flight)
    completed = threading.Semaphore(0)
    pool = ThreadPoolExecutor(16)

    def sampler() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            try:
                samples.append({"t": round(time.monotonic() - t0, 1), **sample(bench)})
            except Exception as err:  # one lost sample is a gap in the curve, not the end of the run
                print(f"sample failed: {err}", file=sys.stderr)
            stop.wait(args.sample_seconds)

    def executor() -> None:  # completes each job once, as soon as it runs, and frees a caller's slot
        seen: set[str] = set()
        while not stop.is_set():
            try:
                _, name, _ = watcher.until(lambda n, p, o: p == "Running" and n not in seen, timeout=1)
            except queue.Empty:
                continue
            seen.add(name)
            pool.submit(finish, name)

    def finish(name: str) -> None:
        world.complete(name)
        slots.release()
        completed.release()

    def create(i: int) -> None:
        doc = world.job_doc(f"{tag}-{i:05d}", model, priority="interactive", member=f"u{i % 20}")
        doc["metadata"]["labels"] = {API_KEY_LABEL: "bench"}
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpujobs", doc)

    in_use_before = etcd_in_use(bench)
    for target in (sampler, executor):
        threading.Thread(target=target, daemon=True).start()
    started = time.monotonic()
    for i in range(calls):
        slots.acquire()
        pool.submit(create, i)
    for _ in range(calls):
        if not completed.acquire(timeout=120):
            raise SystemExit("no job completed for 120 s; see the operator's log")
    ran = time.monotonic() - started
    if ttl is not None:  # every finished job past its TTL, then the operator's tick
        wait_until(lambda: not custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "gpujobs")["items"],
                   timeout=ttl + 300, what="every finished call deleted")  # fmt: skip
    time.sleep(args.sample_seconds * 2)
    stop.set()
    watcher.stop()
    pool.shutdown(wait=True)
    in_use = [in_use_before, etcd_in_use(bench)]
    return {"ttl": ttl, "calls": calls, "run_seconds": round(ran, 1), "etcd_in_use_bytes": in_use, "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--ttl", type=int, default=30)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16, help="jobs each lane's model runs at once")
    parser.add_argument("--in-flight", type=int, default=200, help="calls waiting at any time")
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    args = parser.parse_args()
    with bench_world() as bench, contextlib.ExitStack() as undo:
        undo.callback(bench.cluster.kubectl, "delete", "gpupolicy", "default", "--ignore-not-found")
        for i in range(args.lanes):
            bench.world.lane(f"lane{i}")
        sides = []
        for ttl in (args.ttl, None):
            result = side(bench, args.calls, ttl, args)
            first, last = result["samples"][0], result["samples"][-1]
            peak = max(s.get("listed", 0) for s in result["samples"])
            mib = [s.get("etcd_bytes", 0) / 2**20 for s in (first, last)]
            live = [b / 2**20 for b in result["etcd_in_use_bytes"]]
            print(f"ttl={ttl}: {args.calls} calls in {result['run_seconds']} s; GpuJobs stored: peak {peak:.0f}, "
                  f"end {last.get('listed', 0):.0f}; etcd file {mib[0]:.1f} -> {mib[1]:.1f} MiB, "
                  f"in use (compacted) {live[0]:.1f} -> {live[1]:.1f} MiB", flush=True)  # fmt: skip
            print(json.dumps(result), flush=True)
            sides.append(result)
            # --wait=false, then wait here: kubectl's own wait over 10,000 deletions outlived them all (2026-12-03).
            bench.cluster.kubectl("delete", "gpujobs", "--all", "-n", bench.namespace, "--wait=false", timeout=600)
            wait_until(lambda: not sample(bench)["listed"], timeout=1800, what="the side's jobs deleted")
        print(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(), "calls": args.calls}))


if __name__ == "__main__":
    main()
