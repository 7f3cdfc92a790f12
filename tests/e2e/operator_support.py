"""The operator as its own process, and a small world of GpuLanes, GpuModels and GpuJobs around it.

Every test gets its own kwok GPU node(s), lanes and models under unique names, so tests never share
a GPU (kwok nodes are tainted, and their lanes tolerate it); its jobs live in the test's namespace. Tests
of real backend pods use the cluster's real node gpu-0 (``World.real_lane``, ``World.real_model``).
Objects are created with kubectl from real manifests and observed through the API, never through the
operator's internals.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import yaml
from kubernetes import client

from .support import REPO, Cluster, ServingCert, localcluster, recording_watch, wait_until

from suite_groups import free_port  # isort: skip  (tests/, put on sys.path by .support)

GROUP, VERSION = "gpulane.io", "v1alpha1"
API = f"{GROUP}/{VERSION}"
OPERATOR_NAMESPACE = "gpulane-system"
READY_DELAY = "gpulane.dev/kwok-ready-delay"


PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork: the child only calls it


def _die_with_parent() -> None:
    """In the child: SIGKILL it when the test process dies, even killed, so that a stray operator never
    outlives its session and dispatches the next session's jobs (seen: its writes refused as written once)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class GpulaneProcess:
    """A ``gpulane`` command as its own process with the admin kubeconfig; its log is kept for failures."""

    name = "gpulane"
    uses_cluster = True

    def __init__(self, cluster: Cluster, log_dir: Path, *extra: str) -> None:
        self.cluster = cluster
        self.port = free_port()
        self.log_path = log_dir / f"{self.name}-{self.port}.log"
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> Self:
        return self.launch().wait_ready()

    def launch(self) -> Self:
        """Start the process without waiting for it: several launched together start in parallel."""
        argv = [str(REPO / ".venv" / "bin" / "gpulane"), *self.argv()]
        if self.uses_cluster:
            argv += ["--kubeconfig", str(self.cluster.kubeconfig)]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([*argv, *self.extra], stdout=log, stderr=subprocess.STDOUT, env=self.cluster.env(),
                                     preexec_fn=_die_with_parent)  # fmt: skip
        log.close()
        return self

    def wait_ready(self) -> Self:
        try:
            wait_until(self._ready, timeout=60, what=f"{self.name} ready on port {self.port}")
        except AssertionError as err:
            err.add_note(f"{self.name}'s log ({self.log_path}):\n{self.log_tail()}")
            raise
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            return self.ready()
        except OSError:
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers run, exactly like a node failure or an OOM kill."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        return localcluster.tail(self.log_path, lines)


