"""``gpulane bridge``: the OpenAI-compatible HTTP bridge, and ``gpulane fake-backend``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import socket
from pathlib import Path

import uvloop
from aiohttp import web

from gpulane.api.run_limits import MAX_RUN_SECONDS
from gpulane.bridge.app import Bridge, BridgeSettings
from gpulane.bridge.job_queue import KubeJobQueue
from gpulane.bridge.keys import RELOAD_SECONDS, KeyRing, KeysError
from gpulane.bridge.results import ResultReader, ResultStore
from gpulane.executor.manifests import ManifestExecutor
from gpulane.kube.client import Kube, load_client


def _endpoint(text: str) -> tuple[str, str]:
    model, sep, url = text.partition("=")
    if not sep or not model or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not MODEL=http(s)://HOST:PORT")
    return model, url


def _pattern(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression: {err}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BridgeSettings()
    parser.add_argument("--namespace", default=os.environ.get("GPULANE_NAMESPACE", "gpulane-system"),
                        help="where the bridge creates its GpuJobs and holds its Lease")  # fmt: skip
    parser.add_argument("--keys-file", required=True, type=Path, help="API keys (YAML; see gpulane/bridge/keys.py)")
    parser.add_argument("--keys-reload-seconds", type=float, default=RELOAD_SECONDS,
                        help="how often the keys file is re-read; a changed one replaces the keys in use")  # fmt: skip
    parser.add_argument("--endpoint", action="append", type=_endpoint, default=[], metavar="MODEL=URL",
                        help="send MODEL's calls to URL instead of the pod's endpoint (repeatable)")  # fmt: skip
    parser.add_argument("--upstream-ignore-path", action="append", type=_pattern, default=[], metavar="REGEX",
                        help="an /upstream/MODEL/PATH call whose PATH matches REGEX skips the queue while MODEL "
                        "is loaded and Ready on a lane (a web UI's static files; llama-swap's "
                        "upstream.ignorePaths; repeatable)")  # fmt: skip
    parser.add_argument("--backend-namespace", default=None,
                        help="namespace of the operator's backend pods, where executed jobs' backends are "
                        "found (default: --namespace)")  # fmt: skip
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--replica", default=socket.gethostname(), help="this replica's name (its jobs and Lease)")
    parser.add_argument("--lease-seconds", type=int, default=10, help="how long the operator waits for a dead bridge")
    parser.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    parser.add_argument("--max-queued", type=int, default=defaults.max_queued)
    parser.add_argument("--max-queued-per-member", type=int, default=defaults.max_queued_per_member)
    parser.add_argument("--max-run-seconds", type=int, default=defaults.max_run_seconds,
                        help="each call's GpuJob maxRunSeconds: a call running longer is failed by the operator "
                        "(default %(default)s); a call's X-Gpulane-Max-Run-Seconds may lower it, and the "
                        "GpuPolicy's runLimits.maxSeconds bounds it")  # fmt: skip
    parser.add_argument("--execute-namespace", action="append", default=[], metavar="NAMESPACE",
                        dest="execute_namespaces",
                        help="run the GpuJobs applied with kubectl in NAMESPACE that carry spec.request "
                        "(repeatable; none: only the bridge's own calls run)")  # fmt: skip
    parser.add_argument("--drain-seconds", type=float, default=300.0,
                        help="on SIGTERM: how long the calls in hand (and kubectl jobs it executes) may take to "
                        "finish, while readiness fails and new calls get a 503 (default %(default)s); give the pod "
                        "a terminationGracePeriodSeconds above it")  # fmt: skip
    parser.add_argument("--results-dir", type=Path, default=None, metavar="DIR",
                        help="the results volume: answers of kubectl jobs with spec.request.output: volume are "
                        "stored here and served at /results/NAMESPACE/JOB to whoever may get the job "
                        "(default: none; such jobs fail)")  # fmt: skip
    parser.add_argument("--verbose", "-v", action="store_true")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if args.drain_seconds < 0:
        raise SystemExit(f"error: --drain-seconds cannot be negative, got {args.drain_seconds}")
    if not 1 <= args.max_run_seconds <= MAX_RUN_SECONDS:
        raise SystemExit(f"error: --max-run-seconds must be from 1 to {MAX_RUN_SECONDS}, got {args.max_run_seconds}")
    try:
        keys = KeyRing.load(args.keys_file)
    except KeysError as err:
        raise SystemExit(f"error: {err}") from None
    settings = BridgeSettings(
        max_body_bytes=args.max_body_bytes,
        max_queued=args.max_queued,
        max_queued_per_member=args.max_queued_per_member,
        max_run_seconds=args.max_run_seconds,
        endpoints=dict(args.endpoint),
        upstream_ignore=tuple(args.upstream_ignore_path),
    )
    uvloop.run(_serve(args, keys, settings))
    return 0


async def _serve(args: argparse.Namespace, keys: KeyRing, settings: BridgeSettings) -> None:
    kube = Kube(await load_client(args.kubeconfig), args.namespace, agent="gpulane-bridge")
    queue = KubeJobQueue(kube, args.replica, args.lease_seconds, args.backend_namespace)
    await queue.start()
    bridge = Bridge(queue, keys, settings)
    reloads = asyncio.create_task(keys.follow(args.keys_file, args.keys_reload_seconds))
    store = ResultStore(args.results_dir) if args.results_dir else None
    executor = ManifestExecutor(kube, queue.lease, settings.endpoints, args.execute_namespaces, args.backend_namespace,
                                results=store, models=queue.models)  # fmt: skip
    executor.start()
    app = bridge.app()
    if store is not None:
        ResultReader(kube, store).add_routes(app)
    # Handlers are cancelled when their client disconnects: that is how a queued or running call
    # learns to give its GPU back.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    logging.getLogger(__name__).info("bridge %s listening on %s:%d", args.replica, args.host, args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log = logging.getLogger(__name__)
    log.info("draining: no new calls; waiting up to %.0fs for the %d calls and %d executions in hand",
             args.drain_seconds, bridge.in_flight, executor.running)  # fmt: skip
    left = await asyncio.gather(bridge.drain(args.drain_seconds), executor.drain(args.drain_seconds))
    if any(left):
        log.warning("drain time over: cancelling %d calls and %d executions still in hand", *left)
    reloads.cancel()
    await runner.cleanup()
    await executor.stop()
    await queue.stop()
    await kube.close()
