"""Where the apiserver's CPU goes under GpuJob creates on one side of ``bench/admission.py``: its own pprof
CPU profile, taken while 50 client threads create GpuJobs in a namespace that the side's admission serves.

    .venv/bin/python bench/admission_profile.py policy|floor|floor-param|none [--seconds 20] [--out policy.pprof]
    go tool pprof -top -cum policy.pprof

Starts the local control plane if none runs. Prints the creates, their rate and p50 while profiled.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid

from admission import capped, create_all, floor_policies
from harness import REPO
from kubernetes import client, config

from gpulane.admission import cel
from tests.e2e.operator_support import GROUP, VERSION, World
from tests.e2e.support import Cluster, localcluster, wait_until


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("side", choices=["policy", "floor", "floor-param", "none"])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--out", default=None, help="the profile (default: SIDE.pprof)")
    args = parser.parse_args()
    info = localcluster.up(log=lambda m: print(m, file=sys.stderr))
    cluster = Cluster(info, info.started)
    cluster.kubectl("apply", "-f", str(REPO / "crds"))
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.configuration.connection_pool_maxsize = 50
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    tag = f"p{uuid.uuid4().hex[:6]}"
    label = "gpulane.io/admission-bench"
    namespace = f"bench-profile-{tag}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels={label: tag})))
    world = World(cluster, api, namespace)
    name = f"gpulane-profile-{tag}"
    policies = {"policy": cel.manifests(name, namespace_selector={label: tag}),
                "floor": floor_policies(name, {label: tag}),
                "floor-param": floor_policies(name, {label: tag}, param=True), "none": []}[args.side]  # fmt: skip
    had_policy = bool(cluster.kubectl("get", "gpupolicy", "default", "--ignore-not-found", "-o", "name").stdout)
    try:
        model = world.model("bench")
        if not had_policy:
            world.apply({"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy", "metadata": {"name": "default"}})
        if policies:
            world.apply(*policies)
            wait_until(lambda: capped(custom, namespace, model), what=f"{args.side} in effect")
        out = args.out or f"{args.side}.pprof"
        with open(out, "wb") as sink:
            profile = subprocess.Popen(
                [str(cluster.binary("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "get", "--raw",
                 f"/debug/pprof/profile?seconds={args.seconds}"], stdout=sink,
            )  # fmt: skip
            t0, samples = time.perf_counter(), []
            while profile.poll() is None:
                done, errors = create_all(custom, namespace, model, 200, 50)
                if errors:
                    raise SystemExit(f"creates failed: {errors[0]}")
                samples += done
            wall = time.perf_counter() - t0
        print(json.dumps({"side": args.side, "creates": len(samples), "creates_per_s": round(len(samples) / wall),
                          "p50_ms": round(statistics.median(samples) * 1000, 1), "profile": out}))  # fmt: skip
    finally:
        for doc in policies:
            cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found")
        if not had_policy:
            cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")
        world.cleanup()
        core.delete_namespace(namespace)


if __name__ == "__main__":
    main()