class HttpProcess(GpulaneProcess):
    """A ``gpulane`` server on 127.0.0.1 (``url``), ready once ``ready_path`` answers 200."""

    ready_path = "/readyz"

    def ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}{self.ready_path}", timeout=5) as resp:
            return bool(resp.status == 200)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class OperatorProcess(GpulaneProcess):
    """``gpulane operator``; ready once its /readyz answers."""

    name = "operator"

    def argv(self) -> list[str]:
        return ["operator", "--namespace", OPERATOR_NAMESPACE, "--host", "127.0.0.1", "--port", str(self.port)]

    def ready(self) -> bool:
        return self.get("/readyz")[0] == 200

    def leads(self) -> bool:
        """Running and holding its Lease (its gpulane_leader gauge)."""
        return self.running() and self.metrics().get("gpulane_leader") == 1.0

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics as ``name{labels}`` -> value."""
        status, text = self.get("/metrics")
        assert status == 200, text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples


class WebhookProcess(GpulaneProcess):
    """``gpulane webhook`` serving TLS on 127.0.0.1 with ``tls``'s certificate; ready once it completes a
    TLS handshake with that CA."""

    name = "webhook"

    def __init__(self, cluster: Cluster, log_dir: Path, tls: ServingCert, *extra: str) -> None:
        super().__init__(cluster, log_dir, *extra)
        self.tls = tls
        self.liveness = free_port()

    def argv(self) -> list[str]:
        return [
            "webhook", "--host", "127.0.0.1", "--port", str(self.port),
            "--cert-file", str(self.tls.cert_file), "--key-file", str(self.tls.key_file),
            "--liveness", f"http://127.0.0.1:{self.liveness}/healthz",
        ]  # fmt: skip

    def ready(self) -> bool:
        return tls_ready(self.port, self.tls)


def tls_ready(port: int, tls: ServingCert) -> bool:
    """A TLS handshake with 127.0.0.1:port succeeds and its certificate chains to ``tls``'s CA."""
    context = ssl.create_default_context(cadata=tls.ca_pem.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        context.wrap_socket(sock, server_hostname="127.0.0.1").close()
    return True


class BridgeProcess(HttpProcess):
    """``gpulane bridge`` for one namespace (its calls' jobs, and the kubectl jobs it executes), with a keys
    file and endpoint overrides; ready on /readyz."""

    name = "bridge"

    def __init__(self, cluster: Cluster, log_dir: Path, namespace: str, keys_file: Path, *extra: str) -> None:
        super().__init__(cluster, log_dir, *extra)
        self.namespace, self.keys_file = namespace, keys_file

    def argv(self) -> list[str]:
        return [
            "bridge", "--namespace", self.namespace, "--keys-file", str(self.keys_file),
            "--host", "127.0.0.1", "--port", str(self.port), "--replica", f"e2e-{self.port}",
            "--execute-namespace", self.namespace, "--backend-namespace", OPERATOR_NAMESPACE,
            "--drain-seconds", "0",  # stop() as before the drain: calls in hand are cancelled at once
        ]  # fmt: skip


class UiProcess(HttpProcess):
    """``gpulane ui``: the web page, with the bridge's keys file for ``namespace``; ready once its first lists are
    done (/healthz)."""

    name = "ui"
    ready_path = "/healthz"

    def __init__(self, cluster: Cluster, log_dir: Path, namespace: str, keys_file: Path, *extra: str) -> None:
        super().__init__(cluster, log_dir, *extra)
        self.namespace, self.keys_file = namespace, keys_file

    def argv(self) -> list[str]:
        return ["ui", "--bridge-namespace", self.namespace, "--keys-file", str(self.keys_file),
                "--host", "127.0.0.1", "--port", str(self.port)]  # fmt: skip


class FakeBackendProcess(HttpProcess):
    """``gpulane fake-backend``: an OpenAI-compatible model server on 127.0.0.1, ready when /health is 200."""

    name = "fake-backend"
    uses_cluster = False
    ready_path = "/health"

    def argv(self) -> list[str]:
        return ["fake-backend", "--host", "127.0.0.1", "--port", str(self.port)]

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=5) as resp:
            return dict(json.loads(resp.read()))


