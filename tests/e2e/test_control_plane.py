"""Proof that the local control plane is a real one (issue 3): the apiserver validates CRD schemas, the
scheduler accounts for a kwok node's GPU and its taint, the controller-manager runs its controllers, and the
binaries carry real version stamps."""

from __future__ import annotations

import json
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from .support import Cluster, localcluster, recording_watch, wait_until

pytestmark = pytest.mark.e2e("kwok")

GPU = "nvidia.com/gpu"


def test_crd_schema_violation_is_rejected_by_the_apiserver(cluster: Cluster) -> None:
    group = f"e2e-{uuid.uuid4().hex[:6]}.gpulane.dev"
    crd = textwrap.dedent(
        f"""\
        apiVersion: apiextensions.k8s.io/v1
        kind: CustomResourceDefinition
        metadata:
          name: widgets.{group}
        spec:
          group: {group}
          scope: Namespaced
          names: {{plural: widgets, singular: widget, kind: Widget}}
          versions:
          - name: v1
            served: true
            storage: true
            schema:
              openAPIV3Schema:
                type: object
                properties:
                  spec:
                    type: object
                    required: [model]
                    properties:
                      model: {{type: string, minLength: 1}}
                      replicas: {{type: integer, minimum: 1, maximum: 5}}
        """
    )
    cluster.kubectl("apply", "-f", "-", input=crd)
    try:
        cluster.kubectl("wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=60s")

        def widget(name: str, replicas: int) -> str:
            return (
                f"apiVersion: {group}/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: default}}\n"
                f"spec: {{model: sdxl, replicas: {replicas}}}\n"
            )

        # The discovery cache of a fresh CRD can lag a moment behind Established; retry on "no matches".
        def apply_good() -> bool:
            proc = cluster.kubectl("apply", "-f", "-", input=widget("good", 3), check=False)
            assert proc.returncode == 0 or "no matches for kind" in proc.stderr, proc.stderr
            return proc.returncode == 0

        wait_until(apply_good, timeout=30, what="a valid Widget to be accepted")

        bad = cluster.kubectl("apply", "-f", "-", input=widget("bad", 10), check=False)
        assert bad.returncode != 0
        assert 'The Widget "bad" is invalid' in bad.stderr, bad.stderr
        assert "spec.replicas: Invalid value: 10" in bad.stderr, bad.stderr
        assert "should be less than or equal to 5" in bad.stderr, bad.stderr
        missing = cluster.kubectl("get", f"widgets.{group}", "bad", "-n", "default", check=False)
        assert missing.returncode != 0 and "NotFound" in missing.stderr
    finally:
        cluster.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)


@pytest.fixture
def kwok_node(core_v1: client.CoreV1Api) -> Iterator[str]:
    """A kwok node of this test's own, with one GPU and kwok's taint."""
    name = f"kwok-{uuid.uuid4().hex[:6]}"
    manifest = localcluster.gpu_node_manifest(name)
    core_v1.create_node(manifest)
    core_v1.patch_node_status(name, {"status": manifest["status"]})
    yield name
    core_v1.delete_node(name)


def _kwok_pod(name: str, node: str, gpu: bool = True, tolerate: bool = True, **meta: Any) -> client.V1Pod:
    limits = {GPU: "1"} if gpu else {}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, **meta),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="backend",
                    image="gpulane.invalid/backend:e2e",  # never pulled: kwok simulates the kubelet
                    resources=client.V1ResourceRequirements(limits=limits, requests=limits),
                )
            ],
            node_selector={"kubernetes.io/hostname": node},
            tolerations=[localcluster.KWOK_TOLERATION] if tolerate else None,
            termination_grace_period_seconds=1,
        ),
    )


def _gpu_holders(core_v1: client.CoreV1Api, node: str) -> list[str]:
    pods = core_v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return [
        f"{p.metadata.namespace}/{p.metadata.name}"
        for p in pods
        if p.status.phase not in ("Succeeded", "Failed")
        and any((c.resources.limits or {}).get(GPU) for c in p.spec.containers)
    ]


