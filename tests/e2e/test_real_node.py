"""The real node (issue 7, phase 1): a kubelet with containerd and runc, named gpu-real, joined to a local
control plane of its own, beside the session's kwok cluster (which these tests never touch).

The module's fixture starts that cluster with ``up(real_node=True)`` in its own state directory and port
base, after taking a snapshot of everything on the host the node may change; the last test stops it and
checks, item by item, that the host is as it was.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .support import Cluster, localcluster, make_serving_cert, wait_until

pytestmark = pytest.mark.e2e

# Away from the session's cluster (16000) and the lifecycle tests' (27000).
REAL_BASE = 26000
# How long the fixture waits for another session's real node (this file takes about 80 s).
LOCK_WAIT = 600.0
NODE = localcluster.node.REAL_NODE
IMAGE = localcluster.images.PROJECT_IMAGE
host = localcluster.host


@dataclass
class HostSnapshot:
    """What the real node may change on the host, as read before it starts."""

    sysctls: dict[str, str]
    links: list[str]
    mounts: list[str]
    nft: str
    iptables: str
    paths: dict[str, bool]

    @classmethod
    def take(cls) -> HostSnapshot:
        links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout)
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        return cls(
            sysctls=host.read_sysctls(),
            links=sorted(link["ifname"] for link in links),
            mounts=sorted(mounts),
            nft=subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout,
            iptables=_iptables(),
            paths={p: os.path.lexists(p) for p in (*host.FIXED_PATHS, str(host.RUN_DIR))},
        )


def _iptables() -> str:
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    return "\n".join(line for line in out.splitlines() if not line.startswith("#"))


@dataclass
class RealCluster:
    cluster: Cluster
    before: HostSnapshot
    state: Path

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, **kw)

    def namespace(self) -> str:
        name = f"real-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", name)
        wait_until(
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
            timeout=60,
            what=f"ServiceAccount {name}/default",
        )
        return name

    def pod(self, ns: str, name: str, command: list[str], gpu: bool = False, **spec: Any) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "main",
            "image": IMAGE,
            "imagePullPolicy": "Never",  # imported by `make images`; there is no registry to pull from
            "command": command,
        }
        if gpu:
            container["resources"] = {"limits": {localcluster.GPU_RESOURCE: "1"}}
        container.update(spec.pop("container", {}))
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE},
                "tolerations": [{"key": localcluster.node.TAINT["key"], "operator": "Exists"}],
                "terminationGracePeriodSeconds": 1,
                "containers": [container],
                **spec,
            },
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        return manifest

    def get_pod(self, ns: str, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = json.loads(self.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout)
        return pod

    def wait_ready(self, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
        self.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", ns, f"--timeout={timeout:.0f}s")
        return self.get_pod(ns, name)


def up_when_free(log: localcluster.Log, state: Path, base: int) -> localcluster.ClusterInfo:
    """``up`` with the real node; while another pytest session on this machine runs its own (one per
    machine), wait for it."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            return localcluster.up(log=log, state_dir=state, ports=localcluster.Ports.from_base(base), real_node=True)
        except localcluster.ClusterError as exc:
            if "another real node runs on this machine" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(2)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    before = HostSnapshot.take()
    state = tmp_path_factory.mktemp("real-node") / "state"
    messages: list[str] = []
    try:
        info = up_when_free(messages.append, state, REAL_BASE)
    except localcluster.ClusterError as exc:
        pytest.fail("the real node could not be started:\n" + "\n".join(messages) + f"\n{exc}", pytrace=False)
    yield RealCluster(Cluster(info, True), before, state)
    localcluster.down(log=lambda _m: None, state_dir=state)  # a no-op when the last test already did


