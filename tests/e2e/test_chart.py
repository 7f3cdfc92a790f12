"""The Helm chart (charts/gpulane) installed with the pinned helm on the local cluster, whose gpu-0 is a
real kubelet node: the operator, webhook and bridge run from the project image with only the chart's RBAC.

The chart's operator acts on every GpuLane of the cluster (as every gpulane operator does), so this file
must not run beside another operator: the suite runs its tests one after another, and the test that
installs it stops the session's operator first (``no_operator``). The webhook configurations select only
this test's namespace, and everything is removed in a ``finally`` even when the test fails: a dangling
configuration with ``failurePolicy: Fail`` would break every later test.
"""

from __future__ import annotations

import hashlib
import http.cookiejar
import json
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from kubernetes import client

from gpulane import __version__
from gpulane.admission import cel
from gpulane.api.contract import COMPONENT_LABEL, MANAGED_BY
from gpulane.api.kinds import KINDS
from gpulane.api.times import parse_time
from gpulane.fakes.backend import fake_bytes

from .operator_support import World
from .support import REPO, Cluster, localcluster, wait_until

pytestmark = pytest.mark.e2e("kwok")

CHART = REPO / "charts" / "gpulane"
BRIDGE_KEY = "sk-chart-e2e-key"
SELECTOR_LABEL = "gpulane.io/chart-test"


def pods_of(core: client.CoreV1Api, namespace: str, release: str) -> dict[str, client.V1Pod]:
    """The release's pods by component (operator, webhook, bridge)."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={release}").items
    return {p.metadata.labels["app.kubernetes.io/component"]: p for p in pods if not p.metadata.deletion_timestamp}


def backend_pods(core: client.CoreV1Api, namespace: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=backend").items)


def ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def can_i(cluster: Cluster, account: str, *args: str) -> str:
    proc = cluster.kubectl("auth", "can-i", *args, "--as", account, check=False)
    return proc.stdout.strip()


def leftovers(cluster: Cluster, namespace: str, release: str) -> dict[str, str]:
    """Everything of the release that still exists, by kind (namespaced and cluster-scoped)."""
    selector = f"app.kubernetes.io/instance={release}"
    found = {}
    for kind, scope in [
        ("deployments,services,serviceaccounts,secrets,roles,rolebindings,pods", ["-n", namespace]),
        (
            "namespaces,clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations",
            [],
        ),
        ("gpupolicies", []),
    ]:
        out = cluster.kubectl("get", kind, *scope, "-l", selector, "-o", "name").stdout.strip()
        if out:
            found[kind] = out
    return found


def diagnose(cluster: Cluster, namespace: str, release: str) -> str:
    """The release's pods and the last lines of their logs (the current and the previous container)."""
    selector = f"app.kubernetes.io/instance={release}"
    parts = [cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout]
    for previous in ("--previous=false", "--previous=true"):
        proc = cluster.kubectl("logs", "-n", namespace, "-l", selector, "--tail=15", "--prefix", previous, check=False)
        parts.append(proc.stdout + proc.stderr)
    return "\n".join(parts)


def tenant_call(cluster: Cluster, namespace: str, endpoint: str) -> str:
    """What a plain pod in ``namespace`` on gpu-0 gets when it POSTs a chat completion to ``endpoint`` (a
    backend's URL) directly: "answered <status>", "refused" when its connection is refused or times out,
    else "failed <error>"."""
    script = (
        "import json, socket, urllib.error, urllib.request\n"
        f"req = urllib.request.Request('{endpoint}/v1/chat/completions', data=json.dumps("
        "{'model': 'm', 'messages': [{'role': 'user', 'content': 'no job'}]}).encode(), "
        "headers={'Content-Type': 'application/json'})\n"
        "try:\n    print('answered', urllib.request.urlopen(req, timeout=5).status)\n"
        "except urllib.error.HTTPError as err:\n    print('answered', err.code)\n"
        "except urllib.error.URLError as err:\n"
        "    cut = isinstance(err.reason, (ConnectionRefusedError, socket.timeout, TimeoutError))\n"
        "    print('refused' if cut else f'failed {err.reason!r}')\n"
        "except TimeoutError:\n    print('refused')\n"
    )
    name = f"tenant-{uuid.uuid4().hex[:6]}"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
           "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": localcluster.GPU_NODE},
                    "containers": [{"name": "call", "image": f"gpulane.local/gpulane:{__version__}",
                                    "imagePullPolicy": "Never", "command": ["python3", "-c", script]}]}}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    try:
        cluster.kubectl("wait", "pod", name, "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded",
                        "--timeout=60s")  # fmt: skip
        return cluster.kubectl("logs", name, "-n", namespace).stdout.strip().splitlines()[-1]
    finally:
        cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false", check=False)


def remove_release(cluster: Cluster, namespace: str, release: str, fullname: str) -> None:
    """Uninstall, then delete whatever cluster-scoped object could outlive a failed uninstall."""
    cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s", check=False)
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, fullname, "--ignore-not-found")
    selector = f"app.kubernetes.io/instance={release}"
    cluster.kubectl("delete", "clusterrolebindings,clusterroles", "-l", selector, "--ignore-not-found")


