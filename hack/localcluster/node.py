"""The real node `gpu-0`: containerd (with runc and the CNI bridge), the kubelet, kube-proxy and kube-router's
firewall (NetworkPolicies are enforced, as on k3s), joined to the local control plane. `make cluster-up`
starts it; `make cluster-up NODE=kwok` (GPULANE_NODE=kwok) makes gpu-0 a kwok node instead, for machines
where it cannot run (not root, no runc).

Each setting below avoids an error seen on this machine kind; docs/development.md lists them.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from . import host
from .control_plane import node_ready
from .errors import ClusterError, Log
from .health import api_request, http_check, http_get, wait_for
from .images import PAUSE_IMAGE, Image, import_images
from .layout import GPU_NODE, GPU_RESOURCE, SERVICE_CIDR, Layout, node_mode
from .processes import Proc, proc_alive
from .state import ClusterInfo

NODE_BINARIES = (
    "kubelet",
    "kube-proxy",
    "gpu-device-plugin",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "coredns",
    "kube-router",
)
NODE_COMPONENTS = ("containerd", "coredns", "kubelet", "gpu-device-plugin", "kube-proxy", "kube-router")
# The kubelet's device-plugin directory is fixed, whatever its --root-dir (host.FIXED_PATHS has its parent).
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/gpulane-gpu.sock")
KUBELET_PORT = host.KUBELET_PORT
KUBELET_HEALTHZ = 10248
PROXY_HEALTHZ = 10256
PROXY_METRICS = 10249
DNS_HEALTH = 10260
DNS_READY = 10261
NETPOL_HEALTH = 10262
CLUSTER_DOMAIN = "cluster.local"
DNS_USER = "gpulane:coredns"
NETPOL_USER = "gpulane:kube-router"
CNI_BIN_DIR = "/usr/lib/cni"
RUNC = "/usr/sbin/runc"

# Client certificates the node needs (file stem: CN, O), added to the cluster's PKI.
CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "kubelet": (f"system:node:{GPU_NODE}", ("system:nodes",)),  # the Node authorizer's identity
    "kube-proxy": ("system:kube-proxy", ()),  # bound to system:node-proxier by the bootstrap policy
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", ("system:masters",)),  # logs, exec
    "coredns": (DNS_USER, ()),  # bound to the ClusterRole below, nothing more
    "kube-router": (NETPOL_USER, ()),  # likewise
}
# What CoreDNS's kubernetes plugin watches (with `pods disabled`, the default): no pods, no get, no writes.
DNS_RULES = [
    {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
]
# What kube-router's firewall reads to turn NetworkPolicies into iptables rules; it writes nothing.
NETPOL_RULES = [
    {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services", "endpoints"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
]  # fmt: skip


def enabled() -> bool:
    return node_mode() == "real"


def socket_path() -> Path:
    return host.RUNTIME_DIR / "containerd.sock"


def ctr_command(bindir: Path) -> list[str]:
    return [str(bindir / "ctr"), "--address", str(socket_path())]


def check_prerequisites() -> None:
    needed = (RUNC, f"{CNI_BIN_DIR}/bridge", f"{CNI_BIN_DIR}/host-local", f"{CNI_BIN_DIR}/loopback", "/usr/sbin/nft",
              "/usr/sbin/iptables", "/usr/sbin/ipset")  # fmt: skip
    missing = [p for p in needed if not os.path.exists(p)]
    if missing:
        raise ClusterError(f"the real node needs {', '.join(missing)}: run `make node-deps` (Debian packages)")
    if os.geteuid() != 0:
        raise ClusterError("the real node needs root (cgroups, mounts, the bridge)")


def _containerd_config(layout: Layout) -> str:
    node = layout.node
    return f"""version = 3
root = "{node / "containerd" / "root"}"
state = "{host.RUNTIME_DIR / "containerd"}"
# NRI would open a socket under /var/run; nothing here uses it.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{socket_path()}"

[ttrpc]
  address = "{socket_path()}.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "{node / "containerd" / "opt"}"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  # Imported by `make images`; an image that is present is never pulled (no registry is reachable).
  sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: containerd may only raise oom_score_adj, never lower it.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["{CNI_BIN_DIR}"]
  conf_dir = "{node / "cni" / "net.d"}"

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  Root = "{node / "runc"}"
  SystemdCgroup = false

