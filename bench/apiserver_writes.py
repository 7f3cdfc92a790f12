"""What one GpuJob status write costs the apiserver: the bytes it allocates and its CPU, with the CRD as
generated and with the same CRD stripped of its CEL rules, alternated round by round in one run.

    .venv/bin/python bench/apiserver_writes.py [--writes 300] [--rounds 4] [--base REV]

The operator writes a pending job's status (its position, its forecast) many times over its wait, so at
100,000 pending what each write allocates sets how often the apiserver's garbage collector runs
(docs/benchmarks.md, "the tail at 100,000 pending"). The job is a real pending one: the operator queues it
behind a running job and is then stopped. Its spec and status are copied onto an object of a copy of the
CRD (``gpujobcopies``) in a group of the bench's own (``this.bench.gpulane.io``), of the copy stripped of
its rules (``nocel.bench.gpulane.io``) and, with ``--base REV``, of the GpuJob CRD as committed at REV
(``base.bench.gpulane.io``): all made at once and timed alike, then removed. Each round patches each
object's ``status.message`` ``--writes`` times, one after another (the sides in turn, each round from the
next one), and idles as long as the round before it took: the control plane's own pace while idle (and the
two metric reads), per second, is taken off each round for as long as it lasted. Bytes come from the
apiserver's ``go_memstats_alloc_bytes_total``, CPU from /proc.
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
        world.apply(world.job_doc("pending", model, member="m1"))
        wait_until(lambda: world.status("pending").get("position") is not None, timeout=120, what="a position")
        bench.operator.stop()  # nothing else writes the jobs while timed
        pending = world.get("pending")
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

            def created(group: str = group) -> bool:
                with contextlib.suppress(ApiException):
                    doc = {"apiVersion": f"{group}/{VERSION}", "kind": KIND, "metadata": {"name": "pending"},
                           "spec": pending["spec"]}  # fmt: skip
                    custom.create_namespaced_custom_object(group, VERSION, namespace, PLURAL, doc)
                    return True
                return False

            wait_until(created, timeout=60, what=f"the CRD of {side} served")
            patch = {"status": pending["status"]}
            custom.patch_namespaced_custom_object_status(group, VERSION, namespace, PLURAL, "pending", patch)
        time.sleep(WATCHED_AFTER)
        apiserver = pids_named("kube-apiserver")[0]

        def page() -> str:
            return bench.cluster.kubectl("get", "--raw", "/metrics").stdout

        # Per round: the apiserver's bytes and CPU seconds, and the round's wall time.
        spent: dict[str, list[tuple[float, float, float]]] = {side: [] for side in [*groups, "idle"]}
        wall = 0.0
        for r in range(args.rounds):
            order: list[tuple[str, str | None]] = [*groups.items(), ("idle", None)]
            for side, group in order[r % len(order) :] + order[: r % len(order)]:  # each side first in turn
                bytes0, cpu0, t0 = allocated_bytes(page()), cpu_seconds(apiserver), time.monotonic()
                if group is None:
                    time.sleep(wall)
                for i in range(args.writes if group else 0):
                    patch = {"status": {"message": f"round {r} write {i}"}}
                    custom.patch_namespaced_custom_object_status(group, VERSION, namespace, PLURAL, "pending", patch)
                took = time.monotonic() - t0
                wall = took if group else wall
                spent[side].append((allocated_bytes(page()) - bytes0, cpu_seconds(apiserver) - cpu0, took))
        # The control plane's own pace while idle, per second, taken off each round for as long as it lasted.
        idle_bytes = statistics.median(b / t for b, _, t in spent["idle"])
        idle_cpu = statistics.median(c / t for _, c, t in spent["idle"])
        per_write = {
            side: [((b - idle_bytes * t) / args.writes, (c - idle_cpu * t) / args.writes, t / args.writes)
                   for b, c, t in spent[side]]
            for side in groups
        }  # fmt: skip
        medians = {
            side: [statistics.median(row[k] for row in rows) for k in range(3)] for side, rows in per_write.items()
        }
        report: dict[str, Any] = {
            "machine": machine(),
            "writes_per_round": args.writes,
            "rounds": args.rounds,
            "queued_job_bytes": len(json.dumps(pending)),  # as the operator wrote it, managed fields included
            "idle_per_second": {"mib": round(idle_bytes / 2**20, 1), "cpu_ms": round(idle_cpu * 1000)},
        }
        for side, (b, c, w) in medians.items():
            report[side] = {"kib_per_write": round(b / 1024), "cpu_ms_per_write": round(c * 1000, 2),
                            "wall_ms_per_write": round(w * 1000, 2)}  # fmt: skip
        generated = medians["as generated"]
        for side in list(groups)[1:]:  # the CRD as generated over each other side
            other = medians[side]
            report[f"as generated / {side}"] = {
                "bytes": round(generated[0] / other[0], 2),
                "cpu": round(generated[1] / other[1], 2),
            }
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