@pytest.mark.e2e("gpu-0")  # its pods run on the real node
def test_the_chart_installs_gpulane_on_the_real_node(
    cluster: Cluster,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    namespace: str,
    tmp_path: Path,
    no_operator: None,
) -> None:
    if not cluster.info.real_node:
        raise AssertionError("this test needs the real node gpu-0; the cluster runs with GPULANE_NODE=kwok")
    tag = f"t{uuid.uuid4().hex[:6]}"  # a letter first: YAML must never read it as a number
    release = f"gl-{tag}"
    fullname = f"{release}-gpulane"
    operator_sa = f"system:serviceaccount:{namespace}:{fullname}-operator"
    backends = f"{namespace}-backends"  # the chart's namespace for backend pods
    # GpuJobs of this namespace only go through the chart's webhook.
    cluster.kubectl("label", "namespace", namespace, f"{SELECTOR_LABEL}={tag}")
    # The results volume: a hostPath PersistentVolume bound to the claim the values name (gpu-0 is this host).
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    results_dir.chmod(0o777)  # the bridge runs as uid 65532; hostPath ignores fsGroup
    world_pv = f"{release}-results"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": world_pv},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                  "hostPath": {"path": str(results_dir), "type": "Directory"},
                  "claimRef": {"namespace": namespace, "name": "results"}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "results", "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": world_pv,
                  "resources": {"requests": {"storage": "1Gi"}}}},
    ]))  # fmt: skip
    # The webhook and one bridge replica, not the defaults: this test follows the webhook's TLS and warnings,
    # and one bridge pod through a rollout. The chaos run installs the defaults (policies, two bridges).
    values = {
        "admission": {"mode": "webhook"},
        "webhook": {"namespaceSelector": {SELECTOR_LABEL: tag}},
        "bridge": {
            "enabled": True,
            "replicas": 1,
            "keys": {"inline": {"keys": [{"name": "chart", "key": BRIDGE_KEY, "member": "chart"}]}},
            "executeNamespaces": [namespace],
            "results": {"enabled": True, "existingClaim": "results"},
        },
        "ui": {"enabled": True},
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    world = World(cluster, api_client, namespace)
    started = time.monotonic()
    try:
        # The release creates GpuPolicy "default" itself, so none may exist before (another test's).
        cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")
        install = cluster.helm("install", release, str(CHART), "-n", namespace, "-f", str(values_file),
                               "--wait", "--timeout", "180s", check=False)  # fmt: skip
        assert install.returncode == 0, f"{install.stderr}\n{diagnose(cluster, namespace, release)}"
        installed = time.monotonic() - started

        # 1. Every component runs on the real node and is Ready.
        pods = pods_of(core_v1, namespace, release)
        assert set(pods) == {"operator", "webhook", "bridge", "ui"}, sorted(pods)
        for component, pod in pods.items():
            assert pod.spec.node_name == localcluster.GPU_NODE, (component, pod.spec.node_name)
            assert ready(pod), (component, pod.status.conditions)
            container = pod.spec.containers[0]
            assert container.image == f"gpulane.local/gpulane:{__version__}"  # the tag defaults to appVersion
            assert container.security_context.read_only_root_filesystem is True
            if pod.status.container_statuses[0].restart_count:
                previous = cluster.kubectl("logs", "-n", namespace, pod.metadata.name, "--previous", "--tail=40",
                                           check=False)  # fmt: skip
                raise AssertionError(f"{component} restarted; its previous log:\n{previous.stdout}{previous.stderr}")

        # Two operator replicas: one holds the Lease (its identity starts with its pod's name), one stands by.
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"
        operators = [p.metadata.name for p in core_v1.list_namespaced_pod(namespace, label_selector=selector).items]
        lease = json.loads(cluster.kubectl("get", "lease", "gpulane-operator", "-n", namespace, "-o", "json").stdout)
        assert len(operators) == 2 and lease["spec"]["holderIdentity"].rsplit("-", 1)[0] in operators, lease

        # An upgrade keeps the webhook's certificate (looked up) and so its caBundle.
        def bundle() -> str:
            hooks = cluster.kubectl("get", "validatingwebhookconfiguration", fullname, "-o", "json").stdout
            return str(json.loads(hooks)["webhooks"][0]["clientConfig"]["caBundle"])

        before = bundle()
        cluster.helm("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--wait", "--timeout", "120s")
        assert bundle() == before
        secret = core_v1.read_namespaced_secret(f"{fullname}-webhook-tls", namespace)
        assert secret.data["ca.crt"] == before

        # 2. The chart's operator dispatches a job onto a kwok lane, its backend pod in the chart's backend
        #    namespace, with Pod Security baseline enforced, and lets the executor complete it.
        labels = core_v1.read_namespace(backends).metadata.labels
        assert labels["pod-security.kubernetes.io/enforce"] == "baseline", labels
        lane = world.lane()
        model = world.model("chart")
        world.job("first", model)
        status = world.wait_phase("first", "Running", timeout=90)
        assert status.get("lane") == lane, status
        backend = backend_pods(core_v1, backends)
        assert [p.metadata.annotations.get("gpulane.io/lane") for p in backend] == [lane]
        world.wait_events("first", "Dispatched")
        world.complete("first")
        assert world.wait_phase("first", "Succeeded")["phase"] == "Succeeded"
        wait_until(lambda: not world.get("first")["metadata"].get("finalizers"), what="the finalizer removed")

        # 3. The webhook, reached by the apiserver through its Service: caps a priority (the chart's policy
        #    gives callers that no rule names a cap of 0) and refuses a job naming a missing model.
        capped = cluster.kubectl(
            "apply", "-f", "-", input=yaml.safe_dump(world.job_doc("greedy", model, priority=1000))
        )
        assert "priority 1000 capped to 0" in capped.stderr, capped.stderr
        job = world.get("greedy")
        assert job["spec"]["priority"] == 0
        assert job["metadata"]["annotations"]["gpulane.io/requested-priority"] == "1000"
        refused = cluster.kubectl(
            "apply", "-f", "-", input=yaml.safe_dump(world.job_doc("ghost", "no-such-model")), check=False
        )
        assert refused.returncode != 0
        assert "gpujob-validate.gpulane.io" in refused.stderr and "no-such-model" in refused.stderr, refused.stderr
        world.wait_phase("greedy", "Running", timeout=60)  # the warm lane takes it
        world.complete("greedy")

        # The bridge answers through its Service with the GpuModels it may list.
        service = core_v1.read_namespaced_service(f"{fullname}-bridge", namespace)
        request = urllib.request.Request(
            f"http://{service.spec.cluster_ip}:8090/v1/models", headers={"Authorization": f"Bearer {BRIDGE_KEY}"}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            models = [m["id"] for m in json.loads(resp.read())["data"]]
        assert model in models, models
        # The web page through its Service, from the image's own assets: the bridge's key logs in.
        page = f"http://{core_v1.read_namespaced_service(f'{fullname}-ui', namespace).spec.cluster_ip}:8092"
        assert page_view(page, BRIDGE_KEY, lane)["viewer"] == "key chart"

        # The whole path inside the cluster: the real openai client -> the chart's bridge (a pod, through
        # its Service) -> a GpuJob -> the chart's operator -> a backend pod on gpu-0 that really serves.
        # The kwok lane goes first, so the job can only land on the real one.
        cluster.kubectl("delete", f"gpulanes.gpulane.io/{lane}", "--wait=true")
        wait_until(lambda: not backend_pods(core_v1, backends), timeout=60, what="the kwok lane's pod gone")
        # The webhook refuses a bridge that names its callers' members unless the GpuPolicy trusts its
        # ServiceAccount: the chart's own policy does, from the first call on.
        real_lane, served = world.real_lane(), world.real_model("served")
        bridge = openai.OpenAI(
            base_url=f"http://{service.spec.cluster_ip}:8090/v1", api_key=BRIDGE_KEY, max_retries=0, timeout=120
        )
        wait_until(lambda: served in [m.id for m in bridge.models.list()], what="the bridge to list the model")
        hello = [{"role": "user", "content": "in-cluster"}]
        policy = world.custom.get_cluster_custom_object("gpulane.io", "v1alpha1", "gpupolicies", "default")
        assert policy["spec"]["admission"]["trusted"]["serviceAccounts"] == [f"{namespace}/{fullname}-bridge"]
        try:
            answer = bridge.chat.completions.create(model=served, messages=hello)
        except openai.APIError as err:
            log = cluster.kubectl("logs", "-n", namespace, f"deployment/{fullname}-bridge", "--tail=30").stdout
            raise AssertionError(f"{err}\nthe bridge's log:\n{log}") from err
        assert served in str(answer.choices[0].message.content)
        # H1: the backend pod that just answered through the bridge refuses a tenant's pod that calls it at the
        # address a job's status shows (the chart's NetworkPolicy, enforced on gpu-0 as k3s does).
        endpoint = next(j["status"]["endpoint"] for j in world.jobs() if j["spec"]["model"] == served)
        assert tenant_call(cluster, namespace, endpoint) == "refused", endpoint
        # Failover at the chart's defaults (issue 34): the leader deleted as a rollout does (SIGTERM: it gives
        # its Lease up), then SIGKILLed in its container as an OOM kill or a crash (its Lease must expire; a
        # force delete would still send SIGTERM first). Each time a call, made once the Lease has a new holder,
        # is answered: the standby dispatches.
        failover = {}
        for how in ("graceful", "killed"):
            old = json.loads(cluster.kubectl("get", "lease", "gpulane-operator", "-n", namespace, "-o", "json").stdout)
            pod = old["spec"]["holderIdentity"].rsplit("-", 1)[0]
            deleted = time.monotonic()
            if how == "graceful":
                cluster.kubectl("delete", "pod", pod, "-n", namespace, "--wait=false")
            else:
                container = core_v1.read_namespaced_pod(pod, namespace).status.container_statuses[0].container_id
                ctr = localcluster.node.ctr_command(cluster.bindir)
                task = container.removeprefix("containerd://")
                subprocess.run([*ctr, "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", task], check=True)

            def new_holder(was: str = old["spec"]["holderIdentity"]) -> dict[str, Any] | None:
                lease = cluster.kubectl("get", "lease", "gpulane-operator", "-n", namespace, "-o", "json").stdout
                spec: dict[str, Any] = json.loads(lease)["spec"]
                return spec if spec.get("holderIdentity") not in (None, was) else None

            taken = wait_until(new_holder, timeout=30, interval=0.1, what=f"a standby to lead ({how})")
            assert served in str(bridge.chat.completions.create(model=served, messages=hello).choices[0].message)
            failover[how] = round(time.monotonic() - deleted, 1)
            # Released, it is taken before it could expire; left to expire, not before (the old leader renewed
            # at the renewTime read, or later).
            early = (parse_time(taken["acquireTime"]) or 0.0) < (parse_time(old["spec"]["renewTime"]) or 0.0) + 6
            assert early == (how == "graceful"), (how, old["spec"], taken)
        print(f"from the leader's deletion to a call answered by the standby: {failover} (Lease 6 s)")
        # The executor, in the namespace the values opted in: a kubectl job with spec.request runs with the
        # chart's namespaced Role only, and its outcome passes the status webhook.
        body = {"model": served, "messages": [{"role": "user", "content": "from kubectl"}]}
        world.job("manifest", served, request={"path": "/v1/chat/completions", "body": body})
        done = world.wait_phase("manifest", "Succeeded", "Failed", timeout=90)
        assert done["phase"] == "Succeeded", done
        # Anyone but the operator's ServiceAccount (the admin, here) writes only outcomes, of Running jobs:
        # not another answer for a finished one.
        forged = cluster.kubectl("patch", "gpujob", "manifest", "-n", namespace, "--subresource=status", "--type=merge",
                                 "-p", '{"status":{"result":{"configMap":"forged"}}}', check=False)  # fmt: skip
        assert forged.returncode != 0 and "gpujob-status-validate.gpulane.io" in forged.stderr, forged.stderr
        # A video does not fit a ConfigMap: 50 MB to the results volume, intact, then read back through the
        # bridge by a ServiceAccount that may get the job, and refused to one that may not.
        size = 50 * 1024 * 1024
        speech = {"model": served, "input": "a film", "fake_bytes": size}
        world.job("video", served, request={"path": "/v1/audio/speech", "body": speech, "output": "volume"})
        video = world.wait_phase("video", "Succeeded", "Failed", timeout=120)
        assert video["phase"] == "Succeeded", video
        expected = hashlib.sha256(b"".join(fake_bytes(size))).hexdigest()
        assert {k: video["result"]["volume"][k] for k in ("bytes", "sha256")} == {"bytes": size, "sha256": expected}
        on_disk = results_dir / video["result"]["volume"]["path"]
        assert hashlib.sha256(on_disk.read_bytes()).hexdigest() == expected
        cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
        cluster.kubectl("create", "serviceaccount", "stranger", "-n", namespace)
        cluster.kubectl("create", "role", "read-jobs", "-n", namespace, "--verb=get", "--resource=gpujobs.gpulane.io")
        cluster.kubectl("create", "rolebinding", "read-jobs", "-n", namespace, "--role=read-jobs",
                        f"--serviceaccount={namespace}:reader")  # fmt: skip
        bridge_url = f"http://{service.spec.cluster_ip}:8090"

        def result(account: str, out: Path, *audience: str) -> subprocess.CompletedProcess[str]:
            token = cluster.kubectl("create", "token", account, "-n", namespace, *audience).stdout.strip()
            return subprocess.run(
                [str(REPO / ".venv" / "bin" / "gpulane"), "result", "video", "-n", namespace, "--bridge", bridge_url,
                 "--insecure", "--token", token, "-o", str(out), "--kubeconfig", str(cluster.kubeconfig)],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip

        for_the_bridge = ("--audience", "gpulane-bridge")
        read = result("reader", tmp_path / "video.out", *for_the_bridge)
        assert read.returncode == 0 and "(as recorded)" in read.stderr, read.stderr
        assert hashlib.sha256((tmp_path / "video.out").read_bytes()).hexdigest() == expected
        denied = result("stranger", tmp_path / "denied.out", *for_the_bridge)
        assert denied.returncode == 1 and "the bridge answered 403" in denied.stderr, denied.stderr
        # A token for the apiserver (the default audience) is no key to the bridge (review M7).
        apiserver_token = result("reader", tmp_path / "apiserver.out")
        assert apiserver_token.returncode == 1 and "the bridge answered 401" in apiserver_token.stderr
        assert "audience gpulane-bridge" in apiserver_token.stderr, apiserver_token.stderr
        # Deleting the job removes its answer, as a ConfigMap goes with its owner.
        cluster.kubectl("delete", "gpujob", "video", "-n", namespace, "--wait=true")
        wait_until(lambda: not on_disk.exists(), timeout=30, what="the answer's file removed with its job")

        # A rollout mid-render: the old bridge pod drains (its readiness fails, the call in hand goes on), so
        # the render's answer still arrives while `helm upgrade` replaces the pod.
        render = world.real_model("render", request_seconds=20)
        wait_until(lambda: render in [m.id for m in bridge.models.list()], what="the bridge to list the render model")
        answers: list[Any] = []
        caller = threading.Thread(target=lambda: answers.append(
            bridge.chat.completions.create(model=render, messages=[{"role": "user", "content": "long render"}])
        ))  # fmt: skip
        caller.start()
        wait_until(lambda: any(j["spec"]["model"] == render and (j.get("status") or {}).get("phase") == "Running"
                               for j in world.jobs()), timeout=60, what="the render running")  # fmt: skip
        old = pods_of(core_v1, namespace, release)["bridge"]
        old_bridge = old.metadata.name
        assert old.spec.termination_grace_period_seconds == 300 + 15, "bridge.drainSeconds plus 15"
        # The old pod's log, followed until the pod is gone: deleted, it takes its log with it.
        follow = subprocess.Popen([str(cluster.binary("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "logs", "-f",
                                   "-n", namespace, old_bridge], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)  # fmt: skip
        cluster.helm("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set",
                     "bridge.podAnnotations.rollout=render", "--wait", "--timeout", "120s")  # fmt: skip
        caller.join(timeout=60)
        assert answers and render in str(answers[0].choices[0].message.content), "the render's answer arrived"
        assert pods_of(core_v1, namespace, release)["bridge"].metadata.name != old_bridge, "the pod was replaced"
        try:
            drained, _ = follow.communicate(timeout=60)  # ends when the drained pod exits
        finally:
            follow.kill()
        # SIGTERM came while the render was in hand: the pod drained it instead of cutting it off.
        assert "the 1 calls and 0 executions in hand" in drained, drained[-2000:]
        # The release owns its policy: an upgrade that drops the bridge's trust reaches the webhook, whose
        # refusal the caller gets as an OpenAI error.
        cluster.helm("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set",
                     "policy.trustBridge=false", "--wait", "--timeout", "120s")  # fmt: skip

        def refused() -> str | None:
            try:
                bridge.chat.completions.create(model=served, messages=hello)
            except openai.PermissionDeniedError as err:
                return str(err)
            return None

        refusal = wait_until(refused, what="the webhook to refuse the bridge it no longer trusts")
        assert "only identities in the policy's admission.trusted may set spec.member" in refusal
        [pod] = backend_pods(core_v1, backends)
        assert pod.spec.node_name == localcluster.GPU_NODE and pod.metadata.annotations["gpulane.io/lane"] == real_lane
        cluster.kubectl("delete", f"gpulanes.gpulane.io/{real_lane}", "--wait=true")
        wait_until(lambda: not backend_pods(core_v1, backends), timeout=60, what="the real lane's pod gone")

        # 4. Least privilege: the operator's account may do what it needs and nothing it does not.
        assert can_i(cluster, operator_sa, "create", "pods", "-n", backends) == "yes"
        assert can_i(cluster, operator_sa, "create", "pods", "-n", namespace) == "no"
        assert can_i(cluster, operator_sa, "patch", "gpujobs.gpulane.io", "--subresource=status", "-A") == "yes"
        for denied in [
            ("delete", "nodes"),
            ("get", "secrets", "-A"),
            ("list", "secrets", "-n", namespace),
            ("create", "pods", "-n", "default"),
            ("delete", "pods", "-n", "kube-system"),
            ("update", "gpulanes.gpulane.io"),
            ("create", "mutatingwebhookconfigurations"),
        ]:
            assert can_i(cluster, operator_sa, *denied) == "no", denied
        assert can_i(cluster, operator_sa, "update", "leases/gpulane-operator", "-n", namespace) == "yes"
        assert can_i(cluster, operator_sa, "delete", "gpujobs.gpulane.io", "-A") == "yes"  # finished, past their TTL
        assert can_i(cluster, operator_sa, "update", "leases/someone-else", "-n", namespace) == "no"
        webhook_sa = f"system:serviceaccount:{namespace}:{fullname}-webhook"
        assert can_i(cluster, webhook_sa, "patch", "gpujobs.gpulane.io", "-A") == "no"
        assert can_i(cluster, webhook_sa, "list", "pods", "-A") == "no"
        bridge_sa = f"system:serviceaccount:{namespace}:{fullname}-bridge"
        assert can_i(cluster, bridge_sa, "create", "gpujobs.gpulane.io", "-n", namespace) == "yes"
        assert can_i(cluster, bridge_sa, "create", "gpujobs.gpulane.io", "-n", "default") == "no"
        assert can_i(cluster, bridge_sa, "get", "secrets", "-n", namespace) == "no"
        # The executor's rights exist only where bridge.executeNamespaces put them.
        assert can_i(cluster, bridge_sa, "patch", "gpujobs.gpulane.io", "-n", namespace) == "yes"
        assert can_i(cluster, bridge_sa, "create", "configmaps", "-n", namespace) == "yes"
        assert can_i(cluster, bridge_sa, "get", "pods", "-n", backends) == "yes"
        assert can_i(cluster, bridge_sa, "list", "pods", "-n", backends) == "no"
        for elsewhere in ("kube-system", "default"):
            assert can_i(cluster, bridge_sa, "get", "pods", "-n", elsewhere) == "no"
            assert can_i(cluster, bridge_sa, "patch", "gpujobs.gpulane.io", "-n", elsewhere) == "no"
            assert (
                can_i(cluster, bridge_sa, "patch", "gpujobs.gpulane.io", "--subresource=status", "-n", elsewhere)
                == "no"
            )
            assert can_i(cluster, bridge_sa, "create", "configmaps", "-n", elsewhere) == "no"
        # People (issue 37): whoever may edit a namespace may submit jobs and chains there, through the built-in
        # edit role the chart's job editor aggregates into; a viewer may read them; neither may touch models.
        for person, role in (("dev", "edit"), ("auditor", "view")):
            cluster.kubectl("create", "rolebinding", f"{person}-{role}", f"--clusterrole={role}", f"--user={person}",
                            "-n", namespace)  # fmt: skip
        wait_until(lambda: can_i(cluster, "dev", "create", "gpujobs.gpulane.io", "-n", namespace) == "yes",
                   what="the job editor aggregated into edit")  # fmt: skip
        assert can_i(cluster, "dev", "delete", "gpuchains.gpulane.io", "-n", namespace) == "yes"
        assert can_i(cluster, "dev", "create", "gpujobs.gpulane.io", "-n", "default") == "no"
        assert can_i(cluster, "dev", "patch", "gpumodels.gpulane.io") == "no"
        wait_until(lambda: can_i(cluster, "auditor", "list", "gpujobs.gpulane.io", "-n", namespace) == "yes",
                   what="the job viewer aggregated into view")  # fmt: skip
        assert can_i(cluster, "auditor", "create", "gpujobs.gpulane.io", "-n", namespace) == "no"
        # ... and nothing the components did was refused for lack of permission.
        for component in ("operator", "webhook", "bridge"):
            log = cluster.kubectl("logs", "-n", namespace, f"deployment/{fullname}-{component}").stdout
            assert "forbidden" not in log.lower(), f"{component}:\n{log[-3000:]}"

        # While the operator runs (the lanes and their pods are gone already; a kwok node must outlive its
        # pod to confirm the deletion): the rest of the world.
        world.cleanup()

        # 5. helm uninstall removes everything but the CRDs (Helm never deletes crds/).
        cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
        wait_until(lambda: not leftovers(cluster, namespace, release), timeout=60, what="the release's objects gone")
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            assert cluster.kubectl("get", kind, fullname, check=False).returncode != 0, kind
        cluster.kubectl("get", "crd", "gpujobs.gpulane.io", "gpulanes.gpulane.io", "gpumodels.gpulane.io",
                        "gpupolicies.gpulane.io")  # fmt: skip
        print(f"chart installed and Ready in {installed:.1f}s; whole test {time.monotonic() - started:.1f}s")
    finally:
        world.cleanup()
        cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")
        remove_release(cluster, namespace, release, fullname)
        cluster.kubectl("delete", "pvc", "results", "-n", namespace, "--ignore-not-found", "--wait=false")
        cluster.kubectl("delete", "pv", world_pv, "--ignore-not-found", "--wait=false")


def test_the_chart_renders_and_lints(cluster: Cluster) -> None:
    """helm lint is clean, the CRDs come from crds/ (a link to the generated files), and the webhook's
    caBundle is the CA of the certificate in the same render."""
    lint = cluster.helm("lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in lint.stdout
    crds = sorted(p.name for p in (CHART / "crds").iterdir())
    assert crds == sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    assert (CHART / "crds").resolve() == (REPO / "crds").resolve()
    out = cluster.helm("template", "r", str(CHART), "-n", "ns", "--include-crds", "--kube-version", "1.37.2").stdout
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(out) if d]
    kinds = {d["kind"] for d in docs}
    assert "CustomResourceDefinition" in kinds and "MutatingWebhookConfiguration" in kinds
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "r-gpulane-webhook-tls")
    bundles = {
        hook["clientConfig"]["caBundle"]
        for d in docs
        if d["kind"].endswith("WebhookConfiguration")
        for hook in d["webhooks"]
    }
    assert bundles == {secret["data"]["ca.crt"]}
    assert all(d["kind"] != "Deployment" or "bridge" not in d["metadata"]["name"] for d in docs)  # off by default


def test_the_chart_renders_gpupolicy_default_from_values_and_trusts_its_bridge(cluster: Cluster) -> None:
    def policies(*values: str) -> list[dict[str, Any]]:
        out = cluster.helm("template", "r", str(CHART), "-n", "ns", *values).stdout
        return [d for d in yaml.safe_load_all(out) if d and d["kind"] == "GpuPolicy"]

    [plain] = policies()
    assert plain["metadata"]["name"] == "default"
    assert plain["spec"]["admission"] == {"mode": "cap", "defaultCap": 0, "defaultTier": "free", "rules": [],
                                          "trusted": {}}  # fmt: skip
    own_rule = '[{"name": "admins", "groups": ["ops"], "maxPriority": 100}]'
    bridge = ["--set", "bridge.enabled=true", "--set", "bridge.keys.existingSecret=keys"]
    [with_bridge] = policies(*bridge, "--set", "policy.bridgeMaxPriority=50",
                             "--set-json", f"policy.spec.admission.rules={own_rule}")  # fmt: skip
    admission = with_bridge["spec"]["admission"]
    assert admission["trusted"] == {"serviceAccounts": ["ns/r-gpulane-bridge"]}
    assert admission["rules"] == [
        {"name": "admins", "groups": ["ops"], "maxPriority": 100},
        {"name": "r-bridge", "serviceAccounts": ["ns/r-gpulane-bridge"], "maxPriority": 50},
    ]
    assert policies("--set", "policy.create=false") == []
    hooks = yaml.safe_load_all(cluster.helm("template", "r", str(CHART), "-n", "ns", "--show-only",
                                            "templates/webhook-configuration.yaml").stdout)  # fmt: skip
    [validating] = [d for d in hooks if d and d["kind"] == "ValidatingWebhookConfiguration"]
    policy_hook = next(h for h in validating["webhooks"] if h["name"] == "gpupolicy-validate.gpulane.io")
    assert policy_hook["failurePolicy"] == "Ignore"  # the release's own policy is created before the webhook runs


def test_plain_helm_template_renders_and_a_known_old_kubernetes_is_refused(cluster: Cluster) -> None:
    """GitOps tools render with plain `helm template`, whose Kubernetes is Helm's built-in v1.20.0: that
    renders. A version that is known (given, or the cluster's at install) must be 1.28 or later."""
    plain = cluster.helm("template", "r", str(CHART), "-n", "ns")
    assert any(d and d["kind"] == "Deployment" for d in yaml.safe_load_all(plain.stdout))
    old = cluster.helm("template", "r", str(CHART), "-n", "ns", "--kube-version", "1.27.3", check=False)
    assert old.returncode != 0
    assert "gpulane needs Kubernetes 1.28 or later" in old.stderr and "v1.27.3" in old.stderr, old.stderr


def test_the_release_notes_show_the_first_request_and_how_to_watch_the_queue(cluster: Cluster, crds: None) -> None:
    # A dry run still maps every kind through the apiserver: the CRDs must be in this group's cluster.
    notes = cluster.helm("install", "r", str(CHART), "-n", "ns", "--dry-run=client", "--set", "bridge.enabled=true",
                         "--set", "bridge.keys.existingSecret=keys").stdout  # fmt: skip
    notes = notes[notes.index("NOTES:") :]
    assert "curl -s http://r-gpulane-bridge:8090/v1/chat/completions" in notes
    assert '-H "X-LlamaSwap-Priority: interactive"' in notes
    assert "kubectl gpulane queue" in notes and "gpulane why JOB" in notes


def test_the_chart_creates_lanes_and_models_from_values(cluster: Cluster, crds: None, tmp_path: Path) -> None:
    values = {
        "lanes": [
            {"name": "gpu-0", "spec": {"nodeName": "gpu-0"}},
            {"name": "big", "spec": {"nodeSelector": {"gpu": "a100"}, "count": 2}},
        ],
        "models": [{"name": "llama", "spec": {"image": "llama:1", "args": ["--port", "8000"], "port": 8000}}],
    }
    (values_file := tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    out = cluster.helm("template", "r", str(CHART), "-n", "ns", "-f", str(values_file)).stdout
    made = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    assert made["GpuLane", "gpu-0"]["spec"] == {"nodeName": "gpu-0"}
    assert made["GpuLane", "big"]["spec"] == {"nodeSelector": {"gpu": "a100"}, "count": 2}
    assert made["GpuModel", "llama"]["spec"] == values["models"][0]["spec"]  # type: ignore[index]
    assert made["GpuModel", "llama"]["metadata"]["labels"]["app.kubernetes.io/instance"] == "r"
    plain = cluster.helm("template", "r", str(CHART), "-n", "ns").stdout
    assert not [d for d in yaml.safe_load_all(plain) if d and d["kind"] in ("GpuLane", "GpuModel")]
    # runtimeClassName (issue 33): every lane's default, a lane's own wins; applied, the lane keeps it.
    values["lanes"][1]["spec"]["runtimeClassName"] = "kata"  # type: ignore[index]
    values_file.write_text(yaml.safe_dump({**values, "runtimeClassName": "nvidia"}))
    out = cluster.helm("template", "r", str(CHART), "-n", "ns", "-f", str(values_file)).stdout
    made = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}
    assert made["GpuLane", "gpu-0"]["spec"] == {"nodeName": "gpu-0", "runtimeClassName": "nvidia"}
    assert made["GpuLane", "big"]["spec"]["runtimeClassName"] == "kata"
    applied = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                              input=yaml.safe_dump(made["GpuLane", "gpu-0"]))  # fmt: skip
    assert json.loads(applied.stdout)["spec"]["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize("annotations", [{}, {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/bridge"}])
def test_the_bridges_executor_roles_render_once_per_namespace_with_or_without_account_annotations(
    cluster: Cluster, annotations: dict[str, str]
) -> None:
    """issue 34's L7: an `end` missing after the ServiceAccount's annotations put the executor Roles inside
    that block: none without annotations, so the executor could not claim a job."""
    values = ["--set", "bridge.enabled=true", "--set", "bridge.keys.existingSecret=keys",
              "--set-json", 'bridge.executeNamespaces=["film","studio"]',
              "--set-json", f"bridge.serviceAccount.annotations={json.dumps(annotations)}"]  # fmt: skip
    out = cluster.helm("template", "r", str(CHART), "-n", "ns", *values).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    ours = ("-executor", "-backends")
    roles = sorted((d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs
                   if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"].endswith(ours))  # fmt: skip
    assert roles == sorted(
        (kind, ns, f"r-gpulane-bridge-{what}")
        for kind in ("Role", "RoleBinding")
        for ns, what in (("film", "executor"), ("studio", "executor"), ("ns-backends", "backends"))
    ), roles
    [account] = [d for d in docs if d["kind"] == "ServiceAccount" and "bridge" in d["metadata"]["name"]]
    assert account["metadata"].get("annotations", {}) == annotations


def test_every_gpumodel_example_of_the_docs_is_a_valid_chart_value(cluster: Cluster, tmp_path: Path) -> None:
    """docs/models.md's GpuModels (runtimeClassName, volumes, env from a Secret, probes ...) put under
    `models:` pass the values schema and come out as written: the schema takes what the CRD takes."""
    text = (REPO / "docs" / "models.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    examples = [d for b in blocks for d in yaml.safe_load_all(b) if isinstance(d, dict) and d.get("kind") == "GpuModel"]
    assert len(examples) >= 3, "the docs' examples were not found"
    values = {"models": [{"name": d["metadata"]["name"], "spec": d["spec"]} for d in examples]}
    (values_file := tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    out = cluster.helm("template", "r", str(CHART), "-n", "ns", "-f", str(values_file)).stdout
    made = {d["metadata"]["name"]: d for d in yaml.safe_load_all(out) if d and d["kind"] == "GpuModel"}
    assert {name: made[name]["spec"] for name in made} == {d["metadata"]["name"]: d["spec"] for d in examples}


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"operator": {"replicas": "two"}}, "/operator/replicas"),
        ({"opertor": {"replicas": 2}}, "opertor"),
        ({"webhook": {"failurePolicy": "Sometimes"}}, "/webhook/failurePolicy"),
        ({"models": [{"name": "m", "spec": {"image": "x", "port": 0}}]}, "/models/0/spec/port"),
        ({"models": [{"name": "m"}]}, "/models/0"),
        ({"lanes": [{"name": "gpu-0", "spec": {"nodeNmae": "gpu-0"}}]}, "nodeNmae"),
        ({"policy": {"spec": {"admission": {"mode": "capped"}}}}, "/policy/spec/admission/mode"),
        ({"policy": {"spec": {"bandSpacing": -5}}}, "/policy/spec/bandSpacing"),
        ({"operator": {"shards": ["Big"]}}, "/operator/shards/0"),
    ],
)
def test_bad_values_fail_the_install_and_name_the_field(
    cluster: Cluster, tmp_path: Path, values: dict[str, Any], where: str
) -> None:
    """values.schema.json: hand-written for the chart's own values, the CRDs' schemas for lanes, models and
    policy.spec (generated by `make crds`), so a typo fails before anything reaches the cluster."""
    (values_file := tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    proc = cluster.helm("template", "r", str(CHART), "-n", "ns", "-f", str(values_file), check=False)
    assert proc.returncode != 0, proc.stdout[:500]
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert where in proc.stderr, proc.stderr


def test_helm_install_with_bad_values_fails_before_anything_is_created(cluster: Cluster, namespace: str) -> None:
    """The same schema through `helm install` against the cluster: refused, and no release or object left."""
    release = f"bad-{namespace[-6:]}"
    proc = cluster.helm("install", release, str(CHART), "-n", namespace, "--set", "operator.replicas=two",
                        check=False)  # fmt: skip
    assert proc.returncode != 0 and "at '/operator/replicas'" in proc.stderr, proc.stderr
    assert release not in cluster.helm("list", "-n", namespace, "-a", "-q").stdout
    left = cluster.kubectl("get", "all,secrets,configmaps", "-n", namespace, "-l",
                           f"app.kubernetes.io/instance={release}", "-o", "name").stdout  # fmt: skip
    assert left == "", left


def page_view(url: str, key: str, lane: str) -> dict[str, Any]:
    """The chart's web page: its HTML and script, a login with ``key``, then the lanes view, which shows ``lane``."""
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    with browser.open(f"{url}/", timeout=10) as resp:
        assert b"/static/ui.js" in resp.read()
    with browser.open(f"{url}/static/ui.js", timeout=10) as resp:
        assert b"EventSource" in resp.read()
    login = urllib.request.Request(f"{url}/api/login", data=json.dumps({"secret": key}).encode(),
                                   headers={"Content-Type": "application/json"})  # fmt: skip
    browser.open(login, timeout=10).close()
    with browser.open(f"{url}/api/views/lanes", timeout=10) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    assert lane in [row["lane"] for row in body["data"]], body
    return body


def rendered(cluster: Cluster, *values: str) -> dict[tuple[str, str], dict[str, Any]]:
    out = cluster.helm("template", "r", str(CHART), "-n", "ns", *values).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}


def test_minus_one_keeps_a_sources_jobs_through_the_chart_and_kubectl_apply_but_null_never_did(
    cluster: Cluster, crds: None, tmp_path: Path
) -> None:
    """Issue 33: values.yaml said null keeps a source's jobs. The apiserver prunes a null and puts the CRD's
    default back (604800), on create and through kubectl apply's merge patch alike; -1 survives both."""
    for kept, stored in ((-1, -1), (None, 604800)):
        values = tmp_path / "ttl.yaml"
        values.write_text(yaml.safe_dump({"policy": {"spec": {"ttlSecondsAfterFinished": {"kubectl": kept}}}}))
        if kept is None:  # the values schema refuses a null outright, so render the policy with it by hand
            policy = rendered(cluster)["GpuPolicy", "default"]
            policy["spec"]["ttlSecondsAfterFinished"] = {"kubectl": None}
        else:
            policy = rendered(cluster, "-f", str(values))["GpuPolicy", "default"]
        assert policy["spec"]["ttlSecondsAfterFinished"] == {"kubectl": kept}
        applied = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=yaml.safe_dump(policy))
        ttl = json.loads(applied.stdout)["spec"]["ttlSecondsAfterFinished"]
        assert ttl == {"bridge": 3600, "kubectl": stored}, (kept, ttl)
    refused = cluster.helm("template", "r", str(CHART), "--set-json",
                           'policy.spec.ttlSecondsAfterFinished={"kubectl":null}', check=False)  # fmt: skip
    assert refused.returncode != 0 and "ttlSecondsAfterFinished/kubectl" in refused.stderr, refused.stderr


