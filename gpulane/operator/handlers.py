"""The kopf registrations. Each handler hands a watch event to the controller and returns.

Only event-level handlers are used: kopf's change-detection handlers would store a diff base and
progress annotations on every GpuJob, an extra write per job and per change. Nothing here decides.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import kopf

from gpulane.api.contract import BACKEND_SELECTOR, EXECUTOR_SELECTOR, Body
from gpulane.api.resources import GROUP, VERSION
from gpulane.api.shards import Shard
from gpulane.kube.login import credentials
from gpulane.operator.assembly import Operator
from gpulane.operator.chains import Chains
from gpulane.operator.controller import Controller

log = logging.getLogger(__name__)


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf deep-copies every event's body to diff it for change handlers, which gpulane has none of (see
    above): a quarter of kopf's handling of each event, by py-spy in bench/operator.py latency."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.enabled = False  # gpulane posts its own Events, counted with its other writes
    settings.persistence.diffbase_storage = NoDiffBase()
    operator = _operator(memo)
    shard = Shard(operator.settings.shard)
    settings.watching.label_selectors["", "pods"] = f"{BACKEND_SELECTOR},{shard.selector}"
    for plural in ("gpujobs", "gpuchains", "gpulanes"):  # every shard sees every GpuModel: where its jobs go
        settings.watching.label_selectors[GROUP, plural] = shard.selector
    settings.watching.label_selectors["coordination.k8s.io", "leases"] = EXECUTOR_SELECTOR
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330  # a watch the apiserver silently dropped is noticed and reopened
    settings.networking.request_timeout = 30
    await operator.start(await credentials(memo))


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await _operator(memo).stop()


def _operator(memo: kopf.Memo) -> Operator:
    operator: Operator = memo.operator
    return operator


def _ctl(memo: kopf.Memo) -> Controller:
    ctl = _operator(memo).controller
    assert ctl is not None  # events are handled only once the startup has built it
    return ctl


def _chains(memo: kopf.Memo) -> Chains:
    chains = _operator(memo).chains
    assert chains is not None
    return chains


def _body(event: kopf.RawEvent) -> Body:
    return cast(Body, event["object"])


@kopf.on.event(GROUP, VERSION, "gpujobs")
async def job_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _ctl(memo).job_event(event["type"], _body(event))
    _chains(memo).job_event(event["type"], _body(event))  # a chain's step: its chain's progress


@kopf.on.event(GROUP, VERSION, "gpuchains")
async def chain_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _chains(memo).chain_event(event["type"], _body(event))


@kopf.on.event(GROUP, VERSION, "gpumodels")
async def model_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _ctl(memo).model_event(event["type"], _body(event))


@kopf.on.event(GROUP, VERSION, "gpulanes")
async def lane_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _ctl(memo).lane_event(event["type"], _body(event))


@kopf.on.event(GROUP, VERSION, "gpupolicies")
async def policy_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _ctl(memo).policy_event(event["type"], _body(event))


@kopf.on.event("coordination.k8s.io", "v1", "leases")
async def lease_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _ctl(memo).lease_event(event["type"], _body(event))


@kopf.on.event("", "v1", "nodes")
async def node_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _ctl(memo).node_event(event["type"], _body(event))


@kopf.on.event("", "v1", "pods")
async def pod_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    _ctl(memo).pod_event(event["type"], _body(event))