class World:
    """A test's GPU nodes, lanes, models and jobs, created with kubectl and cleaned up afterwards."""

    def __init__(self, cluster: Cluster, api: client.ApiClient, namespace: str) -> None:
        self.cluster = cluster
        self.api = api
        self.namespace = namespace
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.tag = uuid.uuid4().hex[:5]
        self.nodes: list[str] = []
        self.real_lanes: list[str] = []
        self.cluster_objects: list[tuple[str, str]] = []  # (plural, name)

    def name(self, stem: str) -> str:
        return f"{stem}-{self.tag}"

    def apply(self, *docs: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    # -- cluster-scoped objects ------------------------------------------------------------------

    def node(self, stem: str = "gpu") -> str:
        """A new kwok node with one GPU; its name is returned."""
        name = self.name(stem)
        manifest = localcluster.gpu_node_manifest(name)
        self.core.create_node(manifest)
        self.core.patch_node_status(name, {"status": manifest["status"]})
        self.nodes.append(name)
        wait_until(lambda: self._node_ready(name), timeout=60, what=f"node {name} Ready")
        return name

    def _node_ready(self, name: str) -> bool:
        node = self.core.read_node(name)
        gpus = (node.status.allocatable or {}).get("nvidia.com/gpu")
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        return ready and gpus == "1"

    def lane(self, stem: str = "lane", node: str | None = None, labels: dict[str, str] | None = None) -> str:
        """A lane on ``node``, by default on a new kwok node of its own (tolerating the kwok taint)."""
        name = self.name(stem)
        node = node or self.node(f"{stem}-gpu")
        spec: dict[str, Any] = {"nodeName": node}
        if node in self.nodes:
            spec["tolerations"] = [localcluster.KWOK_TOLERATION]
        meta = {"name": name, "labels": labels or {}}
        self.apply({"apiVersion": API, "kind": "GpuLane", "metadata": meta, "spec": spec})
        self.cluster_objects.append(("gpulanes", name))
        return name

    def model(self, stem: str, *, ready_delay: str = "1s", labels: dict[str, str] | None = None, **spec: Any) -> str:
        name = self.name(stem)
        body = {
            "image": f"example.invalid/{stem}:1",
            "podAnnotations": {READY_DELAY: ready_delay},
            "expectedRunSeconds": 30,
            **spec,
        }
        meta = {"name": name, "labels": labels or {}}
        self.apply({"apiVersion": API, "kind": "GpuModel", "metadata": meta, "spec": body})
        self.cluster_objects.append(("gpumodels", name))
        return name

    def real_lane(self, stem: str = "real") -> str:
        """A lane on the cluster's real node gpu-0, whose backend pods really run. Tests take turns on its
        one GPU: ``cleanup`` waits until the lane's pod is gone."""
        if not self.cluster.info.real_node:
            raise AssertionError("this test needs the real node gpu-0; the cluster runs with GPULANE_NODE=kwok")
        self.real_lanes.append(name := self.lane(stem, node=localcluster.GPU_NODE))
        return name

    def real_model(self, stem: str, load_seconds: float = 1.0, request_seconds: float = 0.0, **spec: Any) -> str:
        """A GpuModel served by ``gpulane fake-backend`` from the project's image (imported by ``make images``):
        its pod is Ready once the server has "loaded" (``/health`` answers 503 for ``load_seconds``), and
        each call takes ``request_seconds``."""
        name = self.name(stem)
        args = ["fake-backend", "--host", "0.0.0.0", "--port", "8000", "--model", name,
                "--load-seconds", str(load_seconds), "--chunk-delay", "0.01",
                "--request-seconds", str(request_seconds)]  # fmt: skip
        body = {"image": localcluster.images.PROJECT_IMAGE, "args": args, "loadTimeoutSeconds": 60,
                "expectedRunSeconds": 5, **spec}  # fmt: skip
        self.apply({"apiVersion": API, "kind": "GpuModel", "metadata": {"name": name}, "spec": body})
        self.cluster_objects.append(("gpumodels", name))
        return name

    # -- jobs --------------------------------------------------------------------------------------

    def job_doc(self, name: str, model: str, **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": API,
            "kind": "GpuJob",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"model": model, **spec},
        }

    def job(self, name: str, model: str, **spec: Any) -> str:
        self.apply(self.job_doc(name, model, **spec))
        return name

    def jobs(self, selector: str | None = None) -> list[dict[str, Any]]:
        """The namespace's GpuJobs (those matching the label ``selector``, if given)."""
        found = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "gpujobs", label_selector=selector or ""
        )
        return list(found["items"])

    def get(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "gpujobs", name)
        return body

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def cluster_status(self, plural: str, name: str) -> dict[str, Any]:
        """The status of a GpuLane, GpuModel or GpuPolicy."""
        body = self.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
        return dict(body.get("status") or {})

    def erase_status(self, name: str, *fields: str, plural: str = "gpujobs") -> None:
        """Remove ``fields`` from the status of GpuJob ``name`` (or of the cluster-scoped ``plural`` object
        ``name``), as if never written. Done while the operator is down, it makes the values that a test
        waits for after the restart provably the new process's writes, not the old one's."""
        patch = {"status": dict.fromkeys(fields)}  # a merge patch's null removes the field
        kind = "application/merge-patch+json"
        if plural == "gpujobs":
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, plural, name, patch, _content_type=kind
            )
        else:
            self.custom.patch_cluster_custom_object_status(GROUP, VERSION, plural, name, patch, _content_type=kind)
        status = self.status(name) if plural == "gpujobs" else self.cluster_status(plural, name)
        assert not set(fields) & set(status), f"{plural}/{name} still has {fields}: {status}"

    def wait_phase(self, name: str, *phases: str, timeout: float = 60) -> dict[str, Any]:
        return wait_until(
            lambda: (s := self.status(name)).get("phase") in phases and s,
            timeout=timeout,
            what=f"GpuJob {name} in phase {'/'.join(phases)}",
        )

    def complete(self, name: str, phase: str = "Succeeded") -> None:
        """What an executor does when the job's work is done: Running -> Succeeded, through the status."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        patch = [
            {"op": "test", "path": "/status/phase", "value": "Running"},
            {"op": "replace", "path": "/status/phase", "value": phase},
            {"op": "add", "path": "/status/finishedAt", "value": now},
        ]
        # Bounded: the chaos run's executor calls this through apiserver and etcd restarts, and the client's
        # calls have no timeout of their own (one that hung would hold a lane Running for good).
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, "gpujobs", name, patch, _content_type="application/json-patch+json",
            _request_timeout=30,
        )  # fmt: skip

    def run_through(self, names: set[str], timeout: float = 90) -> list[str]:
        """Act as the executor: complete whichever job is Running until all of ``names`` ran; return the order."""
        order: list[str] = []
        deadline = time.monotonic() + timeout
        while set(order) != names:
            if time.monotonic() > deadline:
                left = {n: {k: self.status(n).get(k) for k in ("phase", "reason")} for n in names - set(order)}
                raise AssertionError(f"only {order} ran of {sorted(names)}; the others: {left}")
            running = [j["metadata"]["name"] for j in self.jobs() if (j.get("status") or {}).get("phase") == "Running"]
            for name in running:
                if name not in order:
                    order.append(name)
                self.complete(name)
            if not running:
                time.sleep(0.1)
        return order

    def events(self, name: str) -> list[client.CoreV1Event]:
        selector = f"involvedObject.name={name},involvedObject.kind=GpuJob"
        return list(self.core.list_namespaced_event(self.namespace, field_selector=selector).items)

    def wait_events(self, name: str, reason: str, timeout: float = 30) -> list[client.CoreV1Event]:
        """The job's Events of ``reason``, once there is one: the operator posts them after its status write."""
        return wait_until(
            lambda: [e for e in self.events(name) if e.reason == reason],
            timeout=timeout,
            what=f"a {reason} Event on {name}",
        )

    def backend_pods(self, lane: str) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(OPERATOR_NAMESPACE).items
        return [p for p in pods if (p.metadata.annotations or {}).get("gpulane.io/lane") == lane]

    # -- cleanup -----------------------------------------------------------------------------------

    def strip_finalizers(self, threads: int = 16) -> None:
        """Jobs keep a finalizer while the operator owns them (admission gives it to each new one); without an
        operator, remove it by hand, from ``threads`` at once (a bench's 100,000 jobs)."""

        def strip(name: str) -> None:
            with contextlib.suppress(client.ApiException):
                self.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "gpujobs", name, {"metadata": {"finalizers": None}}
                )

        held = [job["metadata"]["name"] for job in self.jobs() if job["metadata"].get("finalizers")]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(strip, held))

    def cleanup(self) -> None:
        self.strip_finalizers()
        for plural, name in reversed(self.cluster_objects):
            with contextlib.suppress(client.ApiException):
                self.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        for node in self.nodes:
            with contextlib.suppress(client.ApiException):
                self.core.delete_node(node)
        for lane in self.real_lanes:
            wait_until(lambda lane=lane: not self.backend_pods(lane), timeout=60, what=f"lane {lane}'s pod gone")