def test_the_single_node_profile_runs_one_of_everything_with_the_bridge_on_the_nodes_address(
    cluster: Cluster, crds: None
) -> None:
    """values-single-node.yaml (issues 33 and 39): one operator, one bridge on a NodePort, admission by the
    apiserver's policies where it serves them (else one webhook), no disruption budget, one lane."""
    profile = ["-f", str(CHART / "values-single-node.yaml"), "--set", "bridge.keys.existingSecret=keys"]
    served = ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
    box = rendered(cluster, *profile, *served)
    deployments = {name: d["spec"]["replicas"] for (kind, name), d in box.items() if kind == "Deployment"}
    assert deployments == {"r-gpulane-operator": 1, "r-gpulane-bridge": 1}, deployments
    assert not [k for k in box if k[0] in ("PodDisruptionBudget", "ValidatingWebhookConfiguration")]
    assert ("MutatingAdmissionPolicy", "r-gpulane-job-defaults") in box
    service = box["Service", "r-gpulane-bridge"]["spec"]
    assert service["type"] == "NodePort" and service["ports"][0]["nodePort"] == 30890
    older = rendered(cluster, *profile)  # no MutatingAdmissionPolicy v1: the webhook, one replica
    assert older["Deployment", "r-gpulane-webhook"]["spec"]["replicas"] == 1
    labels = box["Namespace", "ns-backends"]["metadata"]["labels"]  # weights from a hostPath
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged", labels
    [lane] = [d for (kind, _), d in box.items() if kind == "GpuLane"]
    applied = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=yaml.safe_dump(lane))
    assert json.loads(applied.stdout)["metadata"]["name"] == "gpu-0"


