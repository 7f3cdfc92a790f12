"""``gpulane operator``: run the kopf operator with gpulane's handlers."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os

import kopf
import uvloop

from gpulane.admission.main import add_serving_arguments, serving_options
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
    parser.add_argument("--webhook", action="store_true", help="also serve the admission webhook (gpulane webhook)")
    add_serving_arguments(parser, prefix="webhook-")
    parser.add_argument("--verbose", "-v", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.exact_positions < 1 or args.status_writes_per_second <= 0:
        raise SystemExit("error: --exact-positions must be >= 1 and --status-writes-per-second > 0")
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

    settings = dataclasses.asdict(Settings())
    settings.update(exact_positions=args.exact_positions, status_writes_per_second=args.status_writes_per_second)
    settings["namespace"] = args.namespace
    memo = kopf.Memo(
        namespace=args.namespace,
        kubeconfig=args.kubeconfig,
        host=args.host,
        port=args.port,
        settings=settings,
        webhook=webhook,
    )
    uvloop.run(kopf.operator(clusterwide=True, standalone=True, memo=memo))
    return 0
