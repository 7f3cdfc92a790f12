"""``gpulane operator``: run the kopf operator with gpulane's handlers."""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import socket
import uuid

import kopf
import uvloop

from gpulane.admission.main import add_serving_arguments, serving_options
from gpulane.api.shards import Shard
from gpulane.kube.leader import Election, Leadership, Timing
from gpulane.operator.assembly import Operator
from gpulane.operator.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = Settings()
    parser.add_argument(
        "--namespace",
        default=os.environ.get("GPULANE_NAMESPACE", defaults.namespace),
        help="namespace of the backend pods (default: $GPULANE_NAMESPACE or %(default)s)",
    )
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--host", default="0.0.0.0", help="address of /healthz, /readyz and /metrics")
    parser.add_argument("--port", type=int, default=8080, help="port of /healthz, /readyz and /metrics")
    parser.add_argument(
        "--exact-positions",
        type=int,
        default=defaults.exact_positions,
        help="jobs per lane with exact positions and estimates; later ones are rounded (default %(default)s)",
    )
    parser.add_argument(
        "--status-writes-per-second",
        type=float,
        default=defaults.status_writes_per_second,
        help="upper bound on queue-status writes (default %(default)s)",
    )
    parser.add_argument(
        "--unload-namespace",
        default=None,
        metavar="NS",
        help="honour the bridge's /unload (its Lease gpulane-unload) in this namespace: the bridge's (default: none)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=defaults.resync_seconds,
        help="between lists that find objects deleted without a watch event (default %(default)s)",
    )
    parser.add_argument(
        "--shard",
        default=None,
        metavar="NAME",
        help="serve only the GpuLanes and GpuModels labelled gpulane.io/shard=NAME, and their jobs, with a Lease "
        "of its own (default: the default shard, those without the label; docs/operations.md)",
    )
    election = parser.add_argument_group("leader election (several replicas, one writing)")
    election.add_argument(
        "--leader-elect",
        action="store_true",
        help="lead through the Lease gpulane-operator (gpulane-operator-SHARD) before writing; stand by while "
        "another does",
    )
    election.add_argument(
        "--leader-elect-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of the Lease (default: $POD_NAMESPACE, else --namespace)",
    )
    timing = Timing()
    election.add_argument(
        "--leader-elect-lease-seconds",
        type=int,
        default=timing.lease_seconds,
        help="how long a Lease not renewed stays its holder's (default %(default)s)",
    )
    election.add_argument(
        "--leader-elect-renew-deadline-seconds",
        type=float,
        default=timing.renew_deadline_seconds,
        help="a leader that could not renew for this long stops writing (default %(default)s)",
    )
    election.add_argument("--leader-elect-retry-seconds", type=float, default=timing.retry_seconds,
                          help="between renewals and acquire attempts (default %(default)s)")  # fmt: skip
    parser.add_argument("--webhook", action="store_true", help="also serve the admission webhook (gpulane webhook)")
    add_serving_arguments(parser, prefix="webhook-")
    parser.add_argument("--verbose", "-v", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.exact_positions < 1 or args.status_writes_per_second <= 0 or args.resync_seconds <= 0:
        raise SystemExit("error: --exact-positions must be >= 1, --status-writes-per-second and --resync-seconds > 0")
    try:
        Shard(args.shard)
    except ValueError as err:
        raise SystemExit(f"error: --shard: {err}") from None
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per handled event otherwise
    importlib.import_module("gpulane.operator.handlers")  # registers the handlers

    webhook = serving_options(args, prefix="webhook_") if args.webhook else None
    if webhook is not None:
        importlib.import_module("gpulane.admission.webhook")  # and the admission handlers

    settings = Settings(
        namespace=args.namespace,
        exact_positions=args.exact_positions,
        status_writes_per_second=args.status_writes_per_second,
        resync_seconds=args.resync_seconds,
        unload_namespace=args.unload_namespace,
        shard=args.shard,
    )
    # The one place the operator is composed; kopf's startup starts it (gpulane/operator/assembly.py).
    leadership = Leadership(_election(args), Shard(args.shard).lease)
    operator = Operator(settings, leadership, args.host, args.port)
    memo = kopf.Memo(operator=operator, kubeconfig=args.kubeconfig, webhook=webhook)
    tune_gc()
    uvloop.run(kopf.operator(clusterwide=True, standalone=True, memo=memo))
    return 0


# Young objects collected after this many allocations instead of CPython's 700 (docs/benchmarks.md). Not many more:
# kopf keeps each watch event's parsed body in a reference cycle (its Body and Patch views point back at them), so
# each young collection frees the events since the last; at 20,000 that was hundreds of events, 20 to 70 ms of the
# loop (a young collection of the middle generation 0.23 s) between dispatches.
GC_YOUNG_THRESHOLD = 2_000


def tune_gc() -> None:
    """Python's cyclic collector was 30% of the operator's CPU in a 5,000-job burst (py-spy --native): each
    pass over the queue allocates thousands of short-lived dicts, and each full collection walked every
    module, model class and job. The imported code is frozen out of the walks, and young collections are
    rarer, though not so rare that one frees hundreds of watch events' bodies at once. What the operator builds up
    later (a long queue) is frozen as it grows (collector.py)."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def _election(args: argparse.Namespace) -> Election | None:
    if not args.leader_elect:
        return None
    timing = Timing(args.leader_elect_lease_seconds, args.leader_elect_renew_deadline_seconds,
                    args.leader_elect_retry_seconds)  # fmt: skip
    try:
        timing.check()
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
    return Election(args.leader_elect_namespace or args.namespace, identity, timing)
