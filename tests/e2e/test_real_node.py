"""The real node gpu-0 (issue 7): a kubelet with containerd and runc, joined to the session's cluster. Pods
from the project's image run there for real: readiness probes, pod IPs the host reaches, the GPU as a
scheduling constraint, in-cluster config with RBAC, a webhook behind a Service, `kubectl logs` and `exec`.

That the host is given back when the node stops is checked at the very end of the session
(test_host_given_back.py), when no other test needs the node.
"""

from __future__ import annotations

import base64
import json
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

pytestmark = pytest.mark.e2e("gpu-0")

# Away from the session's cluster (16000) and the lifecycle tests' (27000).
SPARE_BASE = 28000
NODE = localcluster.GPU_NODE
IMAGE = localcluster.images.PROJECT_IMAGE


@dataclass
class RealCluster:
    cluster: Cluster
    namespaces: list[str]

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, **kw)

    def namespace(self) -> str:
        name = f"real-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", name)
        self.namespaces.append(name)
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


@pytest.fixture
def real(cluster: Cluster) -> Iterator[RealCluster]:
    """The session's cluster, which must run the real node; the test's namespaces are deleted afterwards."""
    assert cluster.info.real_node == NODE, "the cluster runs without the real node (GPULANE_NODE=kwok)"
    real = RealCluster(cluster, [])
    yield real
    for ns in real.namespaces:
        real.kubectl("delete", "namespace", ns, "--wait=false", check=False)


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
    # The kubelet allocated the device through gpulane's device plugin, as a vendor's plugin would.
    device = real.kubectl("exec", "first", "-n", ns, "--", "printenv", "NVIDIA_VISIBLE_DEVICES").stdout
    assert device.strip() == "gpu0"
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


RESOLVE = """
import socket, ssl, sys, urllib.request
for name in sys.argv[1:]:
    try:
        print(name, socket.gethostbyname(name))
    except OSError as exc:
        print(name, "unresolved", type(exc).__name__)
ca = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
with urllib.request.urlopen("https://kubernetes.default.svc/livez", context=ssl.create_default_context(cafile=ca)) as r:
    print("livez", r.status)
"""


def test_cluster_dns_resolves_services_for_pods(real: RealCluster) -> None:
    """CoreDNS (from its Go module) answers the pods' queries: Services by full, namespace and short name,
    NXDOMAIN for what does not exist, and the apiserver by its in-cluster name with a verified TLS name."""
    ns = real.namespace()
    real.kubectl("create", "service", "clusterip", "named", "--tcp=80:8080", "-n", ns)
    ip = real.kubectl("get", "service", "named", "-n", ns, "-o", "jsonpath={.spec.clusterIP}").stdout
    real.pod(ns, "asker", ["python3", "-c", "import time; time.sleep(3600)"])
    real.wait_ready(ns, "asker")
    names = ["kubernetes.default.svc.cluster.local", "named", f"named.{ns}", f"nosuch.{ns}.svc.cluster.local"]
    out = real.kubectl("exec", "asker", "-n", ns, "--", "python3", "-c", RESOLVE, *names).stdout.splitlines()
    assert out == [
        "kubernetes.default.svc.cluster.local 10.96.0.1",
        f"named {ip}",
        f"named.{ns} {ip}",
        f"nosuch.{ns}.svc.cluster.local unresolved gaierror",
        "livez 200",
    ], out
    resolv = real.kubectl("exec", "asker", "-n", ns, "--", "cat", "/etc/resolv.conf").stdout
    assert f"nameserver {localcluster.host.BRIDGE_IP}" in resolv and f"search {ns}.svc.cluster.local" in resolv


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
    real.pod(ns, "talker", ["python3", "-c", "print('hello from gpu-0', flush=True); import time; time.sleep(3600)"])
    real.wait_ready(ns, "talker")
    logs = wait_until(
        lambda: "hello" in (out := real.kubectl("logs", "talker", "-n", ns).stdout) and out, timeout=20, what="logs"
    )
    assert "hello from gpu-0" in logs
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
    real: RealCluster, cluster: Cluster, tmp_path: Path
) -> None:
    again = localcluster.up(log=lambda _m: None, state_dir=cluster.info.state_dir, ports=cluster.info.ports)
    assert not again.started and again.real_node == NODE
    assert [p.pid for p in again.procs] == [p.pid for p in cluster.info.procs]
    # A cluster that runs without it: asking it for the real node is an error, and it keeps running.
    state, ports = tmp_path / "kwok-only", localcluster.Ports.from_base(SPARE_BASE)
    localcluster.up(log=lambda _m: None, state_dir=state, ports=ports, real_node=False)
    try:
        with pytest.raises(localcluster.ClusterError) as err:
            localcluster.up(log=lambda _m: None, state_dir=state, ports=ports, real_node=True)
        assert "a cluster without the real node runs in" in str(err.value)
        ok, text = localcluster.status(state_dir=state)
        assert ok, text
        assert "runtime=kwok" in text
    finally:
        localcluster.down(log=lambda _m: None, state_dir=state)


def test_missing_node_packages_are_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localcluster.node, "RUNC", str(tmp_path / "no-runc"))
    with pytest.raises(localcluster.ClusterError) as err:
        localcluster.up(
            log=lambda _m: None,
            state_dir=tmp_path / "state",
            ports=localcluster.Ports.from_base(SPARE_BASE),
            real_node=True,
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
            log=lambda _m: None, state_dir=tmp_path / "state", ports=localcluster.Ports.from_base(SPARE_BASE)
        )
    assert "another real node runs on this machine" in str(err.value)
    assert str(real.cluster.info.state_dir) in str(err.value), "the message names the holder's state dir"
    assert not (tmp_path / "state").exists()
    ok, text = localcluster.status(state_dir=real.cluster.info.state_dir)
    assert ok, text
