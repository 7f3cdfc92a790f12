"""Where things are: fixed settings, ports, the tools' bin directory and the state directory's layout."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import ClusterError

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
STAGES_FILE = HACK / "kwok" / "stages.yaml"

# The GPU node of the tests and the tour: a real kubelet node (node.py), or with GPULANE_NODE=kwok a kwok one.
GPU_NODE = "gpu-0"
GPU_RESOURCE = "nvidia.com/gpu"
# kwok's own convention. Every kwok node the tests add carries it, so a pod meant for a real container never
# lands on a node that runs none; pods meant for kwok say so (this toleration, and the node by name).
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
KWOK_TOLERATION = {"key": KWOK_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
SERVICE_CIDR = "10.96.0.0/16"
# Pod IPs that kwok hands out. They are never connected to (kwok runs no containers).
POD_CIDR = "10.244.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl", "helm")


@dataclass(frozen=True)
class Ports:
    apiserver: int
    etcd_client: int
    etcd_peer: int
    scheduler: int
    controller_manager: int
    kwok: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        return cls(base + 443, base + 379, base + 380, base + 259, base + 257, base + 247)

    def by_component(self) -> dict[str, list[int]]:
        return {
            "etcd": [self.etcd_client, self.etcd_peer],
            "kube-apiserver": [self.apiserver],
            "kube-controller-manager": [self.controller_manager],
            "kube-scheduler": [self.scheduler],
            "kwok": [self.kwok],
        }


def node_mode() -> str:
    """GPULANE_NODE: ``real`` (the default: gpu-0 is a kubelet with containerd and runc) or ``kwok``."""
    mode = os.environ.get("GPULANE_NODE", "real") or "real"
    if mode not in ("real", "kwok"):
        raise ClusterError(f"GPULANE_NODE (make NODE=...) must be 'real' or 'kwok', not {mode!r}")
    return mode


def default_state_dir() -> Path:
    if env := os.environ.get("GPULANE_CLUSTER_DIR"):
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpulane" / "cluster"


def default_ports() -> Ports:
    return Ports.from_base(int(os.environ.get("GPULANE_CLUSTER_PORT_BASE", "16000")))


def tools_bindir() -> Path:
    if env := os.environ.get("GPULANE_TOOLS_BIN"):
        return Path(env).expanduser().resolve()
    out = subprocess.run(
        ["bash", str(HACK / "tools" / "build.sh"), "--bindir"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def missing_binaries(bindir: Path, names: tuple[str, ...] = BINARIES) -> list[str]:
    return [b for b in names if not os.access(bindir / b, os.X_OK)]


@dataclass
class Layout:
    state: Path

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def record(self) -> Path:
        return self.state / "cluster.json"

    @property
    def node(self) -> Path:
        """The real node's own directory (containerd's root and state, kubelet's root, CNI config)."""
        return self.state / "node"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def component_kubeconfig(self, component: str) -> Path:
        return self.state / "kubeconfigs" / f"{component}.kubeconfig"
