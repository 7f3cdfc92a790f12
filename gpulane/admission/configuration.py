"""The webhook configurations for gpulane's admission handlers, built as plain manifests.

``failurePolicy: Fail``: with the webhook down, no GpuJob can bypass the caps and no broken GpuPolicy can
be stored; the price is that nobody can create jobs until it is back. The status hook alone is
``Ignore``, so executors' outcomes still land and lanes free (see docs/admission.md).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from gpulane.api.chains import CHAIN_LABEL
from gpulane.api.contract import AUTHOR, AUTHOR_GROUPS
from gpulane.api.resources import GROUP, VERSION

NAME = "gpulane"
# The webhook's handler ids, which kopf serves as URL paths.
MUTATE_JOB = "gpujob-defaults"
VALIDATE_JOB = "gpujob-validate"
MUTATE_CHAIN = "gpuchain-defaults"
VALIDATE_CHAIN = "gpuchain-validate"
# What admission caps and defaults: GpuJobs, and GpuChains (whose steps the operator creates as jobs).
ADMITTED = ("gpujobs", "gpuchains")
VALIDATE_POLICY = "gpupolicy-validate"
VALIDATE_STATUS = "gpujob-status-validate"


def _client_config(
    path: str, *, url: str | None, service: tuple[str, str, int] | None, ca_pem: bytes | None
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if url is not None:
        config["url"] = f"{url.rstrip('/')}/{path}"
    elif service is not None:
        namespace, name, port = service
        config["service"] = {"namespace": namespace, "name": name, "port": port, "path": f"/{path}"}
    else:
        raise ValueError("give the webhook's url or its service")
    if ca_pem is not None:
        config["caBundle"] = base64.b64encode(ca_pem).decode()
    return config


def _webhook(
    path: str,
    plural: str,
    operations: list[str],
    scope: str,
    client_config: dict[str, Any],
    namespace_selector: dict[str, str] | None,
) -> dict[str, Any]:
    hook: dict[str, Any] = {
        "name": f"{path}.{GROUP}",
        "clientConfig": client_config,
        "rules": [
            {
                "apiGroups": [GROUP],
                "apiVersions": [VERSION],
                "operations": operations,
                "resources": [plural],
                "scope": scope,
            }
        ],
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
    }
    if namespace_selector and scope == "Namespaced":
        hook["namespaceSelector"] = {"matchLabels": dict(namespace_selector)}
    return hook


# Job UPDATEs that leave the spec alone (the operator's finalizer patches, labels) are not sent to the
# webhook at all: with it down, or the policy changed, finalizers can still come off. The apiserver
# evaluates this; the webhook lets such updates through too, for apiservers that skip matchConditions.
SPEC_CHANGED = {"name": "spec-changed", "expression": "request.operation != 'UPDATE' || object.spec != oldObject.spec"}


def annotation(obj: str, key: str) -> str:
    """CEL: annotation ``key`` of ``obj`` (object, oldObject), '' when it has none."""
    found = f"{obj}.metadata.annotations"
    return f"(has({found}) && '{key}' in {found} ? {found}['{key}'] : '')"


# A chain's author annotations changed (contract.AUTHOR): refused whoever asks, spec changed or not.
AUTHOR_CHANGED = " || ".join(
    f"{annotation('object', k)} != {annotation('oldObject', k)}" for k in (AUTHOR, AUTHOR_GROUPS)
)
SPEC_OR_AUTHOR_CHANGED = {"name": "spec-or-author-changed",
                          "expression": f"{SPEC_CHANGED['expression']} || {AUTHOR_CHANGED}"}  # fmt: skip


# Status writes that change the status; ``operators`` are left out by ``_not_by``: the operator's own
# writes never wait on the webhook (it keeps dispatching and ending jobs while the webhook is down).
STATUS_CHANGED = {
    "name": "status-changed",
    "expression": "!has(object.status) || !has(oldObject.status) || object.status != oldObject.status",
}


def _names(operators: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(user) for user in operators) + "]"


def _not_by(operators: Sequence[str]) -> dict[str, str]:
    return {"name": "not-the-operator", "expression": f"!(request.userInfo.username in {_names(operators)})"}


def not_a_chain_step(operators: Sequence[str]) -> dict[str, str]:
    """The job hooks' and policies' match condition that lets the operator create a GpuChain's steps as they
    are: the chain was admitted under its author's identity, and its steps carry what admission made of it.
    Only the operator's identity passes: a label anyone can write is not enough."""
    labels = "object.metadata.labels"
    expression = f"!(request.userInfo.username in {_names(operators)} && has({labels}) && '{CHAIN_LABEL}' in {labels})"
    return {"name": "not-a-chain-step", "expression": expression}


def webhook_configurations(
    *,
    url: str | None = None,
    service: tuple[str, str, int] | None = None,
    ca_pem: bytes | None = None,
    namespace_selector: dict[str, str] | None = None,
    name: str = NAME,
    operators: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """A MutatingWebhookConfiguration and a ValidatingWebhookConfiguration calling the webhook at ``url``
    (``https://host:port``) or behind ``service`` (namespace, name, port), trusting ``ca_pem``. With the
    ``operators``' usernames, status writes by anyone else are checked too (only an executor's outcome
    passes); without them the webhook could not tell the operator's writes apart, and leaves status alone."""

    def cc(path: str) -> dict[str, Any]:
        return _client_config(path, url=url, service=service, ca_pem=ca_pem)

    mutate_job = _webhook(MUTATE_JOB, "gpujobs", ["CREATE"], "Namespaced", cc(MUTATE_JOB), namespace_selector)
    mutate_chain = _webhook(MUTATE_CHAIN, "gpuchains", ["CREATE"], "Namespaced", cc(MUTATE_CHAIN), namespace_selector)
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [mutate_job, mutate_chain],
    }
    validate_job = _webhook(VALIDATE_JOB, "gpujobs", ["CREATE", "UPDATE"], "Namespaced", cc(VALIDATE_JOB),
                            namespace_selector)  # fmt: skip
    validate_job["matchConditions"] = [SPEC_CHANGED]
    if operators:
        mutate_job["matchConditions"] = [not_a_chain_step(operators)]
        validate_job["matchConditions"].append(not_a_chain_step(operators))
    validate_chain = _webhook(VALIDATE_CHAIN, "gpuchains", ["CREATE", "UPDATE"], "Namespaced", cc(VALIDATE_CHAIN),
                              namespace_selector)  # fmt: skip
    validate_chain["matchConditions"] = [SPEC_OR_AUTHOR_CHANGED]
    hooks = [validate_job, validate_chain]
    if operators:
        validate_status = _webhook(VALIDATE_STATUS, "gpujobs/status", ["UPDATE"], "Namespaced", cc(VALIDATE_STATUS),
                                   namespace_selector)  # fmt: skip
        validate_status["matchConditions"] = [STATUS_CHANGED, _not_by(operators)]
        validate_status["failurePolicy"] = "Ignore"  # the CRD's rules still hold without it
        hooks.append(validate_status)
    hooks.append(_webhook(VALIDATE_POLICY, "gpupolicies", ["CREATE", "UPDATE"], "Cluster", cc(VALIDATE_POLICY), None))
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": hooks,
    }
    return [mutating, validating]
