"""``gpulane webhook`` (the admission webhook alone) and ``gpulane webhook-config`` (its configurations)."""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from pathlib import Path
from typing import Any

import kopf
import uvloop
import yaml

from gpulane.admission.configuration import webhook_configurations


def add_serving_arguments(parser: argparse.ArgumentParser, *, prefix: str = "") -> None:
    """TLS serving options, shared by ``gpulane webhook`` and ``gpulane operator --webhook``."""
    parser.add_argument(f"--{prefix}host", default="0.0.0.0", help="address the webhook listens on")
    parser.add_argument(f"--{prefix}port", type=int, default=9443, help="HTTPS port of the webhook")
    parser.add_argument("--cert-file", help="serving certificate (PEM); reloaded when it changes")
    parser.add_argument("--key-file", help="its private key (PEM)")
    add_operator_argument(parser)


def add_operator_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--operator-user", action="append", default=[], metavar="USERNAME", dest="operator_users",
        help="the operator's username (system:serviceaccount:NS:NAME; repeatable): only it may write a "
        "GpuJob's status beyond an executor's outcome",
    )  # fmt: skip


def serving_options(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    if not args.cert_file or not args.key_file:
        raise SystemExit("error: the webhook needs --cert-file and --key-file (TLS is mandatory)")
    for path in (args.cert_file, args.key_file):
        if not Path(path).is_file():
            raise SystemExit(f"error: {path}: no such file")
    return {
        "host": getattr(args, f"{prefix}host"),
        "port": getattr(args, f"{prefix}port"),
        "certfile": args.cert_file,
        "keyfile": args.key_file,
        "operators": list(args.operator_users),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_serving_arguments(parser)
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", help="kopf's liveness endpoint")
    parser.add_argument("--verbose", "-v", action="store_true")


def run(args: argparse.Namespace) -> int:
    serving = serving_options(args)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    webhook = importlib.import_module("gpulane.admission.webhook")  # registers the handlers

    memo = kopf.Memo(kubeconfig=args.kubeconfig, webhook=serving)
    memories = webhook.AdmissionMemories()
    uvloop.run(
        kopf.operator(clusterwide=True, standalone=True, memo=memo, liveness_endpoint=args.liveness, memories=memories)
    )
    return 0


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the webhook's base URL, e.g. https://127.0.0.1:9443")
    where.add_argument("--service", help="NAMESPACE/NAME:PORT of the Service in front of the webhook")
    parser.add_argument("--ca-file", help="CA that signed the serving certificate (its caBundle)")
    parser.add_argument(
        "--namespace-selector", default="", help="only GpuJobs in namespaces with these labels (k=v,...)"
    )
    parser.add_argument("--name", default="gpulane", help="name of both configurations")
    add_operator_argument(parser)


def run_config(args: argparse.Namespace) -> int:
    service = None
    if args.service:
        match = re.fullmatch(r"([a-z0-9-]+)/([a-z0-9-]+):(\d+)", args.service)
        if not match:
            print(f"error: --service {args.service!r} is not NAMESPACE/NAME:PORT", file=sys.stderr)
            return 2
        service = (match[1], match[2], int(match[3]))
    selector = {}
    for pair in filter(None, args.namespace_selector.split(",")):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            print(f"error: --namespace-selector {pair!r} is not key=value", file=sys.stderr)
            return 2
        selector[key] = value
    ca = Path(args.ca_file).read_bytes() if args.ca_file else None
    docs = webhook_configurations(url=args.url, service=service, ca_pem=ca, namespace_selector=selector,
                                  name=args.name, operators=args.operator_users)  # fmt: skip
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    return 0
