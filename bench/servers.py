"""Swaps on the real node gpu-0 with the real llama-server (issue 36), side by side in one run: a pod per model,
against one server in router mode that loads the next model by API, against the same server holding both, and a
warm dispatch to the model it serves.

    .venv/bin/python bench/servers.py [--rounds 3 --switches 5]

Each timed step is a job for the other model (or, warm, the same one), created while the lane is idle, to the
job turning Running (the bench's watch); the bench then completes it, as an executor would. Each round runs
the four modes one after another on a fresh lane of gpu-0, so a drifting machine slows all alike. Two tiny
generated models (tests/e2e/tiny_gguf.py) of 4,000 MiB each: the router lane states 6,000 MiB (one at a
time: every switch is a load by the server) or 10,000 (both held: a switch is nothing but routing).
Prints one JSON object: each mode's p50 and max, the server's own loads (from ``POST /models/load`` until
``GET /models`` lists the model loaded, as the operator logs each), and the ratios the issue asks for.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import PhaseWatch, bench_world, create_jobs

from tests.e2e.operator_support import API, GROUP, VERSION, World
from tests.e2e.support import localcluster, wait_until
from tests.e2e.tiny_gguf import write_tiny_model

MEMORY = 4000
CONTEXT = 512
ARGS = ["--threads", "2", "-np", "1"]


def volume(weights: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    return ({"name": "models", "hostPath": {"path": str(weights), "type": "Directory"}},
            {"name": "models", "mountPath": "/models", "readOnly": True})  # fmt: skip


def pod_models(world: World, image: str, weights: Path) -> list[str]:
    """Two GpuModels, each a llama-server pod of its own (today's lanes)."""
    vol, mount = volume(weights)
    names = []
    for stem in ("a", "b"):
        name = world.name(f"pod-{stem}")
        container = {"name": "backend", "image": image, "volumeMounts": [mount],
                     "args": [*ARGS, "--host", "0.0.0.0", "--port", "8080", "-c", str(CONTEXT), "-m",
                              f"/models/{stem}.gguf", "-a", name]}  # fmt: skip
        spec = {"port": 8080, "readinessPath": "/health", "loadTimeoutSeconds": 120,
                "template": {"spec": {"volumes": [vol], "containers": [container]}}}  # fmt: skip
        world.apply({"apiVersion": API, "kind": "GpuModel", "metadata": {"name": name}, "spec": spec})
        world.cluster_objects.append(("gpumodels", name))
        names.append(name)
    return names


def router_models(world: World, image: str, weights: Path) -> list[str]:
    """One llama-server in router mode and the two models it holds."""
    vol, mount = volume(weights)
    server = world.name("router")
    container = {"name": "backend", "image": image, "args": ARGS, "volumeMounts": [mount]}
    spec = {"port": 8080, "readinessPath": "/health", "loadTimeoutSeconds": 120,
            "router": {"protocol": "LlamaServerRouter", "maxLoaded": 2},
            "template": {"spec": {"volumes": [vol], "containers": [container]}}}  # fmt: skip
    world.apply({"apiVersion": API, "kind": "GpuModel", "metadata": {"name": server}, "spec": spec})
    world.cluster_objects.append(("gpumodels", server))
    names = []
    for stem in ("a", "b"):
        name = world.name(f"held-{stem}")
        body = {"server": server, "memoryMib": MEMORY, "loadTimeoutSeconds": 120,
                "preset": {"model": f"/models/{stem}.gguf", "c": str(CONTEXT)}}  # fmt: skip
        world.apply({"apiVersion": API, "kind": "GpuModel", "metadata": {"name": name}, "spec": body})
        world.cluster_objects.append(("gpumodels", name))
        names.append(name)
    return names


def timed(world: World, watcher: PhaseWatch, stem: str, models: list[str], steps: int) -> list[float]:
    """``steps`` jobs after one per model, each for ``models[i % len(models)]``, each timed from its creation to
    Running, then completed."""
    out = []
    # The first job of each model only puts the lane in its state: with both held, the second model's first job
    # is still a load, and one load in five timed steps moved the held median by milliseconds.
    for i in range(steps + len(models)):
        name = f"{stem}-{i}"
        t0 = time.monotonic()
        create_jobs(world, [world.job_doc(name, models[i % len(models)])])
        at, _n, _o = watcher.until(lambda n, p, o, j=name: n == j and p == "Running", timeout=180)
        if i >= len(models):
            out.append(at - t0)
        world.complete(name)
        world.wait_phase(name, "Succeeded", timeout=30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--switches", type=int, default=5, help="timed jobs per mode and round")
    args = parser.parse_args()
    built = localcluster.llama_server.build_image(print)
    weights = Path(tempfile.mkdtemp(prefix="gpulane-bench-models-"))
    weights.chmod(0o755)
    vocabulary = localcluster.llama_server.built_dir() / localcluster.llama_server.VOCAB
    for stem, seed in (("a", 1), ("b", 2)):
        write_tiny_model(vocabulary, weights / f"{stem}.gguf", seed=seed, context=CONTEXT)
    times: dict[str, list[float]] = {"pod": [], "router": [], "held": [], "warm": []}
    try:
        with bench_world() as bench:
            world = bench.world
            localcluster.node.sync_images(localcluster.Layout(bench.cluster.info.state_dir), bench.cluster.bindir,
                                          [built], print)  # fmt: skip
            watcher = PhaseWatch(bench.api, bench.namespace)
            pods, held = pod_models(world, built.name, weights), router_models(world, built.name, weights)
            for r in range(args.rounds):
                for mode, models, memory in (("pod", pods, None), ("router", held, 6000), ("held", held, 10000),
                                             ("warm", held[:1], 10000)):  # fmt: skip
                    lane = world.real_lane(f"{mode}{r}")
                    if memory is not None:
                        world.custom.patch_cluster_custom_object(GROUP, VERSION, "gpulanes", lane,
                                                                 {"spec": {"memoryMib": memory}})  # fmt: skip
                    times[mode] += timed(world, watcher, f"{mode}-{r}", models, args.switches)
                    world.custom.delete_cluster_custom_object(GROUP, VERSION, "gpulanes", lane)
                    wait_until(lambda lane=lane: not world.backend_pods(lane), timeout=90, what=f"{lane}'s pod gone")
            watcher.stop()
            log = bench.operator.log_path.read_text()
            loads = [float(s) for s in re.findall(r"loaded by its server \S+ in ([0-9.]+)s", log)]
    finally:
        shutil.rmtree(weights)
    p50 = {mode: statistics.median(t) for mode, t in times.items()}
    own = statistics.median(loads) if loads else None
    print(json.dumps({
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "rounds": args.rounds,
        "per_mode": {mode: {"p50_s": round(p50[mode], 3), "max_s": round(max(t), 3), "n": len(t)}
                     for mode, t in times.items()},
        "server_load_s": None if own is None else round(own, 3),
        "router_switch_minus_load_s": None if own is None else round(p50["router"] - own, 3),
        "pod_over_router": round(p50["pod"] / p50["router"], 1),
        "held_over_warm": round(p50["held"] / p50["warm"], 2),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
