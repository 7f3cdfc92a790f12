#!/usr/bin/env python3
"""gpulane's local Kubernetes control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager
and kwok (simulating the GPU node ``gpu-0``), all on 127.0.0.1, built from the pinned Go modules in
hack/tools (see docs/development.md).

    python hack/gpulane_cluster.py up       start it (idempotent); prints `export KUBECONFIG=...`
    python hack/gpulane_cluster.py status   show the components and their health
    python hack/gpulane_cluster.py down     stop exactly the processes `up` started, remove the state
    python hack/gpulane_cluster.py env      print `export KUBECONFIG=...` and the tools' PATH

The module is also imported by tests/e2e (functions `up`, `release`, `down`, `status`).

Environment:
    GPULANE_CLUSTER_DIR        state directory (default ${XDG_STATE_HOME:-~/.local/state}/gpulane/cluster)
    GPULANE_CLUSTER_PORT_BASE  ports are BASE+443 (apiserver), +379/+380 (etcd), +259 (scheduler),
                               +257 (controller-manager), +247 (kwok); default 16000
    GPULANE_TOOLS_BIN          directory holding the binaries (default: `hack/tools/build.sh --bindir`)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO = Path(__file__).resolve().parent.parent
HACK = REPO / "hack"
STAGES_FILE = HACK / "kwok" / "stages.yaml"

GPU_NODE = "gpu-0"
GPU_RESOURCE = "nvidia.com/gpu"
SERVICE_CIDR = "10.96.0.0/16"
# Pod IPs that kwok hands out. They are never connected to (kwok runs no containers).
POD_CIDR = "10.244.0.0/16"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl", "helm")


class ClusterError(RuntimeError):
    """A failure to start, query or stop the local cluster; the message says what to look at."""


Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- layout


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


def missing_binaries(bindir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bindir / b, os.X_OK)]


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

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def component_kubeconfig(self, component: str) -> Path:
        return self.state / "kubeconfigs" / f"{component}.kubeconfig"


# ------------------------------------------------------------------------------------------------ PKI


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int, *, ca: bool
) -> x509.CertificateBuilder:
    """What CA and leaf certificates share: names, key, validity, basic constraints and key usage."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def issue_cert(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    *,
    server: bool,
    sans: list[x509.GeneralName] | None = None,
    days: int = 365,
) -> x509.Certificate:
    builder = (
        _builder(subject, ca_cert.subject, key, days, ca=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    # file stem: (CN, O). RBAC's bootstrap policy binds the scheduler's and controller-manager's users;
    # the admin and kwok (which simulates a kubelet for every node it manages) are system:masters.
    "admin": ("gpulane-admin", ("system:masters",)),
    "kube-scheduler": ("system:kube-scheduler", ()),
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    "kwok": ("kwok", ("system:masters",)),
}


def new_ca(cn: str, days: int = 3650) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA key and certificate."""
    ca_key = new_key()
    cert = (
        _builder(_name(cn), _name(cn), ca_key, days, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, cert


def generate_pki(pki: Path) -> None:
    """CA, apiserver serving cert (IP SAN 127.0.0.1, DNS localhost), client certs, service-account keys."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = new_ca("gpulane-local-ca")
    _write_key(pki / "ca.key", ca_key)
    _write_cert(pki / "ca.crt", ca_cert)

    first_service_ip = next(ipaddress.IPv4Network(SERVICE_CIDR).hosts())
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(first_service_ip),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
    ]
    key = new_key()
    _write_key(pki / "apiserver.key", key)
    _write_cert(
        pki / "apiserver.crt", issue_cert(ca_key, ca_cert, key, _name("kube-apiserver"), server=True, sans=sans)
    )

    for stem, (cn, orgs) in CLIENTS.items():
        key = new_key()
        _write_key(pki / f"{stem}.key", key)
        _write_cert(pki / f"{stem}.crt", issue_cert(ca_key, ca_cert, key, _name(cn, orgs), server=False))

    sa_key = new_key()
    _write_key(pki / "sa.key", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A kubeconfig with absolute paths to the CA and the client cert/key of ``user`` (a CLIENTS stem)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpulane-local",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pki / f"{user}.crt"),
                    "client-key": str(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "gpulane-local", "context": {"cluster": "gpulane-local", "user": user}}],
        "current-context": "gpulane-local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


