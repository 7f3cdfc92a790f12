"""``gpulane queue``, ``gpulane lanes`` and ``gpulane why``: the queue explained, from any cluster through
the kubeconfig. Also installed as the kubectl plugin ``kubectl-gpulane`` (``kubectl gpulane queue``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable

from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.config import ConfigException

from gpulane.api.chains import CHAIN_LABEL
from gpulane.api.contract import Body
from gpulane.api.resources import GpuPolicySpec
from gpulane.core.durations import parse_duration
from gpulane.explain import report, usage
from gpulane.kube.client import Gone, Kube, load_client


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


async def load(args: argparse.Namespace) -> Kube:
    """gpulane's one client through ``--kubeconfig`` (else in a pod its own account, $KUBECONFIG, ~/.kube/config)."""
    try:
        return Kube(await load_client(args.kubeconfig), namespace="default", agent="gpulane-explain")
    except (ConfigException, FileNotFoundError) as err:
        raise SystemExit(f"error: no usable kubeconfig: {err}") from None


async def _items(kube: Kube, plural: str, namespace: str | None = None) -> list[Body]:
    return await (kube.list_namespaced(plural, namespace) if namespace else kube.list_cluster(plural))


async def _get(kube: Kube, plural: str, namespace: str, name: str) -> Body | None:
    try:
        return await kube.get_namespaced(plural, namespace, name)
    except Gone:
        return None


async def _models(kube: Kube) -> dict[str, Body]:
    return {m["metadata"]["name"]: m.get("status") or {} for m in await _items(kube, "gpumodels")}


async def _policy(kube: Kube) -> GpuPolicySpec:
    """The GpuPolicy in effect, or the defaults without one."""
    try:
        spec = (await kube.get_cluster("gpupolicies", "default")).get("spec") or {}
    except (Gone, ApiException):  # none, or not readable by this user: the defaults explain as well as they can
        spec = {}
    return GpuPolicySpec.model_validate(spec)


def _run(work: Callable[[Kube], Awaitable[int]], args: argparse.Namespace) -> int:
    """One command on one client, closed at the end; an API error in one line."""

    async def run() -> int:
        kube = await load(args)
        try:
            return await work(kube)
        except ApiException as err:
            print(f"error: the apiserver answered {err.status} {err.reason}", file=sys.stderr)
            return 1
        finally:
            await kube.close()

    return asyncio.run(run())


def run_queue(args: argparse.Namespace) -> int:
    async def work(kube: Kube) -> int:
        while True:
            jobs, models = await _items(kube, "gpujobs", args.namespace), await _models(kube)
            rows = report.queue(jobs, models, time.time(), args.lane)
            if args.output == "json":
                print(json.dumps(rows, indent=1, default=str))
            else:
                print(report.render_queue(rows, wide=args.output == "wide"))
            if not args.watch:
                return 0
            await asyncio.sleep(2)
            print()

    return _run(work, args)


def run_lanes(args: argparse.Namespace) -> int:
    async def work(kube: Kube) -> int:
        rows = report.lanes(await _items(kube, "gpulanes"), await _items(kube, "gpujobs"), time.time())
        print(json.dumps(rows, indent=1) if args.output == "json" else report.render_lanes(rows))
        return 0

    return _run(work, args)


def run_usage(args: argparse.Namespace) -> int:
    try:
        window = parse_duration(args.window)
    except ValueError as err:
        raise SystemExit(f"error: --window: {err}") from None

    async def work(kube: Kube) -> int:
        policy = (await _policy(kube)).scoring()
        rows = usage.usage(await _items(kube, "gpujobs"), await _items(kube, "gpulanes"), policy, time.time(), window)
        print(json.dumps(rows, indent=1) if args.output == "json" else usage.render_usage(rows, window))
        return 0

    return _run(work, args)


def run_chains(args: argparse.Namespace) -> int:
    async def work(kube: Kube) -> int:
        rows = report.chains(await _items(kube, "gpuchains", args.namespace), time.time())
        print(json.dumps(rows, indent=1) if args.output == "json" else report.render_chains(rows))
        return 0

    return _run(work, args)


def run_why(args: argparse.Namespace) -> int:
    namespace, _, name = args.job.rpartition("/")
    namespace = namespace or args.namespace

    async def work(kube: Kube) -> int:
        job, chain = await _get(kube, "gpujobs", namespace, name), None
        if job is None and (chain := await _get(kube, "gpuchains", namespace, name)) is None:
            print(f"error: no GpuJob or GpuChain {namespace}/{name}", file=sys.stderr)
            return 1
        policy = (await _policy(kube)).scoring()
        lanes, now = await _items(kube, "gpulanes"), time.time()
        if chain is not None:
            steps = await kube.list_namespaced("gpujobs", namespace, f"{CHAIN_LABEL}={name}")
            lines = report.why_chain(chain, steps, lanes, policy, now)
        else:
            assert job is not None
            lines = report.why(job, lanes, policy, now)
        print(
            json.dumps({"job" if chain is None else "chain": f"{namespace}/{name}", "story": lines}, indent=1)
            if args.output == "json"
            else "\n".join(lines)
        )
        return 0

    return _run(work, args)