def _scheduled_condition(pod: client.V1Pod) -> Any:
    return next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)


def test_gpu_pods_are_scheduled_one_at_a_time(
    cluster: Cluster, core_v1: client.CoreV1Api, namespace: str, kwok_node: str
) -> None:
    """On a kwok node: the scheduler's accounting of nvidia.com/gpu (test_real_node checks the real one)."""
    wait_until(lambda: _ready(core_v1, kwok_node), timeout=60, what=f"node {kwok_node} Ready")
    node = core_v1.read_node(kwok_node)
    assert node.status.allocatable[GPU] == "1" and node.status.capacity[GPU] == "1"
    assert not _gpu_holders(core_v1, kwok_node)

    core_v1.create_namespaced_pod(namespace, _kwok_pod("first", kwok_node))

    def running(name: str) -> client.V1Pod | None:
        pod = core_v1.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase == "Running" else None

    first = wait_until(lambda: running("first"), timeout=60, what="pod first to be Running")
    assert first.spec.node_name == kwok_node
    assert first.status.pod_ip, "kwok gives a running pod an IP"
    assert all(cs.ready for cs in first.status.container_statuses)

    def record(kind: str, pod: client.V1Pod) -> tuple[str, str, str | None]:
        return (kind, pod.metadata.name, pod.spec.node_name)

    # Every write to the test's pods, in the order of the writes: (event, pod, its node).
    with recording_watch(core_v1.list_namespaced_pod, namespace, record=record) as writes:
        core_v1.create_namespaced_pod(namespace, _kwok_pod("second", kwok_node))

        def unschedulable() -> Any:
            cond = _scheduled_condition(core_v1.read_namespaced_pod("second", namespace))
            return cond if cond is not None and cond.status == "False" else None

        cond = wait_until(unschedulable, timeout=60, what="pod second to be marked unschedulable")
        assert cond.reason == "Unschedulable"
        assert f"Insufficient {GPU}" in cond.message, cond.message

        def failed_scheduling_event() -> Any:
            events = core_v1.list_namespaced_event(
                namespace, field_selector="involvedObject.name=second,reason=FailedScheduling"
            ).items
            return next((e for e in events if f"Insufficient {GPU}" in (e.message or "")), None)

        wait_until(failed_scheduling_event, timeout=30, what="a FailedScheduling event for pod second")

        core_v1.delete_namespaced_pod("first", namespace)
        second = wait_until(lambda: running("second"), timeout=90, what="pod second to be Running after first is gone")

        def order() -> tuple[int, int] | None:
            deleted = [i for i, (kind, name, _) in enumerate(writes) if kind == "DELETED" and name == "first"]
            bound = [i for i, (_, name, node) in enumerate(writes) if name == "second" and node]
            return (deleted[0], bound[0]) if deleted and bound else None

        # While the first pod held the GPU (until it was deleted), the scheduler bound nothing else there.
        deleted, bound = wait_until(order, timeout=30, what="the watch to see first deleted and second bound")
        assert bound > deleted, f"second was bound while first held the GPU: {writes}"
    assert second.spec.node_name == kwok_node
    with pytest.raises(client.ApiException) as gone:
        core_v1.read_namespaced_pod("first", namespace)
    assert gone.value.status == 404


