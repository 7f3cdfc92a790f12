"""Admission latency: GpuJob creates through gpulane's webhook, against creates that skip it, side by side.

    .venv/bin/python bench/admission.py [--jobs 500] [--concurrency 50] [--rounds 4]

Starts the local control plane if none runs, applies crds/, runs ``gpulane webhook`` as its own process
and installs its configurations for one namespace only. Each round creates ``--jobs`` GpuJobs from
``--concurrency`` threads in the webhook's namespace, then as many in a namespace the webhook does
not select; rounds alternate so that a drifting host affects both alike. Every create is timed by the
client, as a user feels it: the webhook's share is the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import REPO
from kubernetes import client, config

from gpulane.admission.configuration import webhook_configurations
from gpulane.core.sim.report import percentile  # the one percentile definition (type 7)
from tests.e2e.operator_support import GROUP, VERSION, WebhookProcess, World
from tests.e2e.support import Cluster, localcluster, make_serving_cert


def create_all(custom: client.CustomObjectsApi, namespace: str, model: str, jobs: int, threads: int) -> list[float]:
    def one(i: int) -> float:
        doc = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GpuJob",
            "metadata": {"name": f"b{uuid.uuid4().hex[:10]}", "namespace": namespace},
            "spec": {"model": model, "priority": 1000 if i % 2 else "batch"},
        }
        t0 = time.perf_counter()
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpujobs", doc)
        return time.perf_counter() - t0

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(jobs)))


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "p99_ms": round(percentile(samples, 99) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    info = localcluster.up(log=lambda m: print(m, file=sys.stderr))
    cluster = Cluster(info, info.started)
    cluster.kubectl("apply", "-f", str(REPO / "crds"))
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.configuration.connection_pool_maxsize = args.concurrency
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    tag = f"b{uuid.uuid4().hex[:6]}"
    hooked, plain = f"bench-hooked-{tag}", f"bench-plain-{tag}"
    for name, labels in ((hooked, {"gpulane.io/admission-bench": tag}), (plain, {})):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    work = Path(tempfile.mkdtemp(prefix="gpulane-bench-admission-"))
    tls = make_serving_cert(directory=work)
    hook = WebhookProcess(cluster, work, tls).start()
    world = World(cluster, api, hooked)
    configs = webhook_configurations(
        url=f"https://127.0.0.1:{hook.port}",
        ca_pem=tls.ca_pem,
        namespace_selector={"gpulane.io/admission-bench": tag},
        name=f"gpulane-bench-{tag}",
    )
    results: dict[str, Any] = {}
    try:
        model = world.model("bench")
        world.apply(*configs)
        time.sleep(2)  # the apiserver picks up new webhook configurations asynchronously
        with_hook: list[float] = []
        without: list[float] = []
        walls = {"through_webhook": 0.0, "without_webhook": 0.0}
        for _ in range(args.rounds):
            for side, namespace, samples in (
                ("through_webhook", hooked, with_hook),
                ("without_webhook", plain, without),
            ):
                t0 = time.perf_counter()
                samples += create_all(custom, namespace, model, args.jobs, args.concurrency)
                walls[side] += time.perf_counter() - t0
        results = {
            "creates_per_side": len(with_hook),
            "concurrency": args.concurrency,
            "through_webhook": {
                **summary(with_hook),
                "creates_per_s": round(len(with_hook) / walls["through_webhook"]),
            },
            "without_webhook": {**summary(without), "creates_per_s": round(len(without) / walls["without_webhook"])},
            "webhook_share_p50_ms": round((statistics.median(with_hook) - statistics.median(without)) * 1000, 1),
        }
    finally:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            cluster.kubectl("delete", kind, f"gpulane-bench-{tag}", "--ignore-not-found")
        hook.stop()
        world.cleanup()
        for name in (hooked, plain):
            core.delete_namespace(name)
    results["machine"] = f"{platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}"
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
