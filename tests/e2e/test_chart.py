"""The Helm chart (charts/gpulane) installed with the pinned helm on the local cluster, whose gpu-0 is a
real kubelet node: the operator, webhook and bridge run from the project image with only the chart's RBAC.

The chart's operator acts on every GpuLane of the cluster (as every gpulane operator does), so this file
must not run beside another operator: the suite runs its tests one after another, and the test that
installs it stops the session's operator first (``no_operator``). The webhook configurations select only
this test's namespace, and everything is removed in a ``finally`` even when the test fails: a dangling
configuration with ``failurePolicy: Fail`` would break every later test.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from kubernetes import client

from .operator_support import World
from .support import REPO, Cluster, localcluster, wait_until

pytestmark = pytest.mark.e2e

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
        ("clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations", []),
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


def remove_release(cluster: Cluster, namespace: str, release: str, fullname: str) -> None:
    """Uninstall, then delete whatever cluster-scoped object could outlive a failed uninstall."""
    cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s", check=False)
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, fullname, "--ignore-not-found")
    selector = f"app.kubernetes.io/instance={release}"
    cluster.kubectl("delete", "clusterrolebindings,clusterroles", "-l", selector, "--ignore-not-found")


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
    # GpuJobs of this namespace only go through the chart's webhook.
    cluster.kubectl("label", "namespace", namespace, f"{SELECTOR_LABEL}={tag}")
    values = {
        "webhook": {"namespaceSelector": {SELECTOR_LABEL: tag}},
        "bridge": {
            "enabled": True,
            "keys": {"inline": {"keys": [{"name": "chart", "key": BRIDGE_KEY, "member": "chart"}]}},
            "executeNamespaces": [namespace],
        },
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
        assert set(pods) == {"operator", "webhook", "bridge"}, sorted(pods)
        for component, pod in pods.items():
            assert pod.spec.node_name == localcluster.GPU_NODE, (component, pod.spec.node_name)
            assert ready(pod), (component, pod.status.conditions)
            container = pod.spec.containers[0]
            assert container.image == "gpulane.local/gpulane:dev"
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

        # 2. The chart's operator dispatches a job onto a kwok lane, its backend pod in the release
        #    namespace (--namespace), and lets the executor complete it.
        lane = world.lane()
        model = world.model("chart")
        world.job("first", model)
        status = world.wait_phase("first", "Running", timeout=90)
        assert status.get("lane") == lane, status
        backend = backend_pods(core_v1, namespace)
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

        # The whole path inside the cluster: the real openai client -> the chart's bridge (a pod, through
        # its Service) -> a GpuJob -> the chart's operator -> a backend pod on gpu-0 that really serves.
        # The kwok lane goes first, so the job can only land on the real one.
        cluster.kubectl("delete", f"gpulanes.gpulane.io/{lane}", "--wait=true")
        wait_until(lambda: not backend_pods(core_v1, namespace), timeout=60, what="the kwok lane's pod gone")
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
        [pod] = backend_pods(core_v1, namespace)
        assert pod.spec.node_name == localcluster.GPU_NODE and pod.metadata.annotations["gpulane.io/lane"] == real_lane
        cluster.kubectl("delete", f"gpulanes.gpulane.io/{real_lane}", "--wait=true")
        wait_until(lambda: not backend_pods(core_v1, namespace), timeout=60, what="the real lane's pod gone")

        # 4. Least privilege: the operator's account may do what it needs and nothing it does not.
        assert can_i(cluster, operator_sa, "create", "pods", "-n", namespace) == "yes"
        assert can_i(cluster, operator_sa, "patch", "gpujobs.gpulane.io", "--subresource=status", "-A") == "yes"
        for denied in [
            ("delete", "nodes"),
            ("get", "secrets", "-A"),
            ("list", "secrets", "-n", namespace),
            ("create", "pods", "-n", "default"),
            ("delete", "pods", "-n", "kube-system"),
            ("delete", "gpujobs.gpulane.io", "-A"),
            ("update", "gpulanes.gpulane.io"),
            ("create", "mutatingwebhookconfigurations"),
        ]:
            assert can_i(cluster, operator_sa, *denied) == "no", denied
        assert can_i(cluster, operator_sa, "update", "leases/gpulane-operator", "-n", namespace) == "yes"
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
        assert can_i(cluster, bridge_sa, "get", "pods", "-n", namespace) == "yes"  # the backend namespace
        assert can_i(cluster, bridge_sa, "list", "pods", "-n", namespace) == "no"
        for elsewhere in ("kube-system", "default"):
            assert can_i(cluster, bridge_sa, "get", "pods", "-n", elsewhere) == "no"
            assert can_i(cluster, bridge_sa, "patch", "gpujobs.gpulane.io", "-n", elsewhere) == "no"
            assert (
                can_i(cluster, bridge_sa, "patch", "gpujobs.gpulane.io", "--subresource=status", "-n", elsewhere)
                == "no"
            )
            assert can_i(cluster, bridge_sa, "create", "configmaps", "-n", elsewhere) == "no"
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


def test_the_release_notes_show_the_first_request_and_how_to_watch_the_queue(cluster: Cluster) -> None:
    notes = cluster.helm("install", "r", str(CHART), "-n", "ns", "--dry-run=client", "--set", "bridge.enabled=true",
                         "--set", "bridge.keys.existingSecret=keys").stdout  # fmt: skip
    notes = notes[notes.index("NOTES:") :]
    assert "curl -s http://r-gpulane-bridge:8090/v1/chat/completions" in notes
    assert '-H "X-LlamaSwap-Priority: interactive"' in notes
    assert "kubectl gpulane queue" in notes and "gpulane why JOB" in notes
