"""What one GpuJob status write costs the apiserver: the bytes it allocates and its CPU, with the CRD as
generated and with the same CRD stripped of its CEL rules, alternated round by round in one run.

    .venv/bin/python bench/apiserver_writes.py [--writes 300] [--rounds 4] [--base REV]

The operator writes a pending job's status (its position, its forecast) many times over its wait, so at
100,000 pending what each write allocates sets how often the apiserver's garbage collector runs
(docs/benchmarks.md, "the tail at 100,000 pending"); and each dispatch writes a job that has run (its executor's
completion, its finalizer off), which carries its story. Both are real: the operator queues a pending job behind
a job that waited while STORY_LIMIT + 1 others ran ahead of it, and is stopped once that one runs. Each job's spec
and status are copied onto an object of a copy of the CRD (``gpujobcopies``) in a group of the bench's own
(``this.bench.gpulane.io``), of the copy stripped of its rules (``nocel.bench.gpulane.io``) and, with ``--base
REV``, of the GpuJob CRD as committed at REV (``base.bench.gpulane.io``): all made at once and timed alike, then
removed. Each round patches each object's ``status.message`` ``--writes`` times, one after another (the sides
in turn, each round from the next one), and idles as long as the round before it took: the control plane's own
pace while idle (and the two metric reads), per second, is taken off each round for as long as it lasted. Bytes
come from the apiserver's ``go_memstats_alloc_bytes_total``, CPU from /proc.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import subprocess
import time
from typing import Any

import yaml
from harness import REPO, bench_world, cpu_seconds, machine, pids_named
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulane.api.resources import STORY_LIMIT
from tests.e2e.operator_support import VERSION
from tests.e2e.support import wait_until

THIS, STRIPPED, BASE = "this.bench.gpulane.io", "nocel.bench.gpulane.io", "base.bench.gpulane.io"
# The controller-manager starts watching a new resource (its garbage collector's informers) once discovery
# finds it, every 30 s: every side is timed once it has, so that each pays for the same watchers.
WATCHED_AFTER = 40.0
KIND, PLURAL = "GpuJobCopy", "gpujobcopies"


def in_group(crd: dict[str, Any], group: str, *, rules: bool = True) -> dict[str, Any]:
    """A copy of the GpuJob ``crd`` in ``group``, as ``gpujobcopies`` (kind ``GpuJobCopy``, no short name nor
    category, so that nobody's ``kubectl get gpujob`` or ``gj`` finds it); without ``rules``, every
    ``x-kubernetes-validations`` list left out too. The schema is otherwise the same."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if rules or k != "x-kubernetes-validations"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    out = strip(copy.deepcopy(crd))
    out["spec"]["names"] = {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": KIND.lower()}
    out["metadata"]["name"] = f"{PLURAL}.{group}"
    out["spec"]["group"] = group
    return out


def allocated_bytes(metrics_text: str) -> float:
    """The Go runtime's bytes allocated so far, from a /metrics page."""
    for line in metrics_text.splitlines():
        if line.startswith("go_memstats_alloc_bytes_total "):
            return float(line.split()[1])
    raise ValueError("no go_memstats_alloc_bytes_total on the /metrics page")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=300, help="status writes per job per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--base", help="also the GpuJob CRD as committed at this git revision")
    args = parser.parse_args()
    path = "crds/gpulane.io_gpujobs.yaml"
    this = yaml.safe_load((REPO / path).read_text())
    sides = {"as generated": in_group(this, THIS), "without CEL rules": in_group(this, STRIPPED, rules=False)}
    if args.base:
        shown = subprocess.run(
            ["git", "show", f"{args.base}:{path}"], cwd=REPO, capture_output=True, text=True, check=True
        )
        sides[f"base {args.base}"] = in_group(yaml.safe_load(shown.stdout), BASE)
    with bench_world() as bench, contextlib.ExitStack() as stack:
        world, namespace = bench.world, bench.namespace
        model = world.model("warm", ready_delay="0s")
        world.lane("lane0")
        world.apply(world.job_doc("running", model))
        # "ran" waits in the batch band while the others run ahead of it; "pending", queued after it in the same
        # band and member, is still waiting once "ran" runs.
        world.apply(world.job_doc("ran", model, priority="batch", member="m1"))
        world.apply(*(world.job_doc(f"ahead{i}", model) for i in range(STORY_LIMIT + 1)))
        world.apply(world.job_doc("pending", model, priority="batch", member="m1"))
        run_until(world, "ran")
        wait_until(lambda: world.status("pending").get("position") is not None, timeout=120, what="a position")
        bench.operator.stop()  # nothing else writes the jobs while timed
        jobs = {name: world.get(name) for name in ("pending", "ran")}
        if len(jobs["ran"]["status"]["story"]["ranAhead"]) < STORY_LIMIT:
            raise SystemExit(f"the job that ran has a story of {jobs['ran']['status']['story']}, not {STORY_LIMIT}")
        ext, custom = client.ApiextensionsV1Api(bench.api), client.CustomObjectsApi(bench.api)
        groups: dict[str, str] = {}

        def crd_names() -> set[str]:
            return {c.metadata.name for c in ext.list_custom_resource_definition().items}

        for side, other in sides.items():
            name = other["metadata"]["name"]
            with contextlib.suppress(ApiException):  # left by an interrupted run
                ext.delete_custom_resource_definition(name)
            wait_until(lambda n=name: n not in crd_names(), timeout=120, what=f"{name} gone")
            ext.create_custom_resource_definition(other)
            stack.callback(ext.delete_custom_resource_definition, name)
            group = groups[side] = other["spec"]["group"]
            for job, body in jobs.items():

                def created(group: str = group, job: str = job, spec: Any = body["spec"]) -> bool:
                    with contextlib.suppress(ApiException):
                        doc = {"apiVersion": f"{group}/{VERSION}", "kind": KIND, "metadata": {"name": job},
                               "spec": spec}  # fmt: skip
                        custom.create_namespaced_custom_object(group, VERSION, namespace, PLURAL, doc)
                        return True
                    return False

                wait_until(created, timeout=60, what=f"the CRD of {side} served")
                patch = {"status": body["status"]}
                custom.patch_namespaced_custom_object_status(group, VERSION, namespace, PLURAL, job, patch)
        time.sleep(WATCHED_AFTER)
        apiserver = pids_named("kube-apiserver")[0]

        def page() -> str:
            return bench.cluster.kubectl("get", "--raw", "/metrics").stdout

        # Per side and job, per round: the apiserver's bytes and CPU seconds, and the round's wall time.
        timed = [(side, group, job) for side, group in groups.items() for job in jobs]
        spent: dict[tuple[str, str], list[tuple[float, float, float]]] = {(s, j): [] for s, _, j in timed}
        idle: list[tuple[float, float, float]] = []
        wall = 0.0
        for r in range(args.rounds):
            order: list[tuple[str, str, str] | None] = [*timed, None]
            for which in order[r % len(order) :] + order[: r % len(order)]:  # each side first in turn
                bytes0, cpu0, t0 = allocated_bytes(page()), cpu_seconds(apiserver), time.monotonic()
                if which is None:
                    time.sleep(wall)
                else:
                    _side, group, job = which
                    for i in range(args.writes):
                        patch = {"status": {"message": f"round {r} write {i}"}}
                        custom.patch_namespaced_custom_object_status(group, VERSION, namespace, PLURAL, job, patch)
                took = time.monotonic() - t0
                wall = took if which else wall
                row = (allocated_bytes(page()) - bytes0, cpu_seconds(apiserver) - cpu0, took)
                (spent[which[0], which[2]] if which else idle).append(row)
        # The control plane's own pace while idle, per second, taken off each round for as long as it lasted.
        idle_bytes = statistics.median(b / t for b, _, t in idle)
        idle_cpu = statistics.median(c / t for _, c, t in idle)

        def per_write(b: float, c: float, t: float) -> tuple[float, float, float]:
            return (b - idle_bytes * t) / args.writes, (c - idle_cpu * t) / args.writes, t / args.writes

        medians = {
            key: [statistics.median(per_write(*row)[k] for row in rows) for k in range(3)]
            for key, rows in spent.items()
        }
        report: dict[str, Any] = {
            "machine": machine(),
            "writes_per_round": args.writes,
            "rounds": args.rounds,
            # as the operator wrote them, managed fields included
            "job_bytes": {job: len(json.dumps(body)) for job, body in jobs.items()},
            "idle_per_second": {"mib": round(idle_bytes / 2**20, 1), "cpu_ms": round(idle_cpu * 1000)},
        }
        for (side, job), (b, c, w) in medians.items():
            report.setdefault(side, {})[job] = {
                "kib_per_write": round(b / 1024),
                "cpu_ms_per_write": round(c * 1000, 2),
                "wall_ms_per_write": round(w * 1000, 2),
            }
        for side in list(groups)[1:]:  # the CRD as generated over each other side
            report[f"as generated / {side}"] = {
                job: {
                    "bytes": round(medians["as generated", job][0] / medians[side, job][0], 2),
                    "cpu": round(medians["as generated", job][1] / medians[side, job][1], 2),
                }
                for job in jobs
            }
        print(json.dumps(report, indent=2))


def run_until(world: Any, name: str, timeout: float = 120) -> None:
    """Act as the executor: complete every job that runs until ``name`` does."""
    deadline = time.monotonic() + timeout
    while world.status(name).get("phase") != "Running":
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} did not run within {timeout} s: {world.status(name)}")
        running = [j["metadata"]["name"] for j in world.jobs() if (j.get("status") or {}).get("phase") == "Running"]
        for other in running:
            if other != name:
                world.complete(other)
        if not running:
            time.sleep(0.1)


if __name__ == "__main__":
    main()