# ---------------------------------------------------------------------------------------- processes


@dataclass
class Proc:
    component: str
    pid: int
    starttime: int  # /proc/PID/stat field 22: tells a recycled PID from ours
    argv: list[str]
    log: str


def _proc_stat(pid: int) -> tuple[str, int] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces; fields after it are space separated.
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])


def proc_alive(p: Proc) -> bool:
    st = _proc_stat(p.pid)
    return st is not None and st[1] == p.starttime and st[0] not in ("Z", "X")


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def start_process(component: str, argv: list[str], log: Path) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== {datetime.datetime.now(datetime.UTC).isoformat()} starting: {' '.join(argv)}\n".encode())
        out.flush()
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    st = _proc_stat(child.pid)
    if st is None:
        raise ClusterError(f"{component} exited immediately; see {log}")
    return Proc(component, child.pid, st[1], argv, str(log))


def stop_process(p: Proc, timeout: float = 15.0) -> None:
    """SIGTERM the recorded process (only if it is still the same process), then SIGKILL after ``timeout``."""
    if not proc_alive(p):
        _reap(p.pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(p.pid)
        if not proc_alive(p):
            return
        time.sleep(0.1)
    if proc_alive(p):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
        for _ in range(50):
            _reap(p.pid)
            if not proc_alive(p):
                return
            time.sleep(0.1)


def tail(path: Path | str, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:])


