"""The kopf registrations. Each handler hands a watch event to the controller and returns.

Only event-level handlers are used: kopf's change-detection handlers would store a diff base and
progress annotations on every GpuJob, an extra write per job and per change. Nothing here decides.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any, cast

import kopf
from kubernetes.aio.client import ApiClient

from gpulane.api.contract import BACKEND_SELECTOR, EXECUTOR_SELECTOR, Body
from gpulane.api.resources import GROUP, VERSION
from gpulane.api.shards import Shard
from gpulane.kube import leader
from gpulane.kube.client import Kube
from gpulane.kube.login import credentials
from gpulane.operator import health
from gpulane.operator.chains import Chains
from gpulane.operator.controller import Controller
from gpulane.operator.rebuild import rebuild
from gpulane.operator.settings import Settings

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
    shard = Shard(memo.settings.get("shard"))
    settings.watching.label_selectors["", "pods"] = f"{BACKEND_SELECTOR},{shard.selector}"
    for plural in ("gpujobs", "gpuchains", "gpulanes"):  # every shard sees every GpuModel: where its jobs go
        settings.watching.label_selectors[GROUP, plural] = shard.selector
    settings.watching.label_selectors["coordination.k8s.io", "leases"] = EXECUTOR_SELECTOR
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330  # a watch the apiserver silently dropped is noticed and reopened
    settings.networking.request_timeout = 30
    # kopf retries a failed startup: what a previous attempt made (the controller, the bound port) is kept.
    if memo.get("controller") is None:
        memo.kube = Kube(ApiClient(await credentials(memo)), memo.namespace)  # with its election plumbing
        memo.controller = Controller(memo.kube, Settings(**memo.settings))
    ctl: Controller = memo.controller
    if memo.get("chains") is None:
        memo.chains = Chains(ctl.kube, ctl.clock, ctl.spawn, lambda model: ctl.dispatcher.model(model).run_seconds,
                             lambda: (ctl.observed.admission, ctl.dispatcher.policy),
                             lambda chain: ctl.router.hand_over("gpuchains", chain))  # fmt: skip
    if memo.get("health") is None:
        # A standby is ready too: it stands by, as it should (the leader's /readyz says the state is rebuilt).
        memo.health = await health.serve(memo.host, memo.port, ctl.metrics.registry, lambda: _ready(ctl, memo))
    if memo.election is None:
        ctl.metrics.leader.set(1)
    elif memo.get("elected") is None:
        memo.elected = await _elected(ctl, memo)
    await rebuild(ctl)
    ctl.start()


def _ready(ctl: Controller, memo: kopf.Memo) -> bool:
    """The leader once its state is rebuilt and checked by a resync; a standby always (it stands by, as it
    should)."""
    return (ctl.ready and ctl.synced) or (memo.election is not None and not memo.get("leading", False))


async def _elected(ctl: Controller, memo: kopf.Memo) -> asyncio.Task[None]:
    """Stand by until this replica leads: until then it writes nothing, and then it rebuilds as after a
    restart. Writes are fenced by the Lease from the start; losing it ends the process."""
    election = memo.election
    fence = leader.Fence()
    kube: Kube = memo.kube
    kube.fence, kube.write_timeout = fence.open, election["timing"].write_timeout

    def led() -> None:
        memo.leading = True
        ctl.metrics.leader.set(1)
        ctl.metrics.leader_transitions.inc()

    def lost() -> None:
        memo.leading = False
        ctl.metrics.leader.set(0)
        ctl.metrics.leader_transitions.inc()
        os.kill(os.getpid(), signal.SIGTERM)  # kopf's cleanup runs; the Deployment starts a standby again

    lease = ctl.router.shard.lease
    log.info("standing by for the Lease %s/%s as %s", election["namespace"], lease, election["identity"])
    return await leader.campaign(kube.api, election["namespace"], election["identity"], election["timing"],
                                 fence, led, lost, lease)  # fmt: skip


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("elected") is not None:
        memo.elected.cancel()  # it closes the fence: no write of ours starts from here
        await asyncio.gather(memo.elected, return_exceptions=True)
    ctl: Controller | None = memo.get("controller")
    if ctl is not None:
        await ctl.stop()
        if memo.get("leading", False):  # told to stop while leading: a standby need not wait out the Lease
            election = memo.election
            await leader.release(memo.kube.api, election["namespace"], election["identity"], election["timing"],
                                 ctl.router.shard.lease)  # fmt: skip
        await memo.kube.close()
    if memo.get("health") is not None:
        await memo.health.cleanup()


def _ctl(memo: kopf.Memo) -> Controller:
    ctl: Controller = memo.controller
    return ctl


def _chains(memo: kopf.Memo) -> Chains:
    chains: Chains = memo.chains
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
