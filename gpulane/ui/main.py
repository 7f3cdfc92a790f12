"""``gpulane ui``: the live web page, against the cluster of a kubeconfig (or in a pod, its own account)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

import uvloop
from aiohttp import web

from gpulane.bridge.keys import KeyRing, KeysError
from gpulane.kube.client import Kube, load_client
from gpulane.kube.watch import watch_jobs
from gpulane.ui.auth import Sessions
from gpulane.ui.server import Server
from gpulane.ui.store import Store, follow


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=8092)
    parser.add_argument("--keys-file", type=Path, default=None,
                        help="the bridge's API keys: a key logs in to see its jobs in --bridge-namespace")  # fmt: skip
    parser.add_argument("--bridge-namespace", default=os.environ.get("GPULANE_NAMESPACE", "gpulane-system"),
                        help="where the bridge creates its GpuJobs (default: $GPULANE_NAMESPACE)")  # fmt: skip
    parser.add_argument("--anonymous", action="store_true",
                        help="show the page without a login: every job as anonymous load, no names")  # fmt: skip
    parser.add_argument("--verbose", "-v", action="store_true")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    try:
        keys = None if args.keys_file is None else KeyRing.load(args.keys_file)
    except KeysError as err:
        raise SystemExit(f"error: {err}") from None
    uvloop.run(_serve(args, keys))
    return 0


async def _serve(args: argparse.Namespace, keys: KeyRing | None) -> None:
    log = logging.getLogger(__name__)
    kube = Kube(await load_client(args.kubeconfig), args.bridge_namespace, agent="gpulane-ui")
    store = Store()
    watching = asyncio.create_task(
        follow(store, lambda plural, deliver, on_state: watch_jobs(kube, None, None, deliver, on_state, plural=plural))
    )
    reloads = None if keys is None else asyncio.create_task(keys.follow(args.keys_file))
    sessions = Sessions(kube, keys, args.bridge_namespace, args.anonymous)
    # A page that goes away cancels its stream's handler at once: its slot and its updates end with it.
    runner = web.AppRunner(Server(store, sessions).app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    log.info("the web page is on http://%s:%d/ (%s)", args.host, args.port,
             "anonymous allowed" if args.anonymous else "log in with a bridge key or a Kubernetes token")  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for task in (watching, reloads):
        if task is not None:
            task.cancel()
    await runner.shutdown()
    await runner.cleanup()
    await kube.close()