def port_owner(port: int) -> str:
    ss = shutil.which("ss")
    if not ss:
        return ""
    out = subprocess.run([ss, "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def check_port_free(port: int, component: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            owner = port_owner(port)
            raise ClusterError(
                f"port {port} on 127.0.0.1 (for {component}) is already in use ({exc.strerror})"
                + (f"; held by: {owner}" if owner else "")
                + ". Stop whatever holds it, or choose other ports with GPULANE_CLUSTER_PORT_BASE"
                + " (default 16000)."
            ) from None


# ------------------------------------------------------------------------------------------- health


def _tls_context(layout: Layout | None) -> ssl.SSLContext:
    if layout is None:  # the components' self-signed health endpoints
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    ctx.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
    return ctx


def http_get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def api_request(
    layout: Layout,
    server: str,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, context=_tls_context(layout), timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def _http_check(url: str, ctx: ssl.SSLContext | None = None, etcd: bool = False) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        code, body = http_get(url, ctx)
        return code == 200 and (not etcd or "true" in body), f"{code} {body[-200:]}"

    return check


def wait_for(
    what: str,
    check: Callable[[], tuple[bool, str]],
    timeout: float,
    proc: Proc | None = None,
    interval: float = 0.25,
) -> None:
    deadline = time.monotonic() + timeout
    detail = ""
    while time.monotonic() < deadline:
        ok, detail = check()
        if ok:
            return
        if proc is not None and not proc_alive(proc):
            _reap(proc.pid)
            raise ClusterError(f"{proc.component} exited while waiting for {what}; see {proc.log}:\n{tail(proc.log)}")
        time.sleep(interval)
    where = f"; see {proc.log}:\n{tail(proc.log)}" if proc else ""
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what} (last: {detail[:300]}){where}")


# --------------------------------------------------------------------------------------------- state


@dataclass
class ClusterInfo:
    """What the e2e fixture and `status` need to know about a cluster."""

    state_dir: Path
    kubeconfig: Path
    server: str
    bindir: Path
    ports: Ports
    started: bool = False  # True if the `up` call that returned this started the cluster
    procs: list[Proc] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        }


def _load_record(layout: Layout) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(layout.record.read_text())
    except (OSError, ValueError):
        return None
    return data


def _info_from_record(layout: Layout, rec: dict[str, Any]) -> ClusterInfo:
    return ClusterInfo(
        state_dir=layout.state,
        kubeconfig=layout.kubeconfig,
        server=rec["server"],
        bindir=Path(rec["bindir"]),
        ports=Ports(**rec["ports"]),
        procs=[Proc(**p) for p in rec["procs"]],
    )


def _save_record(layout: Layout, info: ClusterInfo) -> None:
    rec = {
        "server": info.server,
        "bindir": str(info.bindir),
        "ports": asdict(info.ports),
        "procs": [asdict(p) for p in info.procs],
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
    }
    tmp = layout.record.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=2))
    tmp.replace(layout.record)


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[None]:
    """Serialise up/down/status between processes (make, several pytest sessions)."""
    state.parent.mkdir(parents=True, exist_ok=True)
    with open(state.parent / f".{state.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def component_health(info: ClusterInfo, layout: Layout) -> dict[str, tuple[bool, str]]:
    """Each component: (healthy, detail). A component is healthy if our recorded PID is alive and its
    health endpoint answers ok."""
    p = info.ports
    insecure = _tls_context(None)
    endpoints: dict[str, tuple[str, ssl.SSLContext | None]] = {
        "etcd": (f"http://127.0.0.1:{p.etcd_client}/health", None),
        "kube-apiserver": (f"{info.server}/readyz", _tls_context(layout)),
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


def node_ready(layout: Layout, server: str) -> tuple[bool, str]:
    code, node = api_request(layout, server, "GET", f"/api/v1/nodes/{GPU_NODE}")
    if code != 200 or not isinstance(node, dict):
        return False, f"GET node {GPU_NODE}: {code}"
    status = node.get("status", {})
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
    gpus = status.get("allocatable", {}).get(GPU_RESOURCE)
    return ready and gpus == "1", f"ready={ready} allocatable {GPU_RESOURCE}={gpus}"


# ------------------------------------------------------------------------------------------ commands


def _argv(layout: Layout, bindir: Path, ports: Ports, server: str) -> dict[str, list[str]]:
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
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
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
            # 127.0.0.1 is not a valid Endpoints address, so the apiserver must not publish itself there.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={layout.state / 'kube-apiserver'}",
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


def gpu_node_manifest(name: str = GPU_NODE) -> dict[str, Any]:
    """A kwok-managed node advertising one GPU (tests create more of them for extra lanes)."""
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
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def ensure_gpu_node(layout: Layout, server: str) -> None:
    code, body = api_request(layout, server, "POST", "/api/v1/nodes", gpu_node_manifest())
    if code not in (201, 409):
        raise ClusterError(f"creating node {GPU_NODE} failed: HTTP {code}: {body}")
    # Make sure the status carries the GPU, whether or not the create kept it.
    code, node = api_request(layout, server, "GET", f"/api/v1/nodes/{GPU_NODE}")
    if code == 200 and node.get("status", {}).get("capacity", {}).get(GPU_RESOURCE) != "1":
        status = gpu_node_manifest()["status"]
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


def _healthy(info: ClusterInfo, layout: Layout) -> tuple[bool, dict[str, tuple[bool, str]]]:
    health = component_health(info, layout)
    return all(ok for ok, _ in health.values()), health


def up(
    log: Log = _stderr, state_dir: Path | None = None, ports: Ports | None = None, user: int | None = None
) -> ClusterInfo:
    """Start the cluster, or return the running one (``started`` tells which). Raises ClusterError.

    ``user`` (a PID, e.g. a pytest session's) registers that process as a user of the cluster, so that
    ``release`` does not stop the cluster under another live user."""
    layout = Layout(state_dir or default_state_dir())
    with _locked(layout.state):
        rec = _load_record(layout)
        info: ClusterInfo | None = None
        if rec is not None:
            found = _info_from_record(layout, rec)
            ok, health = _healthy(found, layout)
            if ok and node_ready(layout, found.server)[0]:
                log(f"cluster already running (state {layout.state})")
                info = found
            else:
                bad = "; ".join(f"{c}: {d}" for c, (good, d) in health.items() if not good) or "node not ready"
                log(f"found an unhealthy cluster in {layout.state} ({bad}); stopping it and starting afresh")
                _teardown(layout, found.procs, log)
        elif layout.state.exists():
            log(f"removing stale state in {layout.state} (no cluster record)")
            shutil.rmtree(layout.state)
        if info is None:
            info = _start(layout, ports or default_ports(), log)
        if user is not None:
            _register_user(layout, user)
        return info


def _identity(pid: int) -> str | None:
    st = _proc_stat(pid)
    return None if st is None or st[0] in ("Z", "X") else f"{pid} {st[1]}"


def _register_user(layout: Layout, pid: int) -> None:
    users = layout.state / "users"
    users.mkdir(parents=True, exist_ok=True)
    (users / str(pid)).write_text(_identity(pid) or "")


def _live_users(layout: Layout) -> list[int]:
    users = layout.state / "users"
    if not users.is_dir():
        return []
    return [int(f.name) for f in users.iterdir() if f.name.isdigit() and _identity(int(f.name)) == f.read_text()]


def release(user: int, started: bool, log: Log = _stderr, state_dir: Path | None = None) -> bool:
    """``user`` is done with the cluster. Stop it if that user started it (or inherited it from the user
    that did) and no other registered process is still alive; else leave it running. A starter that
    leaves while others still use it hands the duty to stop it on to the last of them. Returns True if
    the cluster was stopped."""
    layout = Layout(state_dir or default_state_dir())
    with _locked(layout.state):
        (layout.state / "users" / str(user)).unlink(missing_ok=True)
        rec = _load_record(layout)
        if rec is None:
            return False
        handover = layout.state / "stop-when-unused"
        others = _live_users(layout)
        if others:
            if started:
                handover.touch()
                log(f"leaving the cluster running for its other users (pids {others})")
            return False
        if started or handover.exists():
            _teardown(layout, _info_from_record(layout, rec).procs, log)
            return True
        return False


def _timed(log: Log, t0: float) -> Log:
    """Prefix each message with the seconds since ``t0``."""
    return lambda msg: log(f"[{time.monotonic() - t0:5.1f}s] {msg}")


def _start(layout: Layout, ports: Ports, log: Log) -> ClusterInfo:
    bindir = tools_bindir()
    missing = missing_binaries(bindir)
    if missing:
        raise ClusterError(
            f"missing binaries in {bindir}: {', '.join(missing)}. Build them with `make tools` "
            "(hack/tools/build.sh; the first build takes a while, see docs/development.md)."
        )
    for comp, comp_ports in ports.by_component().items():
        for port in comp_ports:
            check_port_free(port, comp)

    t0 = time.monotonic()
    log = _timed(log, t0)
    layout.state.mkdir(parents=True, exist_ok=True)
    layout.logs.mkdir(exist_ok=True)
    generate_pki(layout.pki)
    server = f"https://127.0.0.1:{ports.apiserver}"
    write_kubeconfig(layout.kubeconfig, server, layout.pki, "admin")
    for comp in ("kube-scheduler", "kube-controller-manager", "kwok"):
        write_kubeconfig(layout.component_kubeconfig(comp), server, layout.pki, comp)
    shutil.copyfile(STAGES_FILE, layout.state / "kwok-stages.yaml")

    info = ClusterInfo(layout.state, layout.kubeconfig, server, bindir, ports, started=True)
    argv = _argv(layout, bindir, ports, server)

    def launch(comp: str) -> Proc:
        proc = start_process(comp, argv[comp], layout.log(comp))
        info.procs.append(proc)
        _save_record(layout, info)  # record each PID as soon as it exists, so `down` can always stop it
        return proc

    try:
        log(f"starting etcd on 127.0.0.1:{ports.etcd_client}")
        etcd = launch("etcd")
        wait_for("etcd /health", _http_check(f"http://127.0.0.1:{ports.etcd_client}/health", etcd=True), 60, etcd)
        log("etcd is healthy")
        log(f"starting kube-apiserver on {server}")
        apiserver = launch("kube-apiserver")
        wait_for(
            "kube-apiserver /readyz",
            _http_check(f"{server}/readyz", _tls_context(layout)),
            180,
            apiserver,
            0.5,
        )
        log("kube-apiserver is ready")
        log("starting kube-controller-manager, kube-scheduler and kwok")
        kcm = launch("kube-controller-manager")
        sched = launch("kube-scheduler")
        ensure_gpu_node(layout, server)
        kwok = launch("kwok")
        insecure = _tls_context(None)
        for proc, url in (
            (kcm, f"https://127.0.0.1:{ports.controller_manager}/healthz"),
            (sched, f"https://127.0.0.1:{ports.scheduler}/healthz"),
            (kwok, f"http://127.0.0.1:{ports.kwok}/healthz"),
        ):
            wait_for(f"{proc.component} {url}", _http_check(url, insecure), 120, proc, 0.5)
        log("kube-controller-manager, kube-scheduler and kwok are healthy")
        wait_for(f"node {GPU_NODE} Ready with {GPU_RESOURCE}=1", lambda: node_ready(layout, server), 120, kwok)
        log(f"node {GPU_NODE} is Ready with {GPU_RESOURCE}: 1")

        def default_sa() -> tuple[bool, str]:
            code, _ = api_request(layout, server, "GET", "/api/v1/namespaces/default/serviceaccounts/default")
            return code == 200, f"HTTP {code}"

        wait_for("ServiceAccount default/default (created by kube-controller-manager)", default_sa, 120, kcm)
    except BaseException as exc:
        log(f"cluster start failed: {exc}\nstopping what was started; logs are kept in {layout.logs}")
        _teardown(layout, info.procs, log, keep_logs=True)
        raise
    log(f"cluster ready (state {layout.state}, logs {layout.logs})")
    return info


def _teardown(layout: Layout, procs: list[Proc], log: Log, keep_logs: bool = False) -> None:
    for proc in reversed(procs):
        if proc_alive(proc):
            log(f"stopping {proc.component} (pid {proc.pid})")
        stop_process(proc)
    if not layout.state.exists():
        return
    if keep_logs:
        for child in layout.state.iterdir():
            if child != layout.logs:
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    else:
        shutil.rmtree(layout.state)


def down(log: Log = _stderr, state_dir: Path | None = None) -> bool:
    """Stop the processes recorded by `up` and remove the state. Returns False if there was nothing."""
    layout = Layout(state_dir or default_state_dir())
    with _locked(layout.state):
        rec = _load_record(layout)
        if rec is None:
            if layout.state.exists():
                log(f"no cluster record in {layout.state}; removing the directory")
                shutil.rmtree(layout.state)
                return True
            log(f"no cluster at {layout.state}; nothing to stop")
            return False
        _teardown(layout, _info_from_record(layout, rec).procs, log)
        log(f"cluster stopped; removed {layout.state}")
        return True


def running(state_dir: Path | None = None) -> ClusterInfo | None:
    """The recorded cluster if it is fully healthy, else None (no locking, no side effects)."""
    layout = Layout(state_dir or default_state_dir())
    rec = _load_record(layout)
    if rec is None:
        return None
    info = _info_from_record(layout, rec)
    ok, _ = _healthy(info, layout)
    return info if ok and node_ready(layout, info.server)[0] else None


def status(state_dir: Path | None = None) -> tuple[bool, str]:
    layout = Layout(state_dir or default_state_dir())
    rec = _load_record(layout)
    if rec is None:
        return False, f"no cluster (state dir {layout.state})"
    info = _info_from_record(layout, rec)
    ok, health = _healthy(info, layout)
    lines = [f"state:      {layout.state}", f"kubeconfig: {layout.kubeconfig}", f"server:     {info.server}"]
    lines += [f"{'ok  ' if good else 'FAIL'} {comp:24} {detail}" for comp, (good, detail) in health.items()]
    node_ok, node_detail = node_ready(layout, info.server) if health["kube-apiserver"][0] else (False, "no apiserver")
    lines.append(f"{'ok  ' if node_ok else 'FAIL'} {'node ' + GPU_NODE:24} {node_detail}")
    lines.append(f"logs:       {layout.logs}")
    return ok and node_ok, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "status", "env"])
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
        else:
            layout = Layout(default_state_dir())
            print(f"export KUBECONFIG={layout.kubeconfig}")
            print(f'export PATH="{tools_bindir()}:$PATH"')
    except ClusterError as exc:
        _stderr(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
