"""The apiserver calls an admission webhook that runs on the host (clientConfig.url https://127.0.0.1:PORT)
over TLS, verified against the caBundle. gpulane's admission webhook (issue: admission) relies on this."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from .support import AdmissionWebhookServer, Cluster, wait_until

pytestmark = pytest.mark.e2e("kwok")

REJECT_MESSAGE = "gpulane-e2e-webhook refuses configmaps labelled e2e-reject"


def decide(request: dict[str, Any]) -> tuple[bool, str]:
    labels = (request.get("object") or {}).get("metadata", {}).get("labels") or {}
    if labels.get("e2e-reject") == "true":
        return False, f"{REJECT_MESSAGE} (uid {request.get('uid')})"
    return True, ""


@pytest.fixture
def webhook_server() -> Iterator[AdmissionWebhookServer]:
    server = AdmissionWebhookServer(decide).start()
    yield server
    server.stop()


def test_validating_webhook_on_the_host_is_called_over_tls(
    cluster: Cluster,
    api_client: client.ApiClient,
    core_v1: client.CoreV1Api,
    namespace: str,
    webhook_server: AdmissionWebhookServer,
) -> None:
    admission = client.AdmissionregistrationV1Api(api_client)
    name = f"e2e-host-webhook-{uuid.uuid4().hex[:6]}.gpulane.dev"
    admission.create_validating_webhook_configuration(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": name,
                    "clientConfig": {
                        "url": webhook_server.url("/validate"),
                        "caBundle": base64.b64encode(webhook_server.tls.ca_pem).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                            "scope": "Namespaced",
                        }
                    ],
                    # Only this test's namespace, so a failing webhook cannot disturb anything else.
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 10,
                }
            ],
        }
    )
    try:

        def configmap(name: str, reject: bool) -> client.V1ConfigMap:
            labels = {"e2e-reject": "true"} if reject else {}
            return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels), data={"k": "v"})

        # The apiserver picks up a new webhook configuration within a moment; until then a create
        # succeeds (then we clean up and try again).
        attempt = iter(range(10_000))

        def rejected() -> client.ApiException | None:
            cm = f"rejected-{next(attempt)}"
            try:
                core_v1.create_namespaced_config_map(namespace, configmap(cm, reject=True))
            except client.ApiException as exc:
                return exc
            core_v1.delete_namespaced_config_map(cm, namespace)
            return None

        denial = wait_until(rejected, timeout=60, what="the webhook to reject a labelled ConfigMap")
        assert denial.status == 403, denial
        message = json.loads(denial.body)["message"]
        assert message.startswith(f'admission webhook "{name}" denied the request: {REJECT_MESSAGE}'), message

        # The same webhook lets an ordinary object through.
        core_v1.create_namespaced_config_map(namespace, configmap("allowed", reject=False))
        assert core_v1.read_namespaced_config_map("allowed", namespace).data == {"k": "v"}

        # And the server really saw the AdmissionReviews the apiserver sent.
        reviews = [r for r in webhook_server.reviews if r["request"]["namespace"] == namespace]
        assert {r["apiVersion"] for r in reviews} == {"admission.k8s.io/v1"}
        assert all(r["kind"] == "AdmissionReview" for r in reviews)
        by_name = {r["request"]["name"]: r["request"] for r in reviews}
        assert "allowed" in by_name
        denied_uid = message.split("(uid ")[1].split(")")[0]
        denied = next(r["request"] for r in reviews if r["request"]["uid"] == denied_uid)
        assert denied["operation"] == "CREATE"
        assert denied["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}
        assert denied["userInfo"]["username"] == "gpulane-admin"
        assert "system:masters" in denied["userInfo"]["groups"]
    finally:
        admission.delete_validating_webhook_configuration(name)
