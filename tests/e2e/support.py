"""Helpers for the end-to-end suite that are not fixtures: polling, TLS material for webhooks on the host,
and a small HTTPS admission webhook server. Later suites (gpulane's admission webhook, the bridge, the
Helm chart) reuse them."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID
from kubernetes import watch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))
if str(REPO / "tests") not in sys.path:  # suite_groups, for the benches that import this support too
    sys.path.insert(0, str(REPO / "tests"))

import gpulane_cluster as localcluster  # noqa: E402  (lives in hack/, which is not a package)

__all__ = [
    "AdmissionWebhookServer",
    "Cluster",
    "CommandFailed",
    "ServingCert",
    "localcluster",
    "make_serving_cert",
    "recording_watch",
    "wait_until",
]

T = TypeVar("T")


class CommandFailed(AssertionError):
    def __init__(self, argv: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"{' '.join(argv)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        self.proc = proc


@dataclass
class Cluster:
    """A running local control plane, as seen by the tests."""

    info: localcluster.ClusterInfo
    started_here: bool

    @property
    def kubeconfig(self) -> Path:
        return self.info.kubeconfig

    @property
    def bindir(self) -> Path:
        return self.info.bindir

    @property
    def logs(self) -> Path:
        return self.info.state_dir / "logs"

    def binary(self, name: str) -> Path:
        """Path of a pinned tool: kubectl, helm, kwok, etcd, kube-apiserver, ..."""
        return self.bindir / name

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.info.env()}

    def run(
        self, tool: str, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary(tool)), *args]
        proc = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, env=self.env(), check=False
        )
        if check and proc.returncode != 0:
            raise CommandFailed(argv, proc)
        return proc

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl with the cluster's kubeconfig. With check=True a non-zero exit fails the
        test with stdout and stderr; with check=False the caller inspects returncode/stderr."""
        return self.run("kubectl", f"--kubeconfig={self.kubeconfig}", *args, input=input, check=check, timeout=timeout)

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return self.run("helm", f"--kubeconfig={self.kubeconfig}", *args, input=input, check=check, timeout=timeout)

    def service_account_kubeconfig(
        self, core_v1: Any, namespace: str, name: str, path: Path, expiration_seconds: int = 3600
    ) -> Path:
        """Write a kubeconfig at ``path`` that authenticates as ServiceAccount ``namespace/name`` with a
        bound token from the TokenRequest API, for running a component (the operator, say) with exactly
        that account's RBAC. ``core_v1`` is a kubernetes.client.CoreV1Api with admin rights."""
        from kubernetes import client as k8s

        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
        )
        token = core_v1.create_namespaced_service_account_token(name, namespace, request).status.token
        user = f"system:serviceaccount:{namespace}:{name}"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpulane-local",
                    "cluster": {
                        "server": self.info.server,
                        "certificate-authority": str(self.info.state_dir / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": "gpulane-local", "user": user, "namespace": namespace}}],
            "current-context": user,
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path


def _probe_is_broken(exc: Exception) -> bool:
    """Errors no retry can fix: the probe's own code is wrong, or the probe has decided (its assert)."""
    if isinstance(exc, (NameError, ImportError)):
        return True
    if isinstance(exc, AttributeError):
        return exc.obj is not None  # a typo on a real object; on a None it is a field not written yet
    return isinstance(exc, AssertionError) and not isinstance(exc, CommandFailed)


def wait_until(
    probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2, what: str = "condition"
) -> T:
    """Call ``probe`` until it returns something truthy and return that; fail the test after ``timeout``.

    An exception from the probe counts as "not yet": while the thing waited for is not there, a probe
    meets the API's errors (404 until an object exists, 403 until RBAC catches up), a server still
    starting, a kubectl that fails (``CommandFailed``), or a field not yet written (KeyError, IndexError,
    a TypeError or AttributeError on a None). Where no retry can help, it fails at once with the probe's
    own traceback: a NameError or ImportError, an AttributeError on an object that is not None (a typo),
    and an AssertionError other than a failed command (the probe asserted; ``GpulaneProcess`` does when
    its process exited). A KeyError or TypeError from a typo is still retried, as it looks like a field
    not yet written; on timeout the message has the last value and the last exception, chained, so that
    its traceback shows where the probe failed.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    error: Exception | None = None
    calls = failures = 0
    while True:
        calls += 1
        try:
            value = probe()
        except Exception as exc:
            if _probe_is_broken(exc):
                exc.add_note(f"raised by the probe of wait_until (waiting for {what}): not retried")
                raise
            value, last, error = None, exc, exc
            failures += 1
        else:
            last = value
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}"
            if error is not None:
                message += f"\n{failures} of {calls} probes raised; the last raised {error!r}"
            raise AssertionError(message) from error
        time.sleep(interval)


@contextlib.contextmanager
def recording_watch(
    list_fn: Callable[..., Any], *args: Any, record: Callable[[str, Any], T | None]
) -> Iterator[list[T]]:
    """Watch ``list_fn(*args)`` (e.g. ``core.list_namespaced_pod, namespace``) in a thread and keep
    ``record(event type, object)`` of each event from now on, unless it is None. A watch delivers events in
    the order of the writes, so the list orders writes by different writers: what happened first."""
    seen: list[T] = []
    stop = threading.Event()
    rv = _resource_version(list_fn(*args))

    def run() -> None:
        nonlocal rv
        while not stop.is_set():
            try:
                for event in watch.Watch().stream(list_fn, *args, resource_version=rv, timeout_seconds=2):
                    obj = event["object"]
                    rv = _resource_version(obj)
                    if (kept := record(event["type"], obj)) is not None:
                        seen.append(kept)
            except Exception:  # a dropped connection: resume from the last version seen
                time.sleep(0.2)

    thread = threading.Thread(target=run, name="e2e-watch", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(5)


def _resource_version(obj: Any) -> str:
    """Of a list or an object, as the official client returns them: models, or dicts for custom objects."""
    return str(obj["metadata"]["resourceVersion"] if isinstance(obj, dict) else obj.metadata.resource_version)


@dataclass
class ServingCert:
    """A throwaway CA and a server certificate signed by it, written to ``directory``."""

    directory: Path
    ca_pem: bytes
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx


def make_serving_cert(
    ips: tuple[str, ...] = ("127.0.0.1",), dns: tuple[str, ...] = ("localhost",), directory: Path | None = None
) -> ServingCert:
    """A CA plus a serving certificate with the given IP and DNS SANs (the apiserver checks the IP SAN
    when a webhook's clientConfig.url is https://127.0.0.1:PORT/...)."""
    directory = directory or Path(tempfile.mkdtemp(prefix="gpulane-e2e-tls-"))
    ca_key, ca = localcluster.new_ca("gpulane-e2e-webhook-ca", days=1)
    key = localcluster.new_key()
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    sans += [x509.DNSName(name) for name in dns]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpulane-e2e-webhook")])
    cert = localcluster.issue_cert(ca_key, ca, key, subject, server=True, sans=sans, days=1)
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ServingCert(directory, ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file)


Decision = Callable[[dict[str, Any]], tuple[bool, str]]


@dataclass
class AdmissionWebhookServer:
    """An HTTPS server on 127.0.0.1 (ephemeral port) that answers AdmissionReview v1 requests with
    ``decide(request) -> (allowed, message)`` and keeps every review it received."""

    decide: Decision
    tls: ServingCert = field(default_factory=make_serving_cert)
    reviews: list[dict[str, Any]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.server_address[1])

    def url(self, path: str = "/validate") -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def start(self) -> AdmissionWebhookServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                review = json.loads(body)
                owner.reviews.append(review)
                request = review.get("request", {})
                allowed, message = owner.decide(request)
                response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": allowed}
                if not allowed:
                    response["status"] = {"code": 403, "message": message}
                out = json.dumps(
                    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.socket = self.tls.server_context().wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="e2e-webhook", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