def test_two_bridge_replicas_by_default_with_a_disruption_budget(cluster: Cluster) -> None:
    """Issue 39: a killed or rolled bridge replica costs no new call; one replica gets no budget (it would block
    every drain)."""
    bridge = ["--set", "bridge.enabled=true", "--set", "bridge.keys.existingSecret=keys"]
    two = rendered(cluster, *bridge)
    assert two["Deployment", "r-gpulane-bridge"]["spec"]["replicas"] == 2
    budget = two["PodDisruptionBudget", "r-gpulane-bridge"]["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"]["matchLabels"] == two["Deployment", "r-gpulane-bridge"]["spec"]["selector"]["matchLabels"]
    one = rendered(cluster, *bridge, "--set", "bridge.replicas=1")
    assert ("PodDisruptionBudget", "r-gpulane-bridge") not in one
    assert ("PodDisruptionBudget", "r-gpulane-bridge") not in rendered(cluster)  # no bridge, no budget


def test_each_shard_gets_an_operator_deployment_of_its_own_with_its_lease(cluster: Cluster) -> None:
    """Issue 35: operator.shards adds a Deployment per shard, whose selector and pods carry its label (the
    default's selector stays as before shards, so an upgrade keeps it), and the Role lets it hold its Lease."""
    out = rendered(cluster, "--set", "operator.shards={big,video}")
    default, big = out["Deployment", "r-gpulane-operator"], out["Deployment", "r-gpulane-operator-big"]
    assert "gpulane.io/shard" not in default["spec"]["selector"]["matchLabels"]
    assert default["spec"]["selector"] == rendered(cluster)["Deployment", "r-gpulane-operator"]["spec"]["selector"]
    assert big["spec"]["selector"]["matchLabels"]["gpulane.io/shard"] == "big"
    assert big["spec"]["template"]["metadata"]["labels"]["gpulane.io/shard"] == "big"
    assert "--shard=big" in big["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--shard") for a in default["spec"]["template"]["spec"]["containers"][0]["args"])
    assert ("Deployment", "r-gpulane-operator-video") in out
    [leases] = [r for r in out["Role", "r-gpulane-operator-leader"]["rules"] if r.get("resourceNames")]
    assert leases["resourceNames"] == ["gpulane-operator", "gpulane-operator-big", "gpulane-operator-video"]


