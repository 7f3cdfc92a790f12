"""``gpulane queue``, ``gpulane lanes`` and ``gpulane why``: the queue explained, from any cluster through
the kubeconfig. Also installed as the kubectl plugin ``kubectl-gpulane`` (``kubectl gpulane queue``)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpulane.api.chains import CHAIN_LABEL
from gpulane.api.contract import Body
from gpulane.api.resources import GROUP, VERSION, GpuPolicySpec
from gpulane.core.durations import parse_duration
from gpulane.core.policy import FairShareWeights, Policy
from gpulane.explain import report, usage


def _kubeconfig(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")


def queue_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("--lane", help="only jobs of this lane (and waiting ones)")
    scope = q.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="one namespace (default: all)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace (the default)")
    q.add_argument("--watch", "-w", action="store_true", help="print it again every 2 seconds")
    q.add_argument("-o", "--output", choices=("table", "wide", "json"), default="table")
    _kubeconfig(q)


def why_arguments(w: argparse.ArgumentParser) -> None:
    w.add_argument("job", help="NAME or NAMESPACE/NAME of a GpuJob, or of a GpuChain")
    w.add_argument("-n", "--namespace", default="default")
    w.add_argument("-o", "--output", choices=("text", "json"), default="text")
    _kubeconfig(w)


def lanes_arguments(lanes: argparse.ArgumentParser) -> None:
    lanes.add_argument("-o", "--output", choices=("table", "json"), default="table")
    _kubeconfig(lanes)


def usage_arguments(u: argparse.ArgumentParser) -> None:
    u.add_argument("--window", default="24h", help="how far back to count GPU time (90s, 4m, 1h30m; default 24h)")
    u.add_argument("-o", "--output", choices=("table", "json"), default="table")
    _kubeconfig(u)


def chains_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("-n", "--namespace", help="one namespace (default: all)")
    c.add_argument("-o", "--output", choices=("table", "json"), default="table")
    _kubeconfig(c)


def load(args: argparse.Namespace) -> client.CustomObjectsApi:
    """The custom-objects API through ``--kubeconfig`` (else $KUBECONFIG, ~/.kube/config)."""
    try:
        config.load_kube_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    except (config.ConfigException, FileNotFoundError) as err:
        raise SystemExit(f"error: no usable kubeconfig: {err}") from None
    return client.CustomObjectsApi()


def _items(api: client.CustomObjectsApi, plural: str, namespace: str | None = None) -> list[Body]:
    if namespace:
        listed = api.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
    else:
        listed = api.list_cluster_custom_object(GROUP, VERSION, plural)
    items: list[Body] = listed["items"]  # type: ignore[index]
    return items


def _get(api: client.CustomObjectsApi, plural: str, namespace: str, name: str) -> Body | None:
    try:
        body: Body = api.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)  # type: ignore[assignment]
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return body


def _models(api: client.CustomObjectsApi) -> dict[str, Body]:
    return {m["metadata"]["name"]: m.get("status") or {} for m in _items(api, "gpumodels")}


def run_queue(args: argparse.Namespace) -> int:
    api = load(args)
    while True:
        rows = report.queue(_items(api, "gpujobs", args.namespace), _models(api), time.time(), args.lane)
        if args.output == "json":
            print(json.dumps(rows, indent=1, default=str))
        else:
            print(report.render_queue(rows, wide=args.output == "wide"))
        if not args.watch:
            return 0
        time.sleep(2)
        print()


def run_lanes(args: argparse.Namespace) -> int:
    api = load(args)
    rows = report.lanes(_items(api, "gpulanes"), _items(api, "gpujobs"), time.time())
    print(json.dumps(rows, indent=1) if args.output == "json" else report.render_lanes(rows))
    return 0


def run_usage(args: argparse.Namespace) -> int:
    try:
        window = parse_duration(args.window)
    except ValueError as err:
        raise SystemExit(f"error: --window: {err}") from None
    api = load(args)
    try:
        spec = api.get_cluster_custom_object(GROUP, VERSION, "gpupolicies", "default").get("spec") or {}  # type: ignore[attr-defined]
        weights = GpuPolicySpec.model_validate(spec).fair_share_weights
    except ApiException:
        weights = FairShareWeights()
    rows = usage.usage(_items(api, "gpujobs"), _items(api, "gpulanes"), weights, time.time(), window)
    print(json.dumps(rows, indent=1) if args.output == "json" else usage.render_usage(rows, window))
    return 0


def run_chains(args: argparse.Namespace) -> int:
    api = load(args)
    rows = report.chains(_items(api, "gpuchains", args.namespace), time.time())
    print(json.dumps(rows, indent=1) if args.output == "json" else report.render_chains(rows))
    return 0


def run_why(args: argparse.Namespace) -> int:
    api = load(args)
    namespace, _, name = args.job.rpartition("/")
    namespace = namespace or args.namespace
    job, chain = _get(api, "gpujobs", namespace, name), None
    if job is None and (chain := _get(api, "gpuchains", namespace, name)) is None:
        print(f"error: no GpuJob or GpuChain {namespace}/{name}", file=sys.stderr)
        return 1
    try:
        spec = api.get_cluster_custom_object(GROUP, VERSION, "gpupolicies", "default").get("spec") or {}  # type: ignore[attr-defined]
        policy = GpuPolicySpec.model_validate(spec).scoring()
    except ApiException:
        policy = Policy()
    lanes, now = _items(api, "gpulanes"), time.time()
    if chain is not None:
        listed = api.list_namespaced_custom_object(GROUP, VERSION, namespace, "gpujobs",
                                                   label_selector=f"{CHAIN_LABEL}={name}")  # fmt: skip
        lines = report.why_chain(chain, listed["items"], lanes, policy, now)  # type: ignore[index]
    else:
        lines = report.why(job, lanes, policy, now)  # type: ignore[arg-type]
    print(
        json.dumps({"job" if chain is None else "chain": f"{namespace}/{name}", "story": lines}, indent=1)
        if args.output == "json"
        else "\n".join(lines)
    )
    return 0
