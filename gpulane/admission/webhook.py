"""The admission webhook's kopf registrations; the decisions are in ``review.py``.

Importing this module registers the handlers, so ``gpulane operator`` imports it only with ``--webhook``.
The webhook keeps its own view of the GpuPolicy and the GpuModels (listed at start, then watched), so
it runs the same alone (``gpulane webhook``) or inside the operator.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import kopf

# kopf.operator() takes a memories container (`memories=`); its class lives in a private module.
from kopf._cogs.structs import bodies, ephemera
from kopf._core.reactor import inventory
from kubernetes.aio.client import ApiClient

from gpulane.admission.configuration import (
    MUTATE_CHAIN,
    MUTATE_JOB,
    VALIDATE_CHAIN,
    VALIDATE_JOB,
    VALIDATE_POLICY,
    VALIDATE_STATUS,
)
from gpulane.admission.review import (
    Refused,
    author_annotations,
    check_author,
    finalizers_on_create,
    mutate_job,
    validate_job,
    validate_policy,
    validate_status,
)
from gpulane.admission.rules import Caller
from gpulane.api.admission import AdmissionPolicy
from gpulane.api.chains import CHAIN_LABEL
from gpulane.api.resources import GROUP, VERSION, GpuPolicySpec
from gpulane.api.run_limits import RunLimits
from gpulane.core.policy import Policy
from gpulane.kube.client import Gone, Kube, backoff
from gpulane.kube.login import credentials

log = logging.getLogger(__name__)

# How often the certificate files are re-read: a rotated certificate is served within this time.
CERT_CHECK_SECONDS = 10.0


class AdmissionMemories(inventory.ResourceMemories):
    """kopf keeps a memory for each object it reviews on UPDATE, and forgets it only on a watched DELETED
    event. The standalone webhook watches no GpuJobs, so it would keep one for every job ever updated:
    here GpuJob reviews are never remembered (the handlers keep their state in the shared memo)."""

    async def recall(
        self,
        raw_body: bodies.RawBody,
        *,
        memobase: ephemera.AnyMemo | None = None,
        noticed_by_listing: bool = False,
        ephemeral: bool = False,
    ) -> inventory.ResourceMemory:
        ephemeral = ephemeral or raw_body.get("kind") in ("GpuJob", "GpuChain")
        return await super().recall(
            raw_body, memobase=memobase, noticed_by_listing=noticed_by_listing, ephemeral=ephemeral
        )


class AdmissionState:
    """The webhook's view of the cluster: the policy in effect and the models that exist."""

    def __init__(self, kube: Kube, operators: frozenset[str] = frozenset()) -> None:
        self.kube = kube
        self.operators = operators  # usernames whose status writes are the operator's
        self.policy = Policy()
        self.admission = AdmissionPolicy()
        self.run_limits = RunLimits()
        self.models: set[str] = set()

    def use_policy(self, spec: dict[str, Any] | None) -> None:
        try:
            parsed = GpuPolicySpec.model_validate(spec or {})
            parsed.admission.check_against(parsed.scoring())
        except ValueError as err:  # refused by the validating webhook; kept out of the cache too
            log.error("ignoring an invalid GpuPolicy: %s", err)
            return
        self.policy, self.admission, self.run_limits = parsed.scoring(), parsed.admission, parsed.run_limits

    async def load(self) -> None:
        """As the operator's rebuild: a fresh install's 429 (new CRDs' storage initializing) or a timeout is
        waited out here, not left to kopf, which retries a failed startup only a minute later."""
        async for attempt in backoff(log, "loading the policy and models failed", initial=0.2, max_backoff=10.0):
            with attempt:
                with contextlib.suppress(Gone):
                    self.use_policy((await self.kube.get_cluster("gpupolicies", "default")).get("spec"))
                self.models = {m["metadata"]["name"] for m in await self.kube.list_cluster("gpumodels")}

    async def model_known(self, name: str) -> bool:
        """From the cache, or the API for a model created a moment ago (in the same `kubectl apply`)."""
        if name in self.models:
            return True
        try:
            await self.kube.get_cluster("gpumodels", name)
        except Gone:
            return False
        self.models.add(name)
        return True


def _caller(userinfo: kopf.UserInfo, body: kopf.Body) -> Caller:
    return Caller(
        username=str(userinfo.get("username", "")),
        groups=tuple(str(g) for g in userinfo.get("groups") or ()),
        namespace=body.metadata.namespace,
    )


def _state(memo: Any) -> AdmissionState:
    state: AdmissionState = memo.admission
    return state