def test_the_shards_share_the_status_write_budget(cluster: Cluster) -> None:
    """The budget bounds what the status writers ask of one apiserver: three shards at the default 500 write at
    most 166.7 a second each, not 500 each (a burst then cost two shards 7,100 writes against one's 5,200)."""

    def budgets(*values: str) -> set[float]:
        out = rendered(cluster, *values)
        args = [
            arg
            for (kind, _), doc in out.items()
            if kind == "Deployment" and doc["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
            for arg in doc["spec"]["template"]["spec"]["containers"][0]["args"]
        ]
        return {float(a.split("=", 1)[1]) for a in args if a.startswith("--status-writes-per-second=")}

    assert budgets() == {500.0}
    [three] = budgets("--set", "operator.shards={big,video}")
    assert three == pytest.approx(500 / 3)
    assert budgets("--set", "operator.shards={big}", "--set", "operator.statusWritesPerSecond=120") == {60.0}


def test_observability_and_the_helm_test_are_optional_and_render(cluster: Cluster) -> None:
    bridge = ["--set", "bridge.enabled=true", "--set", "bridge.keys.existingSecret=keys"]
    plain = rendered(cluster, *bridge, "--set", "networkPolicy.enabled=false")
    assert not {k for k in plain if k[0] in ("ServiceMonitor", "NetworkPolicy", "PrometheusRule")}
    assert ("ConfigMap", "r-gpulane-dashboard") not in plain
    made = rendered(cluster, *bridge, "--set", "metrics.serviceMonitor.enabled=true", "--set",
                    "metrics.dashboard.enabled=true", "--set-json",
                    'networkPolicy.bridgeClientNamespaces=["apps"]', "--set", "tests.apiKey=sk-test")  # fmt: skip
    alerting = ("metrics.prometheusRule.enabled=true", "metrics.prometheusRule.interactiveWaitSeconds=120",
                "metrics.prometheusRule.labels.release=p")  # fmt: skip
    rules = rendered(cluster, *(arg for value in alerting for arg in ("--set", value)))
    rule = rules["PrometheusRule", "r-gpulane"]
    assert rule["metadata"]["labels"]["release"] == "p"
    alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert set(alerts) == {"GpulaneInteractiveWaitTooLong", "GpulaneLaneNotReady", "GpulaneNoLeader",
                           "GpulaneJobsFailing", "GpulaneWebhookUnreachable"}  # fmt: skip
    assert alerts["GpulaneInteractiveWaitTooLong"]["expr"].endswith("> 120")
    assert "{{ $labels.lane }}" in alerts["GpulaneLaneNotReady"]["annotations"]["summary"]  # for Alertmanager
    monitor = made["ServiceMonitor", "r-gpulane"]["spec"]
    assert {e["port"] for e in monitor["endpoints"]} == {"http-metrics", "http"}
    dashboard = made["ConfigMap", "r-gpulane-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    grafana = json.loads((REPO / "deploy" / "grafana" / "gpulane-dashboard.json").read_text())
    assert json.loads(dashboard["data"]["gpulane.json"]) == grafana
    webhook = made["NetworkPolicy", "r-gpulane-webhook"]["spec"]
    assert webhook["ingress"] == [{"ports": [{"port": 9443, "protocol": "TCP"}]}]
    [metrics] = made["NetworkPolicy", "r-gpulane-operator"]["spec"]["ingress"]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    peers = made["NetworkPolicy", "r-gpulane-bridge"]["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}} in peers
    test_pod = made["Pod", "r-gpulane-test-bridge"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert {"name": "API_KEY", "value": "sk-test"} in test_pod["spec"]["containers"][0]["env"]
    # Every container of every workload has both probes, and ephemeral-storage in its requests and limits;
    # the helm test pod runs once and has none (docs/chart.md says so).
    deployments = [doc for (kind, _), doc in made.items() if kind == "Deployment"]
    assert len(deployments) == 3, sorted(made)
    for doc in deployments:
        for container in doc["spec"]["template"]["spec"]["containers"]:
            name = f"{doc['metadata']['name']}/{container['name']}"
            assert "livenessProbe" in container and "readinessProbe" in container, name
            for bound in ("requests", "limits"):
                assert "ephemeral-storage" in container["resources"][bound], (name, bound)
    # metricsNamespaces was not set: the default lets the namespace `monitoring` scrape (asserted above);
    # [] lets nobody.
    nobody = rendered(cluster, "--set-json", "networkPolicy.metricsNamespaces=[]")
    assert nobody["NetworkPolicy", "r-gpulane-operator"]["spec"]["ingress"] == []


def isolated(docs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, list[str]]:
    """Each pod the render makes (a Deployment's template, a Pod), by name: the NetworkPolicies of its namespace
    whose podSelector selects it. The backend pods are the operator's: its labels stand in for them."""
    policies = [d for (kind, _), d in docs.items() if kind == "NetworkPolicy"]
    pods = {name: (d["metadata"]["namespace"], d["spec"]["template"]["metadata"]["labels"])
            for (kind, name), d in docs.items() if kind == "Deployment"}  # fmt: skip
    pods |= {name: (d["metadata"]["namespace"], d["metadata"]["labels"]) for (kind, name), d in docs.items()
             if kind == "Pod"}  # fmt: skip
    namespace = next(d["metadata"]["namespace"] for (kind, _), d in docs.items() if kind == "Role"
                     and d["metadata"]["name"] == "r-gpulane-operator")  # fmt: skip
    pods["backend"] = (namespace, {MANAGED_BY: "gpulane", COMPONENT_LABEL: "backend"})
    return {
        name: [p["metadata"]["name"] for p in policies if p["metadata"]["namespace"] == ns
               and p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()]
        for name, (ns, labels) in pods.items()
    }  # fmt: skip


def test_backend_pods_get_a_namespace_of_their_own_that_only_the_bridge_reaches(cluster: Cluster) -> None:
    """Issue 34, H1 and H2: by default the backend pods run in "<release namespace>-backends", which the chart
    creates with Pod Security baseline enforced, and a NetworkPolicy lets only the release's bridge (and the
    namespaces named in backendClientNamespaces) call them. Every pod of the render is selected by a policy."""
    bridge = ["--set", "bridge.enabled=true", "--set", "bridge.keys.existingSecret=keys", "--set", "tests.apiKey=k"]
    docs = rendered(cluster, *bridge)
    space = docs["Namespace", "ns-backends"]["metadata"]["labels"]
    assert space["pod-security.kubernetes.io/enforce"] == "baseline"
    assert "--namespace=ns-backends" in docs["Deployment", "r-gpulane-operator"]["spec"]["template"]["spec"][
        "containers"][0]["args"]  # fmt: skip
    assert docs["Role", "r-gpulane-operator"]["metadata"]["namespace"] == "ns-backends"
    args = docs["Deployment", "r-gpulane-operator"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--unload-namespace=ns" in args  # the bridge's /unload (issue 33)
    assert not [a for a in rendered(cluster)["Deployment", "r-gpulane-operator"]["spec"]["template"]["spec"][
        "containers"][0]["args"] if a.startswith("--unload-namespace")]  # fmt: skip
    policy = docs["NetworkPolicy", "r-gpulane-backends"]
    assert policy["metadata"]["namespace"] == "ns-backends"
    bridge_labels = docs["Deployment", "r-gpulane-bridge"]["spec"]["template"]["metadata"]["labels"]
    [only] = policy["spec"]["ingress"]
    [peer] = only["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ns"}}
    assert peer["podSelector"]["matchLabels"].items() <= bridge_labels.items()
    assert all(isolated(docs).values()), isolated(docs)  # no pod without a policy (the linters' non-isolated-pod)
    # An executor namespace of the user's own, and a backend namespace the user names (no Namespace rendered).
    named = rendered(cluster, *bridge, "--set", "operator.backendNamespace=models", "--set-json",
                     'networkPolicy.backendClientNamespaces=["executors"]')  # fmt: skip
    assert not [k for k in named if k[0] == "Namespace"]
    peers = named["NetworkPolicy", "r-gpulane-backends"]["spec"]["ingress"]
    assert named["NetworkPolicy", "r-gpulane-backends"]["metadata"]["namespace"] == "models"
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "executors"}}} in peers[1]["from"]
    assert all(isolated(named).values()), isolated(named)
    # No bridge: nobody may call a backend pod.
    alone = rendered(cluster)
    assert alone["NetworkPolicy", "r-gpulane-backends"]["spec"]["ingress"] == []
    privileged = rendered(cluster, "--set", "operator.backendPodSecurity=privileged")
    assert privileged["Namespace", "ns-backends"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
        "privileged"
    )
    bad = cluster.helm("template", "r", str(CHART), "--set", "operator.backendPodSecurity=none", check=False)
    assert bad.returncode != 0 and "backendPodSecurity" in bad.stderr, bad.stderr


def test_the_results_volume_is_a_kept_claim_or_the_users_own(cluster: Cluster) -> None:
    """bridge.results: the chart creates <fullname>-bridge-results, kept on uninstall, with the size, class
    and access modes given; with existingClaim it creates none and mounts that one."""
    bridge = ["--set", "bridge.enabled=true", "--set", "bridge.keys.existingSecret=keys", "--set",
              "bridge.results.enabled=true"]  # fmt: skip
    made = rendered(cluster, *bridge, "--set", "bridge.results.size=50Gi", "--set",
                    "bridge.results.storageClassName=local-path", "--set-json",
                    'bridge.results.accessModes=["ReadWriteMany"]')  # fmt: skip
    claim = made["PersistentVolumeClaim", "r-gpulane-bridge-results"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "local-path",
                             "resources": {"requests": {"storage": "50Gi"}}}  # fmt: skip
    pod = made["Deployment", "r-gpulane-bridge"]["spec"]["template"]["spec"]
    assert {"name": "results", "persistentVolumeClaim": {"claimName": "r-gpulane-bridge-results"}} in pod["volumes"]
    [bridge_container] = pod["containers"]
    assert "--results-dir=/var/lib/gpulane/results" in bridge_container["args"]
    assert {"name": "results", "mountPath": "/var/lib/gpulane/results"} in bridge_container["volumeMounts"]
    own = rendered(cluster, *bridge, "--set", "bridge.results.existingClaim=videos")
    assert not [k for k in own if k[0] == "PersistentVolumeClaim"]
    volumes = own["Deployment", "r-gpulane-bridge"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "results", "persistentVolumeClaim": {"claimName": "videos"}} in volumes
    plain = rendered(cluster, *bridge[:4])
    assert not [k for k in plain if k[0] == "PersistentVolumeClaim"]
    assert "--results-dir=/var/lib/gpulane/results" not in plain["Deployment", "r-gpulane-bridge"]["spec"][
        "template"]["spec"]["containers"][0]["args"]  # fmt: skip


def test_the_packaged_chart_is_versioned_lints_and_renders(cluster: Cluster, tmp_path: Path) -> None:
    """`make chart`'s steps: the package carries the chart's version and the CRDs (the symlinks resolved)."""
    cluster.helm("package", str(CHART), "--destination", str(tmp_path))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tmp_path / f"gpulane-{chart['version']}.tgz"
    assert package.is_file(), sorted(p.name for p in tmp_path.iterdir())
    assert "0 chart(s) failed" in cluster.helm("lint", "--strict", str(package)).stdout
    out = cluster.helm("template", "r", str(package), "-n", "ns", "--include-crds", "--set",
                       "metrics.dashboard.enabled=true").stdout  # fmt: skip
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    assert kinds.count("CustomResourceDefinition") == len(list((REPO / "crds").glob("*.yaml"))) == len(KINDS)
    assert "ConfigMap" in kinds


def test_a_crd_upgrade_adds_a_field_through_helm_show_crds(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    """docs/chart.md, Upgrade: Helm never upgrades crds/, so an upgrade applies the new chart's CRDs first
    (`helm show crds CHART | kubectl apply --server-side --force-conflicts -f -`). Here the cluster has an
    older GpuJob CRD without spec.ttlSecondsAfterFinished: kubectl's strict field validation refuses a
    job that sets it, as a user who skipped the CRD upgrade would see. After the upgrade path it is kept."""
    crd_file = REPO / "crds" / "gpulane.io_gpujobs.yaml"
    old = yaml.safe_load(crd_file.read_text())
    del old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "ttlSecondsAfterFinished"
    ]
    job = {"apiVersion": "gpulane.io/v1alpha1", "kind": "GpuJob", "metadata": {"namespace": namespace},
           "spec": {"model": "m", "ttlSecondsAfterFinished": 30}}  # fmt: skip

    def create(name: str) -> subprocess.CompletedProcess[str]:
        doc = {**job, "metadata": {**job["metadata"], "name": name}}
        return cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(doc), check=False)

    def stored_spec(name: str) -> dict[str, Any]:
        assert create(name).returncode == 0
        return dict(json.loads(cluster.kubectl("get", "gpujob", name, "-n", namespace, "-o", "json").stdout)["spec"])

    try:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(old))
        refused = wait_until(lambda: (proc := create(f"old-{time.monotonic_ns()}")).returncode and proc.stderr,
                             what="the older CRD in effect")  # fmt: skip
        assert 'unknown field "spec.ttlSecondsAfterFinished"' in refused, refused
        crds = cluster.helm("show", "crds", str(CHART)).stdout
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=crds)
        wait_until(lambda: stored_spec(f"new-{time.monotonic_ns()}").get("ttlSecondsAfterFinished") == 30,
                   what="the upgraded CRD keeping the field")  # fmt: skip
    finally:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        cluster.kubectl("delete", "gpujobs", "--all", "-n", namespace, "--wait=false")