def test_a_kwok_node_takes_only_pods_that_tolerate_its_taint(
    core_v1: client.CoreV1Api, namespace: str, kwok_node: str
) -> None:
    """A pod meant for real containers never lands on a kwok node, which runs none."""
    wait_until(lambda: _ready(core_v1, kwok_node), timeout=60, what=f"node {kwok_node} Ready")
    core_v1.create_namespaced_pod(namespace, _kwok_pod("untolerated", kwok_node, gpu=False, tolerate=False))

    def unschedulable() -> Any:
        cond = _scheduled_condition(core_v1.read_namespaced_pod("untolerated", namespace))
        return cond if cond is not None and cond.status == "False" else None

    cond = wait_until(unschedulable, timeout=60, what="pod untolerated to be marked unschedulable")
    assert "1 node(s) had untolerated taint(s)" in cond.message, cond.message
    taints = core_v1.read_node(kwok_node).spec.taints
    assert tuple(localcluster.KWOK_TAINT.values()) in [(t.key, t.value, t.effect) for t in taints]
    core_v1.create_namespaced_pod(namespace, _kwok_pod("tolerated", kwok_node, gpu=False))
    bound = wait_until(
        lambda: (p := core_v1.read_namespaced_pod("tolerated", namespace)).status.phase == "Running" and p,
        timeout=60,
        what="pod tolerated to be Running",
    )
    assert bound.spec.node_name == kwok_node


def _ready(core_v1: client.CoreV1Api, node: str) -> bool:
    conditions = core_v1.read_node(node).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_kwok_ready_delay_annotation_simulates_a_slow_start(
    core_v1: client.CoreV1Api, namespace: str, kwok_node: str
) -> None:
    """hack/kwok/stages.yaml: a bound pod with gpulane.dev/kwok-ready-delay stays Pending for that long."""
    wait_until(lambda: _ready(core_v1, kwok_node), timeout=60, what=f"node {kwok_node} Ready")
    pod = _kwok_pod("slow", kwok_node, gpu=False, annotations={"gpulane.dev/kwok-ready-delay": "4s"})
    core_v1.create_namespaced_pod(namespace, pod)
    bound = wait_until(
        lambda: (p := core_v1.read_namespaced_pod("slow", namespace)).spec.node_name and p,
        timeout=30,
        what="pod slow to be bound",
    )
    assert bound.spec.node_name == kwok_node
    assert bound.status.phase == "Pending"
    scheduled = _scheduled_condition(bound)
    assert scheduled is not None and scheduled.status == "True"

    def running() -> client.V1Pod | None:
        p = core_v1.read_namespaced_pod("slow", namespace)
        return p if p.status.phase == "Running" else None

    started = wait_until(running, timeout=60, what="pod slow to be Running")
    # Timestamps have one-second resolution: 4s of delay leaves at least 3s between them.
    assert (started.status.start_time - started.metadata.creation_timestamp).total_seconds() >= 3
    # kwok's status patch merges conditions by type: the scheduler's PodScheduled condition is intact.
    after = _scheduled_condition(started)
    assert after is not None and after.last_transition_time == scheduled.last_transition_time
    assert {c.type: c.status for c in started.status.conditions} == {
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }


def test_controller_manager_creates_default_service_account(cluster: Cluster, core_v1: client.CoreV1Api) -> None:
    name = f"e2e-sa-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    try:
        sa = wait_until(
            lambda: core_v1.read_namespaced_service_account("default", name),
            timeout=60,
            what=f"ServiceAccount {name}/default",
        )
        assert sa.metadata.name == "default"
        # The root-CA publisher (also kube-controller-manager) puts the cluster CA into every namespace.
        ca = wait_until(
            lambda: core_v1.read_namespaced_config_map("kube-root-ca.crt", name),
            timeout=60,
            what="ConfigMap kube-root-ca.crt",
        )
        assert ca.data["ca.crt"].startswith("-----BEGIN CERTIFICATE-----")
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_versions_are_stamped(cluster: Cluster) -> None:
    versions = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    server, kubectl = versions["serverVersion"], versions["clientVersion"]
    assert server["gitVersion"].startswith("v1.3") and server["gitVersion"] == kubectl["gitVersion"]
    assert (server["major"], server["minor"]) == tuple(server["gitVersion"][1:].split(".")[:2])
    helm = cluster.helm("version", "--template", "{{.Version}}").stdout
    assert helm.startswith("v3."), helm