@kopf.on.startup()
async def start_webhook(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    serving = memo.webhook
    configure(
        settings, host=serving["host"], port=serving["port"], certfile=serving["certfile"], keyfile=serving["keyfile"]
    )
    kube = Kube(ApiClient(await credentials(memo)), namespace="default", agent="gpulane-admission")
    memo.admission = AdmissionState(kube, frozenset(serving.get("operators") or ()))
    await memo.admission.load()


@kopf.on.event(GROUP, VERSION, "gpupolicies")
async def policy_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    obj: dict[str, Any] = dict(event["object"])
    _state(memo).use_policy(None if event["type"] == "DELETED" else obj.get("spec"))


@kopf.on.event(GROUP, VERSION, "gpumodels")
async def model_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    name = event["object"]["metadata"]["name"]
    models = _state(memo).models
    if event["type"] == "DELETED":
        models.discard(name)
    else:
        models.add(name)


# A GpuChain carries the fields of the jobs it makes: admission judges them on the chain, as its author's.
JOB_FIELDS = ("model", "priority", "tier", "member", "maxRunSeconds", "expectedRunSeconds")


def _job_fields(body: dict[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    return {**body, "spec": {k: v for k, v in spec.items() if k in JOB_FIELDS}}


def _chain_step(body: kopf.Body, userinfo: kopf.UserInfo, state: AdmissionState) -> bool:
    """A GpuChain's step, created by the operator: the chain was admitted, its step passes as it is (the
    configurations' matchCondition says the same; this is for apiservers that skip matchConditions)."""
    return str(userinfo.get("username", "")) in state.operators and CHAIN_LABEL in (body.metadata.labels or {})


def _default(spec: dict[str, Any], body: kopf.Body, patch: kopf.Patch, userinfo: kopf.UserInfo,
             warnings: list[str], state: AdmissionState) -> None:  # fmt: skip
    try:
        mutation = mutate_job(spec, _caller(userinfo, body), state.admission, state.policy, state.run_limits)
    except Refused as err:
        raise kopf.AdmissionError(str(err), code=403) from None
    for key, value in mutation.spec.items():
        patch.spec[key] = value
    for key, value in mutation.annotations.items():
        patch.metadata.annotations[key] = value
    warnings.extend(mutation.warnings)


async def _validate(new: dict[str, Any], old: dict[str, Any] | None, body: kopf.Body, userinfo: kopf.UserInfo,
                    state: AdmissionState) -> None:  # fmt: skip
    model = (new.get("spec") or {}).get("model")
    known = isinstance(model, str) and await state.model_known(model)
    try:
        validate_job(new, old, _caller(userinfo, body), state.admission, state.policy, known, state.run_limits)
    except Refused as err:
        raise kopf.AdmissionError(str(err), code=403) from None


@kopf.on.mutate(GROUP, VERSION, "gpujobs", id=MUTATE_JOB, operations=["CREATE"])
async def default_job(
    spec: kopf.Spec, body: kopf.Body, patch: kopf.Patch, userinfo: kopf.UserInfo, warnings: list[str], memo: Any,
    **_: Any,
) -> None:  # fmt: skip
    state = _state(memo)
    if not _chain_step(body, userinfo, state):
        _default(dict(spec), body, patch, userinfo, warnings, state)
        if (finalizers := finalizers_on_create(body.metadata.get("finalizers") or [])) is not None:
            patch.metadata["finalizers"] = finalizers


@kopf.on.mutate(GROUP, VERSION, "gpuchains", id=MUTATE_CHAIN, operations=["CREATE"])
async def default_chain(
    spec: kopf.Spec, body: kopf.Body, patch: kopf.Patch, userinfo: kopf.UserInfo, warnings: list[str], memo: Any,
    **_: Any,
) -> None:  # fmt: skip
    _default(_job_fields(dict(body))["spec"], body, patch, userinfo, warnings, _state(memo))
    for key, value in author_annotations(_caller(userinfo, body)).items():  # whatever the author wrote there
        patch.metadata.annotations[key] = value


@kopf.on.validate(GROUP, VERSION, "gpujobs", id=VALIDATE_JOB, operations=["CREATE", "UPDATE"])
async def validate_gpujob(body: kopf.Body, userinfo: kopf.UserInfo, memo: Any, **kwargs: Any) -> None:
    old: kopf.Body | None = kwargs.get("old")
    state = _state(memo)
    if not _chain_step(body, userinfo, state):
        await _validate(dict(body), None if old is None else dict(old), body, userinfo, state)


@kopf.on.validate(GROUP, VERSION, "gpuchains", id=VALIDATE_CHAIN, operations=["CREATE", "UPDATE"])
async def validate_gpuchain(body: kopf.Body, userinfo: kopf.UserInfo, memo: Any, **kwargs: Any) -> None:
    old: kopf.Body | None = kwargs.get("old")
    previous = None if old is None else _job_fields(dict(old))
    if old is not None:
        try:
            check_author(body.metadata, old.get("metadata") or {})
        except Refused as err:
            raise kopf.AdmissionError(str(err), code=403) from None
    await _validate(_job_fields(dict(body)), previous, body, userinfo, _state(memo))


@kopf.on.validate(GROUP, VERSION, "gpujobs", subresource="status", id=VALIDATE_STATUS, operations=["UPDATE"])
async def validate_gpujob_status(body: kopf.Body, userinfo: kopf.UserInfo, memo: Any, **kwargs: Any) -> None:
    old: kopf.Body | None = kwargs.get("old")
    try:
        validate_status(dict(body), {} if old is None else dict(old), _caller(userinfo, body), _state(memo).operators)
    except Refused as err:
        raise kopf.AdmissionError(str(err), code=403) from None


@kopf.on.validate(GROUP, VERSION, "gpupolicies", id=VALIDATE_POLICY, operations=["CREATE", "UPDATE"])
async def validate_gpupolicy(spec: kopf.Spec, **_: Any) -> None:
    try:
        validate_policy(dict(spec))
    except Refused as err:
        raise kopf.AdmissionError(str(err), code=422) from None


def configure(settings: kopf.OperatorSettings, *, host: str, port: int, certfile: str, keyfile: str) -> None:
    """Serve TLS from mounted files (kopf restarts its server when they change); never manage configurations.

    The webhook configurations are installed by whoever deploys gpulane (the chart, or the e2e suite
    with ``gpulane webhook-config``): kopf must not overwrite configurations it did not create.
    """
    settings.admission.server = kopf.WebhookServer(
        addr=host, port=port, certfile=certfile, pkeyfile=keyfile, file_check_interval=CERT_CHECK_SECONDS
    )
    settings.admission.managed = None