def test_admission_mode_chooses_the_webhook_the_apiservers_policies_or_both(cluster: Cluster) -> None:
    """admission.mode: webhook (pods), policy (MutatingAdmissionPolicy and ValidatingAdmissionPolicies, no
    webhook pod), webhook+policy (both, the webhook's job hooks then Ignore). The policies the chart renders
    are the generated ones, and the apiserver accepts them (a server-side dry run compiles their CEL)."""
    version = ["--kube-version", "1.37.0"]
    kinds = {
        mode: {k for k, _ in rendered(cluster, *version, "--set", f"admission.mode={mode}")}
        for mode in ("webhook", "policy", "webhook+policy")
    }
    policies = {"MutatingAdmissionPolicy", "ValidatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    hooks = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    assert not kinds["webhook"] & policies and hooks <= kinds["webhook"]
    assert policies <= kinds["policy"] and not kinds["policy"] & hooks
    assert ("Deployment", "r-gpulane-webhook") not in rendered(cluster, *version, "--set", "admission.mode=policy")
    assert policies | hooks <= kinds["webhook+policy"]
    # The default, auto: the policies where the apiserver serves MutatingAdmissionPolicy v1, else the webhook.
    served = ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
    assert {k for k, _ in rendered(cluster, *version, *served)} == kinds["policy"]
    assert {k for k, _ in rendered(cluster, *version)} == kinds["webhook"]
    both = rendered(cluster, *version, "--set", "admission.mode=webhook+policy", "--set-json",
                    'webhook.namespaceSelector={"team": "a"}')  # fmt: skip
    mutating = both["MutatingWebhookConfiguration", "r-gpulane"]["webhooks"]
    assert {h["failurePolicy"] for h in mutating} == {"Ignore"}, "the policies hold the caps while it is down"
    specs = {name.removeprefix("r-gpulane-"): doc["spec"] for (kind, name), doc in both.items() if
             kind in ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy")}  # fmt: skip
    generated = cel.specs()
    assert specs.keys() == generated.keys()
    operator = "system:serviceaccount:ns:r-gpulane-operator"
    for key in ("job-defaults", "job-rules"):  # the release's operator may create its chains' steps as they are
        variables = [cel.operators_variable([operator]), *generated[key]["variables"][1:]]
        assert specs[key] == {**generated[key], "variables": variables}
    status = specs["status-outcomes"]["matchConditions"]
    assert status[-1] == cel.not_by([operator])
    binding = both["ValidatingAdmissionPolicyBinding", "r-gpulane-job-rules"]["spec"]
    assert binding["paramRef"] == {"name": "default", "parameterNotFoundAction": "Deny"}
    assert binding["matchResources"] == {"namespaceSelector": {"matchLabels": {"team": "a"}}}
    assert "matchResources" not in both["ValidatingAdmissionPolicyBinding", "r-gpulane-policy-rules"]["spec"]
    objects = [doc for (kind, _), doc in both.items() if kind in policies]
    applied = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(objects))
    assert applied.stdout.count("(server dry run)") == 8, applied.stdout
    old = cluster.helm("template", "r", str(CHART), "--kube-version", "1.35.0", "--set", "admission.mode=policy",
                       check=False)  # fmt: skip
    assert old.returncode != 0 and "needs Kubernetes 1.36 or later" in old.stderr


def test_the_web_page_renders_with_the_bridges_keys_tokens_or_anonymous_and_reads_only(cluster: Cluster) -> None:
    """Issue 38: ui.enabled installs ``gpulane ui``; the bridge's keys log in when the bridge is installed, the
    anonymous page only when asked for, and its account reads gpulane's kinds and writes nothing."""
    keys = ["--set", "bridge.enabled=true", "--set", "bridge.keys.existingSecret=keys"]
    box = rendered(cluster, "--set", "ui.enabled=true", *keys)
    pod = box["Deployment", "r-gpulane-ui"]["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[0] == "ui" and "--keys-file=/etc/gpulane/keys/keys.yaml" in args and "--anonymous" not in args
    assert {"name": "keys", "secret": {"secretName": "keys"}} in pod["volumes"]
    rules = box["ClusterRole", "r-gpulane-ui"]["rules"]
    assert {verb for rule in rules if rule["apiGroups"] == ["gpulane.io"] for verb in rule["verbs"]} == {
        "get", "list", "watch"}  # fmt: skip
    assert ("NetworkPolicy", "r-gpulane-ui") in box and ("Ingress", "r-gpulane-ui") not in box
    alone = rendered(cluster, "--set", "ui.enabled=true", "--set", "ui.auth.anonymous=true")
    args = alone["Deployment", "r-gpulane-ui"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--anonymous" in args and not [a for a in args if a.startswith("--keys-file")]  # no bridge, no keys
    ingress = rendered(cluster, "--set", "ui.enabled=true", "--set", "ui.ingress.enabled=true",
                       "--set", "ui.ingress.host=gpu.example.org", "--set", "ui.ingress.tlsSecret=gpu-tls")  # fmt: skip
    spec = ingress["Ingress", "r-gpulane-ui"]["spec"]
    assert spec["rules"][0]["host"] == "gpu.example.org" and spec["tls"][0]["secretName"] == "gpu-tls"
    no_host = cluster.helm("template", "r", str(CHART), "--set", "ui.enabled=true", "--set", "ui.ingress.enabled=true",
                           check=False)  # fmt: skip
    assert no_host.returncode != 0 and "ui.ingress.host" in no_host.stderr
    assert not [k for k in rendered(cluster) if k[1] == "r-gpulane-ui"]  # off by default
