"""Admission latency, five sides alternated in one run: GpuJob creates through gpulane's webhook, through
the apiserver's own admission policies (``admission.mode: policy``, gpulane/admission/cel.py), through the
cheapest pair of policies the apiserver can run (``floor``: a mutating policy that sets one field and a
validating one whose rule is ``true``, no parameter), through the same pair with GpuPolicy ``default`` as
their parameter (``floor-param``, as gpulane's take it), and through neither. The floors say what binding
any mutating and validating policy costs on the machine, and what a parameter adds (the apiserver converts
it, through JSON, once per activation), before gpulane's rules add theirs.

    .venv/bin/python bench/admission.py [--jobs 100] [--concurrency 50] [--rounds 12]

Starts the local control plane if none runs, applies crds/, runs ``gpulane webhook`` as its own process
and installs its configurations for one namespace, and the policies for another (GpuPolicy ``default``
their parameter), and the floors' for a third and a fourth. Each round creates ``--jobs`` GpuJobs from ``--concurrency``
threads in each of the five namespaces in turn, so that a drifting host affects all alike (many short rounds:
three rounds of 300 put one side's creates into a slow minute of the host and gave the floor 2.0x). Every create is
timed by the client, as a user feels it. Then the webhook's process is SIGKILLed and one round more runs on
the webhook's side and on the policies' side: creates through the webhook fail until it is back, creates
through the policies must not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import REPO, machine
from kubernetes import client, config

from gpulane.admission import cel
from gpulane.admission.configuration import webhook_configurations
from gpulane.core.sim.report import percentile  # the one percentile definition (type 7)
from tests.e2e.operator_support import GROUP, VERSION, WebhookProcess, World
from tests.e2e.support import Cluster, localcluster, make_serving_cert, wait_until

SIDES = ("webhook", "policy", "floor", "floor-param", "none")


def floor_policies(name: str, namespace_selector: dict[str, str], param: bool = False) -> list[dict[str, Any]]:
    """The least a mutating and a validating policy can do on a GpuJob create, bound to one namespace; with
    ``param``, taking GpuPolicy ``default`` as their parameter, as gpulane's policies do."""
    api = "admissionregistration.k8s.io/v1"
    rules = {"resourceRules": [{"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": ["CREATE"],
                                "resources": ["gpujobs"]}]}  # fmt: skip
    match = {"namespaceSelector": {"matchLabels": namespace_selector}}
    mutation = {"patchType": "ApplyConfiguration",
                "applyConfiguration": {"expression": 'Object{spec: Object.spec{tier: "floor"}}'}}  # fmt: skip
    mutating = {"failurePolicy": "Fail", "reinvocationPolicy": "Never", "matchConstraints": rules,
                "mutations": [mutation]}  # fmt: skip
    validating = {"failurePolicy": "Fail", "matchConstraints": rules, "validations": [{"expression": "true"}]}
    bindings: dict[str, Any] = {"matchResources": match}
    if param:
        kind = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy"}
        mutating["paramKind"] = validating["paramKind"] = kind
        bindings["paramRef"] = {"name": "default", "parameterNotFoundAction": "Deny"}
    meta = {"name": f"{name}-floor{'-param' if param else ''}"}
    return [
        {"apiVersion": api, "kind": "MutatingAdmissionPolicy", "metadata": meta, "spec": mutating},
        {"apiVersion": api, "kind": "MutatingAdmissionPolicyBinding", "metadata": meta,
         "spec": {"policyName": meta["name"], **bindings}},
        {"apiVersion": api, "kind": "ValidatingAdmissionPolicy", "metadata": meta, "spec": validating},
        {"apiVersion": api, "kind": "ValidatingAdmissionPolicyBinding", "metadata": meta,
         "spec": {"policyName": meta["name"], "validationActions": ["Deny"], **bindings}},
    ]  # fmt: skip


def create_all(
    custom: client.CustomObjectsApi, namespace: str, model: str, jobs: int, threads: int
) -> tuple[list[float], list[str]]:
    """Each create's latency, and the errors of the creates that failed."""

    def one(i: int) -> float | str:
        doc = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GpuJob",
            "metadata": {"name": f"b{uuid.uuid4().hex[:10]}", "namespace": namespace},
            "spec": {"model": model, "priority": 1000 if i % 2 else "batch"},
        }
        t0 = time.perf_counter()
        try:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpujobs", doc)
        except client.ApiException as err:
            return f"HTTP {err.status}: {json.loads(err.body or '{}').get('message', err.reason)[:200]}"
        return time.perf_counter() - t0

    with ThreadPoolExecutor(threads) as pool:
        outcomes = list(pool.map(one, range(jobs)))
    return [o for o in outcomes if isinstance(o, float)], [o for o in outcomes if isinstance(o, str)]