# A handler named nvidia, as k3s adds when it finds the NVIDIA container toolkit, so that RuntimeClass nvidia
# (docs/quickstart-gpu.md) runs here as on a GPU box. No GPU here: it is runc.
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]
  BinaryName = "{RUNC}"
  Root = "{node / "runc"}"
  SystemdCgroup = false
"""


def _cni_config(layout: Layout) -> dict[str, Any]:
    # A bridge that is the pods' gateway, no masquerade (no iptables needed); the host reaches pod IPs.
    return {
        "cniVersion": "1.0.0",
        "name": "gpulane",
        "plugins": [
            {
                "type": "bridge",
                "bridge": host.BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": host.POD_SUBNET, "gateway": host.BRIDGE_IP, "rangeStart": "10.250.0.10"}]],
                    "dataDir": str(layout.node / "cni" / "ipam"),
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }


def _kubelet_config(layout: Layout) -> dict[str, Any]:
    node = layout.node
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This host has hybrid cgroups, which count as v1: without this the kubelet refuses to run.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        # Otherwise it adds KUBE-FIREWALL, KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT to the host's iptables.
        "makeIPTablesUtilChains": False,
        "address": host.BRIDGE_IP,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(layout.pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{socket_path()}",
        "podLogsDir": str(node / "pod-logs"),
        "volumePluginDir": str(node / "volume-plugins"),
        "nodeStatusUpdateFrequency": "4s",
        # Imported images cannot be pulled again: never garbage-collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": False,
        # CoreDNS on the bridge address (below): pods with the default dnsPolicy resolve Services by name.
        "clusterDNS": [host.BRIDGE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
    }


def _corefile(layout: Layout) -> str:
    """Names of the cluster from the API; every other name from the host's resolver."""
    return f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {host.BRIDGE_IP}
    errors
    health 127.0.0.1:{DNS_HEALTH}
    ready 127.0.0.1:{DNS_READY}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {layout.component_kubeconfig("coredns")} gpulane-local
    }}
    cache 5
}}
.:53 {{
    bind {host.BRIDGE_IP}
    errors
    forward . /etc/resolv.conf
    cache 30
}}
"""


def write_configs(layout: Layout) -> None:
    node = layout.node
    (node / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
    (node / "containerd").mkdir(parents=True, exist_ok=True)
    (node / "containerd.toml").write_text(_containerd_config(layout))
    (node / "cni" / "net.d" / "10-gpulane.conflist").write_text(json.dumps(_cni_config(layout), indent=2))
    (node / "kubelet.yaml").write_text(yaml.safe_dump(_kubelet_config(layout), sort_keys=False))
    (node / "Corefile").write_text(_corefile(layout))


def _argv(layout: Layout, bindir: Path) -> dict[str, list[str]]:
    node = layout.node
    return {
        "containerd": [str(bindir / "containerd"), f"--config={node / 'containerd.toml'}"],
        "coredns": [str(bindir / "coredns"), "-conf", str(node / "Corefile")],
        "kubelet": [
            str(bindir / "kubelet"),
            f"--config={node / 'kubelet.yaml'}",
            f"--kubeconfig={layout.component_kubeconfig('kubelet')}",
            f"--hostname-override={GPU_NODE}",
            # The kubelet rejects a loopback node IP; the bridge's gateway address is host-only.
            f"--node-ip={host.BRIDGE_IP}",
            f"--root-dir={host.RUNTIME_DIR / 'kubelet'}",
            f"--cert-dir={node / 'kubelet-pki'}",
            "--node-labels=gpulane.dev/gpu=true,type=real",
        ],
        "gpu-device-plugin": [str(bindir / "gpu-device-plugin"), f"--resource={GPU_RESOURCE}", "--count=1"],
        # Its firewall only: the CNI bridge routes, kube-proxy serves Services.
        "kube-router": [
            str(bindir / "kube-router"),
            f"--kubeconfig={layout.component_kubeconfig('kube-router')}",
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--enable-cni=false",
            "--enable-ipv6=false",
            f"--hostname-override={GPU_NODE}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--health-port={NETPOL_HEALTH}",
            "--metrics-port=0",
        ],
        "kube-proxy": [
            str(bindir / "kube-proxy"),
            f"--kubeconfig={layout.component_kubeconfig('kube-proxy')}",
            "--proxy-mode=nftables",
            f"--hostname-override={GPU_NODE}",
            f"--cluster-cidr={host.POD_SUBNET}",
            f"--nodeport-addresses={host.BRIDGE_IP}/32",
            "--masquerade-all=true",  # pod -> Service -> pod on the same bridge, without br_netfilter
            f"--healthz-bind-address=127.0.0.1:{PROXY_HEALTHZ}",
            f"--metrics-bind-address=127.0.0.1:{PROXY_METRICS}",
            # 0 leaves the host's conntrack sysctls alone.
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
        ],
    }


def start_runtime(
    layout: Layout, bindir: Path, images: list[Image], launch: Callable[..., Proc], log: Log
) -> Callable[[], None]:
    """Start containerd and import the images in the background, while the control plane starts (the
    import is the longest step). Returns the call that waits for the import and raises its error."""
    write_configs(layout)
    # Only the kubelet inherits the machine-wide lock: Go children keep inherited fds, so containerd
    # would hand it on to every shim. If the kubelet dies, the next `up` gives back what is left.
    containerd: Proc = launch("containerd", _argv(layout, bindir)["containerd"])
    ctr = ctr_command(bindir)
    wait_for("containerd (ctr version)", lambda: _ctr_ok(ctr), 60, containerd)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            sync_images(layout, bindir, images, log)
        except BaseException as exc:  # handed to the caller of imported()
            failed.append(exc)

    thread = threading.Thread(target=run, name="import-images", daemon=True)
    thread.start()

    def imported() -> None:
        thread.join()
        if failed:
            raise failed[0]

    return imported


def sync_images(layout: Layout, bindir: Path, images: list[Image], log: Log) -> None:
    """Import the images whose content the node does not have yet (``make images`` keys them by content),
    and remember which it has, in ``<state>/node/images.json``."""
    record = layout.node / "images.json"
    try:
        have: dict[str, str] = json.loads(record.read_text())
    except (OSError, ValueError):
        have = {}
    new = [image for image in images if have.get(image.name) != image.key]
    import_images(ctr_command(bindir), new, log)
    have.update({image.name: image.key for image in new})
    record.write_text(json.dumps(have, indent=2))


def start(
    layout: Layout,
    bindir: Path,
    server: str,
    lock_fd: int,
    imported: Callable[[], None],
    launch: Callable[..., Proc],
    log: Log,
) -> None:
    """Once the images are in (``start_runtime``), start CoreDNS, the kubelet and kube-proxy; wait until the
    node is Ready with the GPU. ``launch(component, argv, pass_fds)`` starts and records a process."""
    argv = _argv(layout, bindir)
    saved = host.load_record() or {}
    _grant(layout, server, DNS_USER, DNS_RULES)
    _start_dns(argv["coredns"], launch)
    imported()
    kubelet: Proc = launch("kubelet", argv["kubelet"], (lock_fd,))
    wait_for(
        f"kubelet healthz on 127.0.0.1:{KUBELET_HEALTHZ}",
        http_check(f"http://127.0.0.1:{KUBELET_HEALTHZ}/healthz"),
        120,
        kubelet,
    )

    def registered() -> tuple[bool, str]:
        code, _ = api_request(layout, server, "GET", f"/api/v1/nodes/{GPU_NODE}")
        return code == 200, f"HTTP {code}"

    wait_for(f"node {GPU_NODE} registered", registered, 60, kubelet)
    # The GPU comes from a device plugin, as on a real GPU node: the kubelet reports it after every
    # registration of the Node and hands the device to one container at a time.
    plugin: Proc = launch("gpu-device-plugin", argv["gpu-device-plugin"])
    wait_for(f"{DEVICE_PLUGIN_SOCKET} (the device plugin)", lambda: (DEVICE_PLUGIN_SOCKET.exists(), ""), 30, plugin)
    proxy: Proc = launch("kube-proxy", argv["kube-proxy"])
    wait_for(f"node {GPU_NODE} Ready with {GPU_RESOURCE}=1", lambda: node_ready(layout, server), 120, kubelet)
    wait_for(
        f"kube-proxy healthz on 127.0.0.1:{PROXY_HEALTHZ}",
        http_check(f"http://127.0.0.1:{PROXY_HEALTHZ}/healthz"),
        60,
        proxy,
    )
    _grant(layout, server, NETPOL_USER, NETPOL_RULES)
    firewall: Proc = launch("kube-router", argv["kube-router"])
    wait_for(
        f"kube-router healthz on :{NETPOL_HEALTH}",
        http_check(f"http://127.0.0.1:{NETPOL_HEALTH}/healthz"),
        60,
        firewall,
    )
    # The kubelet set its sysctls at container-manager start; put the host's values back.
    host.write_sysctls(saved.get("sysctls", {}))
    log(
        f"node {GPU_NODE} is Ready (containerd, CoreDNS, kubelet, device plugin, kube-proxy, kube-router) "
        f"with {GPU_RESOURCE}: 1"
    )


def _grant(layout: Layout, server: str, user: str, rules: list[dict[str, Any]]) -> None:
    """A ClusterRole named after ``user`` with ``rules``, bound to that user (a node component's identity)."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user}
    for path, body in (
        (f"{rbac}/clusterroles", {"kind": "ClusterRole", "rules": rules}),
        (f"{rbac}/clusterrolebindings", {"kind": "ClusterRoleBinding", "roleRef": ref,
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
    ):  # fmt: skip
        body = {"apiVersion": "rbac.authorization.k8s.io/v1", "metadata": {"name": user}, **body}
        code, answer = api_request(layout, server, "POST", path, body)
        if code not in (201, 409):
            raise ClusterError(f"creating {body['kind']} {user} failed: HTTP {code}: {answer}")


def _start_dns(argv: list[str], launch: Callable[..., Proc]) -> None:
    coredns: Proc = launch("coredns", argv)
    # /ready answers 200 once the kubernetes plugin has listed Services and EndpointSlices.
    wait_for(f"CoreDNS ready on 127.0.0.1:{DNS_READY}", http_check(f"http://127.0.0.1:{DNS_READY}/ready"), 60, coredns)


def component_health(info: ClusterInfo) -> dict[str, tuple[bool, str]]:
    """containerd answers `ctr version`; CoreDNS, the kubelet and kube-proxy answer their health endpoints."""

    def healthz(port: int, path: str = "/healthz") -> tuple[bool, str]:
        code, _ = http_get(f"http://127.0.0.1:{port}{path}", timeout=2.0)
        return code == 200, f"http://127.0.0.1:{port}{path} -> {code}"

    checks = {
        "containerd": lambda: _ctr_ok(ctr_command(info.bindir)),
        "coredns": lambda: healthz(DNS_HEALTH, "/health"),
        "gpu-device-plugin": lambda: (DEVICE_PLUGIN_SOCKET.exists(), f"socket {DEVICE_PLUGIN_SOCKET}"),
        "kubelet": lambda: healthz(KUBELET_HEALTHZ),
        "kube-proxy": lambda: healthz(PROXY_HEALTHZ),
        "kube-router": lambda: healthz(NETPOL_HEALTH),
    }
    by_name = {p.component: p for p in info.procs}
    out: dict[str, tuple[bool, str]] = {}
    for comp in NODE_COMPONENTS:
        proc = by_name.get(comp)
        if proc is None or not proc_alive(proc):
            out[comp] = (False, "not running" if proc is None else f"pid {proc.pid} is not running; see {proc.log}")
            continue
        ok, detail = checks[comp]()
        out[comp] = (ok, f"pid {proc.pid}, {detail}")
    return out


def _ctr_ok(ctr: list[str]) -> tuple[bool, str]:
    proc = subprocess.run([*ctr, "version"], capture_output=True, text=True, check=False)
    server = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("Version:")]
    return proc.returncode == 0, (server[-1] if server else proc.stderr.strip())


def image_names(bindir: Path) -> list[str]:
    proc = subprocess.run(
        [*ctr_command(bindir), "-n", "k8s.io", "images", "ls", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [name for name in proc.stdout.split() if not name.startswith("sha256:")] or ["(none)"]
