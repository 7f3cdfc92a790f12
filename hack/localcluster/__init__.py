"""gpulane's local Kubernetes cluster for development and the e2e suite (see docs/development.md).

Modules, one concern each: ``layout`` (settings, ports, paths), ``pki``, ``processes``, ``health``,
``state`` (the record and the lock), ``control_plane``, ``node`` (the real kubelet node), ``host`` (what
the node takes from the host and gives back), ``images`` (without a registry), ``llama_server`` (a real
model server's image), ``cluster``
(up/release/down/status) and ``cli``.
``hack/gpulane_cluster.py`` re-exports this API under the name the tests and benchmarks import.
"""

from __future__ import annotations

from . import host, images, llama_server, node
from .cli import main
from .cluster import dead, down, release, restart, running, status, up, users
from .control_plane import component_health, ensure_gpu_node, gpu_node_manifest, node_ready
from .errors import ClusterError, Log
from .health import api_request, http_get, wait_for
from .layout import (
    BINARIES,
    COMPONENTS,
    GPU_NODE,
    GPU_RESOURCE,
    KWOK_TAINT,
    KWOK_TOLERATION,
    POD_CIDR,
    SERVICE_CIDR,
    Layout,
    Ports,
    default_ports,
    default_state_dir,
    missing_binaries,
    tools_bindir,
)
from .pki import generate_pki, issue_cert, new_ca, new_key, write_kubeconfig
from .processes import Proc, proc_alive, start_process, stop_process, tail
from .state import ClusterInfo

__all__ = [
    "BINARIES",
    "COMPONENTS",
    "GPU_NODE",
    "GPU_RESOURCE",
    "KWOK_TAINT",
    "KWOK_TOLERATION",
    "POD_CIDR",
    "SERVICE_CIDR",
    "ClusterError",
    "ClusterInfo",
    "Layout",
    "Log",
    "Ports",
    "Proc",
    "api_request",
    "component_health",
    "dead",
    "default_ports",
    "default_state_dir",
    "down",
    "ensure_gpu_node",
    "generate_pki",
    "gpu_node_manifest",
    "host",
    "http_get",
    "images",
    "issue_cert",
    "llama_server",
    "main",
    "missing_binaries",
    "new_ca",
    "new_key",
    "node",
    "node_ready",
    "proc_alive",
    "release",
    "restart",
    "running",
    "start_process",
    "status",
    "stop_process",
    "tail",
    "tools_bindir",
    "up",
    "users",
    "wait_for",
    "write_kubeconfig",
]