def pod_watch(core: client.CoreV1Api, lane: str) -> contextlib.AbstractContextManager[list[tuple[str, str, str]]]:
    """Records (event type, pod name, uid) of every backend pod of ``lane`` in the operator's namespace."""

    def record(kind: str, pod: client.V1Pod) -> tuple[str, str, str] | None:
        if (pod.metadata.annotations or {}).get("gpulane.io/lane") != lane:
            return None
        return (kind, pod.metadata.name, pod.metadata.uid)

    return recording_watch(core.list_namespaced_pod, OPERATOR_NAMESPACE, record=record)


def phase_watch(world: World) -> contextlib.AbstractContextManager[list[tuple[str, str | None]]]:
    """Records (job, phase) of every write to a GpuJob of the world's namespace, in the order of the writes;
    ``first_write`` finds one in it."""
    return recording_watch(
        world.custom.list_namespaced_custom_object, GROUP, VERSION, world.namespace, "gpujobs",
        record=lambda _kind, job: (job["metadata"]["name"], (job.get("status") or {}).get("phase")),
    )  # fmt: skip


def first_write(seen: list[tuple[str, str | None]], job: str, *phases: str, timeout: float = 30) -> int:
    """The index in ``phase_watch``'s record of the first write that shows ``job`` in one of ``phases``,
    once the watch has delivered it: compare two to tell which write came first."""
    return wait_until(
        lambda: [i for i, (name, phase) in enumerate(seen) if name == job and phase in phases][:1],
        timeout=timeout,
        what=f"the watch to see GpuJob {job} in phase {'/'.join(phases)}",
    )[0]