def test_up_is_idempotent_and_reuses_the_running_cluster(cluster: Cluster) -> None:
    info = cluster.info
    again = localcluster.up(log=lambda _msg: None, state_dir=info.state_dir, real_node=bool(info.real_node))
    assert not again.started
    assert [p.pid for p in again.procs] == [p.pid for p in info.procs]
    ok, text = localcluster.status(state_dir=info.state_dir)
    assert ok, text


def test_rbac_is_enforced_for_a_service_account(
    cluster: Cluster, api_client: client.ApiClient, core_v1: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    """--authorization-mode=Node,RBAC: a ServiceAccount can do nothing until a Role grants it."""
    core_v1.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata={"name": "reader"}))
    kubeconfig = cluster.service_account_kubeconfig(core_v1, namespace, "reader", tmp_path / "reader.kubeconfig")

    def as_reader(*args: str) -> subprocess.CompletedProcess[str]:
        return cluster.run("kubectl", f"--kubeconfig={kubeconfig}", *args, check=False)

    who = as_reader("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
    assert who.stdout == f"system:serviceaccount:{namespace}:reader", who.stderr
    denied = as_reader("get", "pods", "-n", namespace)
    assert denied.returncode != 0
    assert f'User "system:serviceaccount:{namespace}:reader" cannot list resource "pods"' in denied.stderr

    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader-reads-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    wait_until(lambda: as_reader("get", "pods", "-n", namespace).returncode == 0, what="the RoleBinding to apply")
    # Only what the Role grants: pods in this namespace, nothing else.
    assert as_reader("get", "pods", "-n", "default").returncode != 0
    assert as_reader("get", "configmaps", "-n", namespace).returncode != 0


@pytest.mark.e2e("gpu-0")  # its pods run on the real node
def test_helm_installs_a_chart_and_waits_for_its_deployment(
    cluster: Cluster, core_v1: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    """Helm's kubeVersion check sees the stamped version, and `--wait` sees a Deployment become available:
    kube-controller-manager makes the ReplicaSet and Pods, kube-scheduler binds them to the real node gpu-0
    (never to a tainted kwok node), and its kubelet runs them."""
    chart = tmp_path / "e2e-chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: e2e-chart\nversion: 0.1.0\nkubeVersion: '>=1.30.0-0'\n")
    (chart / "templates" / "deployment.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: apps/v1
            kind: Deployment
            metadata:
              name: {{ .Release.Name }}-backend
            spec:
              replicas: 2
              selector:
                matchLabels: {app: {{ .Release.Name }}-backend}
              template:
                metadata:
                  labels: {app: {{ .Release.Name }}-backend}
                spec:
                  terminationGracePeriodSeconds: 1
                  containers:
                  - name: backend
                    image: IMAGE_REF
                    imagePullPolicy: Never
                    command: [python3, -c, "import time; time.sleep(3600)"]
            """
        ).replace("IMAGE_REF", localcluster.images.PROJECT_IMAGE)
    )
    cluster.helm("install", "demo", str(chart), "-n", namespace, "--wait", "--timeout", "90s")
    status = json.loads(cluster.helm("status", "demo", "-n", namespace, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    pods = core_v1.list_namespaced_pod(namespace, label_selector="app=demo-backend").items
    assert len(pods) == 2
    assert all(p.status.phase == "Running" and p.spec.node_name == "gpu-0" for p in pods)

    too_new = chart / "Chart.yaml"
    too_new.write_text("apiVersion: v2\nname: e2e-chart\nversion: 0.1.1\nkubeVersion: '>=9.0.0-0'\n")
    refused = cluster.helm("upgrade", "demo", str(chart), "-n", namespace, check=False)
    assert refused.returncode != 0
    assert "is incompatible with Kubernetes v1.37" in refused.stderr, refused.stderr
    cluster.helm("uninstall", "demo", "-n", namespace, "--wait", "--timeout", "60s")
