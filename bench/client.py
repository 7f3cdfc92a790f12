"""CPU per API call: the official client's sync flavour, and ``kubernetes.aio`` on asyncio's loop and on
uvloop (as gpulane configures it, and with aiohttp's ``trust_env`` that the client turns on by default), each
making the same sequential status patches to one GpuJob, side by side in one run.

    .venv/bin/python bench/client.py [--calls 200] [--rounds 3]

Uses the local cluster (started if none runs). Prints CPU milliseconds per call (this process's CPU
time, so the apiserver's share is not in it) and the median wall time per call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop
from harness import REPO
from kubernetes import client as sync_client
from kubernetes import config as sync_config

from gpulane.kube.client import Kube, load_client
from tests.e2e.support import Cluster, localcluster

GROUP, VERSION, NAMESPACE, NAME = "gpulane.io", "v1alpha1", "default", "bench-client"


def sync_calls(kubeconfig: str, calls: int) -> tuple[float, float]:
    custom = sync_client.CustomObjectsApi(sync_config.new_client_from_config(config_file=kubeconfig))
    walls = []
    cpu = time.process_time()
    for i in range(calls):
        t = time.perf_counter()
        patch = {"status": {"message": f"sync {i}"}}
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, NAMESPACE, "gpujobs", NAME, patch)
        walls.append(time.perf_counter() - t)
    return (time.process_time() - cpu) / calls * 1000, statistics.median(walls) * 1000


async def aio_calls(kubeconfig: str, calls: int, trust_env: bool = False) -> tuple[float, float]:
    api = await load_client(kubeconfig)
    if trust_env:  # the client's own default, which gpulane turns off (gpulane/kube/client.py)
        api.configuration.client_session_kwargs = None
    kube = Kube(api, NAMESPACE)
    await kube.patch_job_status(NAMESPACE, NAME, {"status": {"message": "warm"}})  # connect first
    walls = []
    cpu = time.process_time()
    for i in range(calls):
        t = time.perf_counter()
        await kube.patch_job_status(NAMESPACE, NAME, {"status": {"message": f"aio {i}"}})
        walls.append(time.perf_counter() - t)
    result = (time.process_time() - cpu) / calls * 1000, statistics.median(walls) * 1000
    await kube.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    info = localcluster.up(log=lambda m: print(m, file=sys.stderr))
    kubeconfig = str(info.kubeconfig)
    custom = sync_client.CustomObjectsApi(sync_config.new_client_from_config(config_file=kubeconfig))
    job = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuJob", "metadata": {"name": NAME}, "spec": {"model": "m"}}
    Cluster(info, info.started).kubectl("apply", "-f", str(REPO / "crds"))
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "gpujobs", job)
    loops: dict[str, tuple[Callable[[Coroutine[Any, Any, tuple[float, float]]], tuple[float, float]], bool]] = {
        "aio-asyncio": (asyncio.run, False),
        "aio-uvloop": (uvloop.run, False),
        "aio-uvloop-trust-env": (uvloop.run, True),
    }
    runs: dict[str, list[tuple[float, float]]] = {"sync": [], **{name: [] for name in loops}}
    try:
        for _ in range(args.rounds):
            runs["sync"].append(sync_calls(kubeconfig, args.calls))
            for name, (run, trust_env) in loops.items():
                runs[name].append(run(aio_calls(kubeconfig, args.calls, trust_env)))
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "gpujobs", NAME)
    out = {
        name: {
            "cpu_ms_per_call": round(statistics.median(c for c, _ in r), 2),
            "wall_ms_per_call": round(statistics.median(w for _, w in r), 2),
        }
        for name, r in runs.items()
    }
    print(json.dumps({"calls": args.calls, "rounds": args.rounds, **out}, indent=1))


if __name__ == "__main__":
    main()