def test_a_pod_from_the_project_image_is_ready_and_answers_on_its_pod_ip(real: RealCluster) -> None:
    ns = real.namespace()
    started = time.monotonic()
    real.pod(
        ns,
        "web",
        ["python3", "-m", "http.server", "8080"],
        container={"readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}},
    )
    pod = real.wait_ready(ns, "web")
    ready_after = time.monotonic() - started
    assert pod["spec"]["nodeName"] == NODE
    ip = pod["status"]["podIP"]
    assert ip.startswith("10.250.0."), ip
    with urllib.request.urlopen(f"http://{ip}:8080/", timeout=5) as resp:
        assert resp.status == 200
        assert b"Directory listing" in resp.read()
    print(f"pod create -> Ready: {ready_after:.2f}s")


def test_the_gpu_is_a_real_constraint(real: RealCluster) -> None:
    ns = real.namespace()
    sleep = ["python3", "-c", "import time; time.sleep(3600)"]
    real.pod(ns, "first", sleep, gpu=True)
    real.wait_ready(ns, "first")
    real.pod(ns, "second", sleep, gpu=True)

    def unschedulable() -> str | None:
        for cond in real.get_pod(ns, "second")["status"].get("conditions", []):
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                return str(cond.get("message", ""))
        return None

    message = wait_until(unschedulable, timeout=30, what="the second GPU pod to be unschedulable")
    assert f"Insufficient {localcluster.GPU_RESOURCE}" in message
    assert real.get_pod(ns, "second")["status"]["phase"] == "Pending"
    real.kubectl("delete", "pod", "first", "-n", ns, "--grace-period=0", "--force", "--wait=true")
    pod = real.wait_ready(ns, "second")
    assert pod["spec"]["nodeName"] == NODE


LIST_PODS = """
from kubernetes import client, config
config.load_incluster_config()
try:
    names = [p.metadata.name for p in client.CoreV1Api().list_namespaced_pod("{ns}").items]
    print("allowed", names)
except client.ApiException as exc:
    print("denied", exc.status)
"""


def test_in_cluster_config_and_rbac_from_a_pod(real: RealCluster) -> None:
    """The pod's ServiceAccount token and KUBERNETES_SERVICE_HOST (10.96.0.1, through kube-proxy to the
    apiserver on the bridge address): the API answers, and RBAC decides."""
    ns = real.namespace()
    real.kubectl("create", "serviceaccount", "reader", "-n", ns)
    real.pod(ns, "client", ["python3", "-c", "import time; time.sleep(3600)"], serviceAccountName="reader")
    real.wait_ready(ns, "client")
    script = LIST_PODS.format(ns=ns)
    denied = real.kubectl("exec", "client", "-n", ns, "--", "python3", "-c", script).stdout
    assert denied.strip() == "denied 403", denied
    real.kubectl("create", "role", "pod-reader", "--verb=list", "--resource=pods", "-n", ns)
    real.kubectl("create", "rolebinding", "reader", "--role=pod-reader", f"--serviceaccount={ns}:reader", "-n", ns)
    allowed = wait_until(
        lambda: (
            (out := real.kubectl("exec", "client", "-n", ns, "--", "python3", "-c", script).stdout).startswith(
                "allowed"
            )
            and out
        ),
        timeout=30,
        what="the Role to take effect",
    )
    assert "'client'" in allowed
    other = real.kubectl("exec", "client", "-n", ns, "--", "python3", "-c", LIST_PODS.format(ns="default")).stdout
    assert other.strip() == "denied 403", "the Role grants its own namespace only"


WEBHOOK_SERVER = """
import json, ssl
from http.server import BaseHTTPRequestHandler, HTTPServer

class Review(BaseHTTPRequestHandler):
    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        data = (request.get("object") or {}).get("data") or {}
        allowed = "forbidden" not in data
        response = {"uid": request["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "message": "refused by the webhook pod: data has 'forbidden'"}
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/tls/tls.crt", "/tls/tls.key")
server = HTTPServer(("0.0.0.0", 8443), Review)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""


def test_a_webhook_served_by_a_pod_behind_a_service_admits_and_refuses(real: RealCluster, tmp_path: Path) -> None:
    """The apiserver calls a `service:` webhook on the pod's endpoint IP (aggregator routing), with TLS
    server name SVC.NS.svc."""
    ns = real.namespace()
    tls = make_serving_cert(ips=(), dns=(f"hook.{ns}.svc",), directory=tmp_path)
    real.kubectl("create", "secret", "tls", "hook-tls", f"--cert={tls.cert_file}", f"--key={tls.key_file}", "-n", ns)
    real.pod(
        ns,
        "hook",
        ["python3", "-c", WEBHOOK_SERVER],
        container={
            "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": True}],
            "readinessProbe": {"tcpSocket": {"port": 8443}, "periodSeconds": 1},
        },
        volumes=[{"name": "tls", "secret": {"secretName": "hook-tls"}}],
    )
    real.kubectl("label", "pod", "hook", "app=hook", "-n", ns)
    real.kubectl("create", "service", "clusterip", "hook", "--tcp=443:8443", "-n", ns)
    real.kubectl("set", "selector", "service", "hook", "app=hook", "-n", ns)
    real.wait_ready(ns, "hook")
    name = f"real-node-{ns}"
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "hook.gpulane.dev",
                "clientConfig": {
                    "service": {"name": "hook", "namespace": ns, "port": 443, "path": "/validate"},
                    "caBundle": base64.b64encode(tls.ca_pem).decode(),
                },
                "rules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            }
        ],
    }
    real.kubectl("apply", "-f", "-", input=json.dumps(config))
    try:
        # The first calls may race the webhook's registration; the refusal must come from the pod.
        refused = wait_until(
            lambda: (
                "refused by the webhook pod"
                in (
                    out := real.kubectl(
                        "create",
                        "configmap",
                        f"bad-{uuid.uuid4().hex[:4]}",
                        "--from-literal=forbidden=1",
                        "-n",
                        ns,
                        check=False,
                    ).stderr
                )
                and out
            ),
            timeout=30,
            what="the webhook pod to refuse",
        )
        assert 'admission webhook "hook.gpulane.dev" denied the request' in refused
        real.kubectl("create", "configmap", "good", "--from-literal=fine=1", "-n", ns)
    finally:
        real.kubectl("delete", "validatingwebhookconfiguration", name, check=False)


def test_kubectl_logs_and_exec(real: RealCluster) -> None:
    ns = real.namespace()
    real.pod(ns, "talker", ["python3", "-c", "print('hello from gpu-real', flush=True); import time; time.sleep(3600)"])
    real.wait_ready(ns, "talker")
    logs = wait_until(
        lambda: "hello" in (out := real.kubectl("logs", "talker", "-n", ns).stdout) and out, timeout=20, what="logs"
    )
    assert "hello from gpu-real" in logs
    release = real.kubectl("exec", "talker", "-n", ns, "--", "cat", "/etc/os-release").stdout
    assert "bookworm" in release
    ident = real.kubectl(
        "exec",
        "-i",
        "talker",
        "-n",
        ns,
        "--",
        "python3",
        "-c",
        "import sys; print(sys.stdin.read()[::-1])",
        input="gpu",
    ).stdout
    assert ident.strip() == "upg"


def test_up_reuses_a_running_real_node_and_never_restarts_a_cluster_without_one(
    real: RealCluster, cluster: Cluster
) -> None:
    again = localcluster.up(log=lambda _m: None, state_dir=real.state, ports=localcluster.Ports.from_base(REAL_BASE))
    assert not again.started and again.real_node == NODE
    assert [p.pid for p in again.procs] == [p.pid for p in real.cluster.info.procs]
    # The session's kwok cluster: asking it for the real node is an error, and it keeps running.
    with pytest.raises(localcluster.ClusterError) as err:
        localcluster.up(log=lambda _m: None, state_dir=cluster.info.state_dir, ports=cluster.info.ports, real_node=True)
    assert "a cluster without the real node runs in" in str(err.value)
    ok, text = localcluster.status(state_dir=cluster.info.state_dir)
    assert ok, text


def test_missing_node_packages_are_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localcluster.node, "RUNC", str(tmp_path / "no-runc"))
    with pytest.raises(localcluster.ClusterError) as err:
        localcluster.up(
            log=lambda _m: None, state_dir=tmp_path / "state", ports=localcluster.Ports.from_base(28000), real_node=True
        )
    assert f"the real node needs {tmp_path / 'no-runc'}" in str(err.value)
    assert "make node-deps" in str(err.value)
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("instruction", "message"),
    [
        ("RUN apt-get install -y curl", "the local assembler runs only `python3 -m pip install ...`"),
        ('SHELL ["/bin/bash", "-c"]', "Dockerfile instruction SHELL is not supported by the local assembler"),
        ("COPY missing.txt ./", "Dockerfile COPY: missing.txt does not exist"),
    ],
)
def test_the_image_assembler_refuses_what_docker_would_do_differently(
    tmp_path: Path, instruction: str, message: str
) -> None:
    """The project image is assembled from the Dockerfile without Docker; whatever the assembler cannot
    do exactly as Docker would is an error, never silently skipped."""
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(f"ARG BASE=python:3.11-slim-bookworm\nFROM ${{BASE}}\nWORKDIR /app\n{instruction}\n")
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(localcluster.ClusterError) as err:
        localcluster.images.assemble_dockerfile(dockerfile, tmp_path, root, {}, lambda _m: None)
    assert message in str(err.value)


def test_a_second_real_node_on_the_machine_is_refused(real: RealCluster, tmp_path: Path) -> None:
    with pytest.raises(localcluster.ClusterError) as err:
        localcluster.up(
            log=lambda _m: None, state_dir=tmp_path / "state", ports=localcluster.Ports.from_base(28000), real_node=True
        )
    assert "another real node runs on this machine" in str(err.value)
    assert str(real.state) in str(err.value), "the message names the holder's state dir"
    assert not (tmp_path / "state").exists()
    ok, text = localcluster.status(state_dir=real.state)
    assert ok, text


def test_down_leaves_nothing_behind_even_after_a_killed_run(real: RealCluster, tmp_path: Path) -> None:
    """Kill every process of the running cluster (as a killed session would leave it), start a new real
    node (its `up` gives back the stale host state first), then `down` it and compare the host with the
    snapshot taken before the first start: processes, mounts, the bridge, netfilter rules, cgroups, files
    in the fixed host paths, and the sysctls."""
    killed = localcluster.running(state_dir=real.state)
    assert killed is not None
    for proc in killed.procs:
        os.kill(proc.pid, signal.SIGKILL)
    wait_until(lambda: not any(localcluster.proc_alive(p) for p in killed.procs), timeout=10, what="the killed cluster")
    state = tmp_path / "after-kill"
    info = localcluster.up(
        log=lambda _m: None, state_dir=state, ports=localcluster.Ports.from_base(REAL_BASE), real_node=True
    )
    ok, text = localcluster.status(state_dir=state)
    assert ok, text
    socket = str(localcluster.node.socket_path())
    assert localcluster.down(log=lambda _m: None, state_dir=state)
    localcluster.down(log=lambda _m: None, state_dir=real.state)  # what is left of the killed one's state dir

    after = HostSnapshot.take()
    for proc in [*killed.procs, *info.procs]:
        assert not localcluster.proc_alive(proc), f"{proc.component} (pid {proc.pid}) still runs"
    assert host.shim_pids(socket) == [], "containerd shims left"
    assert after.mounts == real.before.mounts
    assert host.BRIDGE not in after.links and after.links == real.before.links
    assert after.nft == real.before.nft
    assert after.iptables == real.before.iptables
    assert host.cgroup_dirs() == [], "kubepods cgroups left"
    assert after.paths == real.before.paths
    assert after.sysctls == real.before.sysctls
    assert not state.exists() and not real.state.exists()


def test_a_foreign_interface_named_like_the_bridge_is_a_clear_error(tmp_path: Path) -> None:
    """Runs after the module's node is down: an interface gpulane0 that is not ours is never taken (nor
    deleted at teardown)."""
    subprocess.run(["ip", "link", "add", host.BRIDGE, "type", "bridge"], check=True)
    try:
        with pytest.raises(localcluster.ClusterError) as err:
            up_when_free(lambda _m: None, tmp_path / "state", 28000)
        assert f"a network interface {host.BRIDGE} already exists on this host" in str(err.value)
        assert Path(f"/sys/class/net/{host.BRIDGE}").exists(), "the foreign interface was removed"
        assert not host.RUN_DIR.exists(), "the host record and lock were left behind"
        assert not (tmp_path / "state" / "cluster.json").exists()
    finally:
        subprocess.run(["ip", "link", "del", host.BRIDGE], check=False)
