"""The command line: `python hack/gpulane_cluster.py up|down|status|env`."""

from __future__ import annotations

import argparse

from . import llama_server
from .cluster import down, restart, status, up
from .errors import ClusterError, stderr_log
from .images import build_base, build_images, build_project
from .layout import Layout, default_state_dir, tools_bindir

USAGE = """gpulane's local Kubernetes cluster: etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
kwok (for extra, simulated GPU nodes) and the real GPU node ``gpu-0`` (containerd, runc, kubelet,
kube-proxy), built from the pinned Go modules in hack/tools (see docs/development.md).

    python hack/gpulane_cluster.py up       start it (idempotent); prints `export KUBECONFIG=...`
    python hack/gpulane_cluster.py status   show the components and their health
    python hack/gpulane_cluster.py down     stop exactly the processes `up` started, remove the state
    python hack/gpulane_cluster.py env      print `export KUBECONFIG=...` and the tools' PATH
    python hack/gpulane_cluster.py images   build the real node's images (cached by content); prints each
                                            image's name and archive
    python hack/gpulane_cluster.py image    build gpulane's own image alone (no Go needed), for a cluster
                                            of your own: `k3s ctr images import ARCHIVE`
    python hack/gpulane_cluster.py llama-server
                                            build llama.cpp's llama-server into an image (the e2e
                                            suite's real model server; once, about 6.5 min)
    python hack/gpulane_cluster.py restart COMPONENT [--graceful]
                                            SIGKILL one component (etcd, kube-apiserver, kubelet,
                                            containerd, ...) and start it again, as a chaos run does

Environment:
    GPULANE_CLUSTER_DIR        state directory (default ${XDG_STATE_HOME:-~/.local/state}/gpulane/cluster)
    GPULANE_CLUSTER_PORT_BASE  ports are BASE+443 (apiserver), +379/+380 (etcd), +259 (scheduler),
                               +257 (controller-manager), +247 (kwok); default 16000
    GPULANE_TOOLS_BIN          directory holding the binaries (default: `hack/tools/build.sh --bindir`)
    GPULANE_NODE=kwok          make gpu-0 a kwok node (no root needed; nothing runs in its pods)
    GPULANE_IMAGES_CACHE       where `images` keeps its archives (default ~/.cache/gpulane/images)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "command", choices=["up", "down", "status", "env", "images", "image", "llama-server", "restart"]
    )
    parser.add_argument("component", nargs="?", help="for restart: the component to restart")
    parser.add_argument("--graceful", action="store_true", help="for restart: SIGTERM instead of SIGKILL")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            info = up()
            print(f"export KUBECONFIG={info.kubeconfig}")
            print(f'export PATH="{info.bindir}:$PATH"')
        elif args.command == "down":
            down()
        elif args.command == "status":
            ok, text = status()
            print(text)
            return 0 if ok else 1
        elif args.command == "restart":
            if not args.component:
                parser.error("restart needs the component, e.g. `restart kube-apiserver`")
            seconds = restart(args.component, crash=not args.graceful)
            print(f"{args.component} restarted; the cluster was healthy again after {seconds:.1f}s")
        elif args.command == "images":
            for image in build_images(stderr_log):
                print(f"{image.name} {image.archive}")
        elif args.command == "image":  # gpulane's own, for a cluster that has its pause (docs/quickstart-gpu.md)
            project = build_project(*build_base(stderr_log), stderr_log)
            print(f"{project.name} {project.archive}")
        elif args.command == "llama-server":
            image = llama_server.build_image(stderr_log)
            print(f"{image.name} {image.archive}")
        else:
            layout = Layout(default_state_dir())
            print(f"export KUBECONFIG={layout.kubeconfig}")
            print(f'export PATH="{tools_bindir()}:$PATH"')
    except ClusterError as exc:
        stderr_log(f"error: {exc}")
        return 1
    return 0