def capped(custom: client.CustomObjectsApi, namespace: str, model: str) -> bool:
    """Whether admission capped a priority-1000 create (a dry run: nothing stored); on the floor's side,
    whether its mutation ran."""
    doc = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuJob", "metadata": {"generateName": "probe-"},
           "spec": {"model": model, "priority": 1000}}  # fmt: skip
    try:
        made = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "gpujobs", doc, dry_run="All")
    except client.ApiException:
        return False
    return bool(made["spec"]["priority"] != 1000 or made["spec"].get("tier") == "floor")


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "p99_ms": round(percentile(samples, 99) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100, help="creates per side per round")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()

    info = localcluster.up(log=lambda m: print(m, file=sys.stderr))
    cluster = Cluster(info, info.started)
    cluster.kubectl("apply", "-f", str(REPO / "crds"))
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.configuration.connection_pool_maxsize = args.concurrency
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    tag = f"b{uuid.uuid4().hex[:6]}"
    label = "gpulane.io/admission-bench"
    namespaces = {side: f"bench-{side}-{tag}" for side in SIDES}
    for side, name in namespaces.items():
        labels = {label: f"{side}-{tag}"}
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
    work = Path(tempfile.mkdtemp(prefix="gpulane-bench-admission-"))
    tls = make_serving_cert(directory=work)
    hook = WebhookProcess(cluster, work, tls).start()
    world = World(cluster, api, namespaces["webhook"])
    name = f"gpulane-bench-{tag}"
    configs = webhook_configurations(url=f"https://127.0.0.1:{hook.port}", ca_pem=tls.ca_pem,
                                     namespace_selector={label: f"webhook-{tag}"}, name=name)  # fmt: skip
    policies = cel.manifests(name, namespace_selector={label: f"policy-{tag}"})
    policies += floor_policies(name, {label: f"floor-{tag}"})
    policies += floor_policies(name, {label: f"floor-param-{tag}"}, param=True)
    had_policy = bool(cluster.kubectl("get", "gpupolicy", "default", "--ignore-not-found", "-o", "name").stdout)
    results: dict[str, Any] = {}
    try:
        model = world.model("bench")
        hook.wait_ready()
        if not had_policy:  # the policies' parameter; the webhook reads it too
            world.apply({"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy", "metadata": {"name": "default"}})
        world.apply(*configs, *policies)
        for side in SIDES:  # configurations and policies take effect asynchronously: until a create is capped
            wait_until(lambda s=side: capped(custom, namespaces[s], model) == (s != "none"), what=f"{side} in effect")
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        walls = dict.fromkeys(SIDES, 0.0)
        failed: dict[str, list[str]] = {side: [] for side in SIDES}
        for _ in range(args.rounds):
            for side in SIDES:
                t0 = time.perf_counter()
                done, errors = create_all(custom, namespaces[side], model, args.jobs, args.concurrency)
                walls[side] += time.perf_counter() - t0
                samples[side] += done
                failed[side] += errors
        results = {
            "creates_per_side": args.jobs * args.rounds,
            "concurrency": args.concurrency,
            **{
                side: {**summary(samples[side]), "creates_per_s": round(len(samples[side]) / walls[side]),
                       "failed": len(failed[side])}
                for side in SIDES
            },
            **{
                f"{side}_over_none_p50": round(p50(samples[side]) / p50(samples["none"]), 2)
                for side in ("policy", "floor", "floor-param", "webhook")
            },
            "policy_over_floor_p50": round(p50(samples["policy"]) / p50(samples["floor"]), 2),
            "policy_over_floor_param_p50": round(p50(samples["policy"]) / p50(samples["floor-param"]), 2),
        }  # fmt: skip
        # The webhook gone: its side's creates fail (failurePolicy Fail) until it is back; the policies' do not.
        hook.kill()
        outage: dict[str, Any] = {}
        for side in ("webhook", "policy"):
            done, errors = create_all(custom, namespaces[side], model, args.jobs, args.concurrency)
            outage[side] = {"created": len(done), "failed": len(errors), "first_error": errors[0] if errors else None}
        t0 = time.perf_counter()
        (work / "again").mkdir()
        port, hook = hook.port, WebhookProcess(cluster, work / "again", tls)
        hook.port = port  # where the configurations point
        hook.start()
        wait_until(lambda: capped(custom, namespaces["webhook"], model), what="the webhook back")
        outage["webhook_back_after_restart_s"] = round(time.perf_counter() - t0, 1)
        results["webhook_killed"] = outage
    finally:
        for doc in [*configs, *policies]:
            cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found")
        if not had_policy:
            cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")
        hook.stop()
        world.cleanup()
        for ns in namespaces.values():
            core.delete_namespace(ns)
    results["machine"] = machine()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
