"""The control plane's components: their command lines, the kwok-simulated GPU node, and health checks."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from .errors import ClusterError
from .health import api_request, http_get, tls_context
from .layout import COMPONENTS, GPU_NODE, GPU_RESOURCE, KWOK_TAINT, POD_CIDR, SA_ISSUER, SERVICE_CIDR, Layout, Ports
from .processes import proc_alive
from .state import ClusterInfo


def loopback_apiserver_flags() -> list[str]:
    # 127.0.0.1 is not a valid Endpoints address, so the apiserver must not publish itself there.
    return ["--endpoint-reconciler-type=none"]


def real_node_apiserver_flags(pki: Path) -> list[str]:
    """With a real node the apiserver publishes its bridge address as the `kubernetes` Service's endpoint
    (kube-proxy then carries in-cluster config), and it reaches kubelets for logs and exec."""
    return [
        # Webhooks behind a Service: dial a ready endpoint, not the ClusterIP.
        "--enable-aggregator-routing=true",
        # `kubectl logs/exec`: the node's InternalIP (its hostname does not resolve), with a client cert.
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
    ]


def component_argv(layout: Layout, bindir: Path, ports: Ports, address: str, real_node: bool) -> dict[str, list[str]]:
    """Each control-plane component's command line. ``address`` is where the apiserver serves and what
    it advertises: 127.0.0.1, or with a real node the node bridge's gateway address (see node.py)."""
    pki = layout.pki
    etcd_url = f"http://127.0.0.1:{ports.etcd_client}"
    peer_url = f"http://127.0.0.1:{ports.etcd_peer}"

    def kc(component: str) -> str:
        return str(layout.component_kubeconfig(component))

    def delegated(component: str) -> list[str]:
        return [
            f"--kubeconfig={kc(component)}",
            f"--authentication-kubeconfig={kc(component)}",
            f"--authorization-kubeconfig={kc(component)}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            f"--cert-dir={layout.state / component}",
        ]

    return {
        "etcd": [
            str(bindir / "etcd"),
            "--name=gpulane",
            f"--data-dir={layout.state / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=gpulane={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",  # a throwaway dev/test store: speed over durability
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(bindir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={address}",
            f"--advertise-address={address}",
            f"--secure-port={ports.apiserver}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            f"--cert-dir={layout.state / 'kube-apiserver'}",
            *(real_node_apiserver_flags(layout.pki) if real_node else loopback_apiserver_flags()),
        ],
        "kube-controller-manager": [
            str(bindir / "kube-controller-manager"),
            *delegated("kube-controller-manager"),
            f"--secure-port={ports.controller_manager}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
        ],
        "kube-scheduler": [
            str(bindir / "kube-scheduler"),
            *delegated("kube-scheduler"),
            f"--secure-port={ports.scheduler}",
        ],
        "kwok": [
            str(bindir / "kwok"),
            f"--kubeconfig={kc('kwok')}",
            f"--config={layout.state / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{ports.kwok}",
        ],
    }


def gpu_node_manifest(name: str = GPU_NODE, tainted: bool = True) -> dict[str, Any]:
    """A kwok-managed node advertising one GPU (tests create more of them for extra lanes). Tainted unless
    it is the cluster's only GPU node (GPULANE_NODE=kwok): then nothing runs real containers anyway."""
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU_RESOURCE: "1"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "gpulane.dev/gpu": "true",
            },
        },
        "spec": {"taints": [dict(KWOK_TAINT)]} if tainted else {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def ensure_gpu_node(layout: Layout, server: str) -> None:
    """The kwok node gpu-0 (GPULANE_NODE=kwok only)."""
    code, body = api_request(layout, server, "POST", "/api/v1/nodes", gpu_node_manifest(tainted=False))
    if code not in (201, 409):
        raise ClusterError(f"creating node {GPU_NODE} failed: HTTP {code}: {body}")
    # Make sure the status carries the GPU, whether or not the create kept it.
    code, node = api_request(layout, server, "GET", f"/api/v1/nodes/{GPU_NODE}")
    if code == 200 and node.get("status", {}).get("capacity", {}).get(GPU_RESOURCE) != "1":
        status = gpu_node_manifest(tainted=False)["status"]
        code, body = api_request(
            layout,
            server,
            "PATCH",
            f"/api/v1/nodes/{GPU_NODE}/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )
        if code != 200:
            raise ClusterError(f"patching the status of node {GPU_NODE} failed: HTTP {code}: {body}")


def component_health(info: ClusterInfo, layout: Layout) -> dict[str, tuple[bool, str]]:
    """Each component: (healthy, detail). A component is healthy if our recorded PID is alive and its
    health endpoint answers ok."""
    p = info.ports
    insecure = tls_context(None)
    endpoints: dict[str, tuple[str, ssl.SSLContext | None]] = {
        "etcd": (f"http://127.0.0.1:{p.etcd_client}/health", None),
        "kube-apiserver": (f"{info.server}/readyz", tls_context(layout)),
        "kube-controller-manager": (f"https://127.0.0.1:{p.controller_manager}/healthz", insecure),
        "kube-scheduler": (f"https://127.0.0.1:{p.scheduler}/healthz", insecure),
        "kwok": (f"http://127.0.0.1:{p.kwok}/healthz", None),
    }
    out: dict[str, tuple[bool, str]] = {}
    by_name = {pr.component: pr for pr in info.procs}
    for comp in COMPONENTS:
        pr = by_name.get(comp)
        if pr is None:
            out[comp] = (False, "not started")
            continue
        if not proc_alive(pr):
            out[comp] = (False, f"pid {pr.pid} is not running; see {pr.log}")
            continue
        url, ctx = endpoints[comp]
        code, body = http_get(url, ctx, timeout=2.0)
        ok = code == 200 and ("true" in body if comp == "etcd" else True)
        out[comp] = (ok, f"pid {pr.pid}, {url} -> {code or body}")
    return out


def node_ready(layout: Layout, server: str, name: str = GPU_NODE) -> tuple[bool, str]:
    """The node is Ready and offers one GPU; the detail names its runtime (kwok's nodes report none)."""
    code, node = api_request(layout, server, "GET", f"/api/v1/nodes/{name}")
    if code != 200 or not isinstance(node, dict):
        return False, f"GET node {name}: {code}"
    status = node.get("status", {})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    gpus = status.get("allocatable", {}).get(GPU_RESOURCE)
    runtime = status.get("nodeInfo", {}).get("containerRuntimeVersion") or "kwok (no containers)"
    return ready and gpus == "1", f"ready={ready} allocatable {GPU_RESOURCE}={gpus} runtime={runtime}"


def healthy(info: ClusterInfo, layout: Layout) -> tuple[bool, dict[str, tuple[bool, str]]]:
    health = component_health(info, layout)
    return all(ok for ok, _ in health.values()), health
