"""GpuChains on the cluster: each step is an ordinary GpuJob the operator creates, owned by its chain and
labelled with its index, so it goes through the same admission, queue and executor as any job. The next
step is created when one ends, never before. The state machine and the ETA are the core's
(``gpulane/core/chains.py``); this room feeds them the chain and its steps' jobs, creates what they say
and writes the chain's status and Events (docs/chains.md).

Deleting a chain deletes its steps through their owner reference: a queued one leaves the queue, a running
one is cancelled, as any deleted job is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from gpulane.admission.review import author_of, judge_step
from gpulane.api.admission import AdmissionPolicy
from gpulane.api.chains import ATTEMPT_LABEL, CHAIN_LABEL, STEP_LABEL, ChainStep, GpuChainSpec, GpuChainStatus
from gpulane.api.conditions import condition, merge_condition
from gpulane.api.contract import FINALIZER, Body
from gpulane.api.resources import API_VERSION
from gpulane.api.shards import SHARD_LABEL, shard_of
from gpulane.api.times import format_time, parse_time
from gpulane.core.chains import (
    ChainRules,
    StepJob,
    estimated_completion,
    format_steps,
    parse_steps,
    plan,
    step_name,
)
from gpulane.core.policy import Policy
from gpulane.core.validation import describe
from gpulane.kube.client import Conflict, Gone
from gpulane.kube.protocol import KubeClient

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, chain)


def step_of(body: Body) -> tuple[Key, StepJob] | None:
    """The chain and step a job belongs to, from its labels; None for a job of no chain."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    chain, index, attempt = labels.get(CHAIN_LABEL), str(labels.get(STEP_LABEL)), str(labels.get(ATTEMPT_LABEL, "0"))
    if not chain or not index.isdigit() or not attempt.isdigit():
        return None
    status = body.get("status") or {}
    step = StepJob(
        index=int(index),
        attempt=int(attempt),
        name=meta["name"],
        phase=status.get("phase"),
        started_at=parse_time(status.get("startedAt")),
        finished_at=parse_time(status.get("finishedAt")),
        position=status.get("position"),
        estimated_start=parse_time(status.get("estimatedStart")),
        reason=status.get("reason"),
    )
    return (meta["namespace"], chain), step


def owner_of(body: Body) -> str | None:
    """The uid of the GpuChain that controls a job, from its owner references: a job that merely carries a
    chain's labels (anyone who may create jobs in the namespace can write them) is not that chain's step."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "GpuChain" and ref.get("controller"):
            return str(ref.get("uid") or "") or None
    return None


def rules_of(spec: GpuChainSpec) -> ChainRules:
    return ChainRules(spec.total, spec.in_flight, spec.on_failure.retries, spec.on_failure.then, spec.suspend)


def step_manifest(chain: Body, spec: GpuChainSpec, index: int, attempt: int) -> Body:
    """Step ``index``'s job for its ``attempt``: the chain's job fields, its request, owned by the chain."""
    meta = chain["metadata"]
    shared = {"tier": spec.tier, "member": spec.member, "maxRunSeconds": spec.max_run_seconds,
              "expectedRunSeconds": spec.expected_run_seconds, "request": spec.request(index)}  # fmt: skip
    job_spec: Body = {"model": spec.model, "priority": spec.priority}
    job_spec.update((field, value) for field, value in shared.items() if value is not None)
    owner = {"apiVersion": API_VERSION, "kind": "GpuChain", "name": meta["name"], "uid": meta["uid"],
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    labels = {CHAIN_LABEL: meta["name"], STEP_LABEL: str(index), ATTEMPT_LABEL: str(attempt)}
    if (shard := shard_of(chain)) is not None:  # its steps are in its shard's watch from the start
        labels[SHARD_LABEL] = shard
    job_meta = {"name": step_name(meta["name"], index, attempt), "namespace": meta["namespace"], "labels": labels,
                "ownerReferences": [owner], "finalizers": [FINALIZER]}  # fmt: skip
    return {"apiVersion": API_VERSION, "kind": "GpuJob", "metadata": job_meta, "spec": job_spec}


class Chains:
    def __init__(self, kube: KubeClient, clock: Callable[[], float], spawn: Callable[[Coroutine[Any, Any, Any]], None],
                 run_seconds: Callable[[str], float],
                 rules: Callable[[], tuple[AdmissionPolicy, Policy]],
                 hand_over: Callable[[Body], bool] = lambda chain: False) -> None:  # fmt: skip
        self.kube = kube
        self.clock = clock
        self.spawn = spawn
        self.run_seconds = run_seconds  # a model's learned run time: a step's, for the ETA
        self.rules = rules  # the GpuPolicy's admission rules and scoring in force: each step is judged by them
        self.hand_over = hand_over  # sends a chain whose model is another shard's on to it (True if it did)
        self._judged: dict[Key, str] = {}  # the last StepJudged message posted, to post only changes
        self.chains: dict[Key, Body] = {}
        self.steps: dict[Key, dict[str, StepJob]] = {}
        self.owners: dict[tuple[Key, str], str | None] = {}  # each step job's controlling GpuChain uid
        self._locks: dict[Key, asyncio.Lock] = {}
        self._written: dict[Key, Body] = {}  # the last status written, to write only changes

    def chain_event(self, kind: str | None, body: Body) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            self.chains.pop(key, None)
            self.steps.pop(key, None)
            for owned in [k for k in self.owners if k[0] == key]:
                del self.owners[owned]
            self._locks.pop(key, None)
            self._written.pop(key, None)
            self._judged.pop(key, None)
            return
        if key not in self.chains and self.hand_over(body):
            return
        known = self.chains.get(key)
        self.chains[key] = body
        if known is None or known["metadata"].get("generation") != meta.get("generation"):
            self.spawn(self.reconcile(key))  # new, or its spec changed; not for its status (our own writes)

    def job_event(self, kind: str | None, body: Body) -> None:
        found = step_of(body)
        if found is None:
            return
        key, step = found
        if kind == "DELETED":
            self.steps.get(key, {}).pop(step.name, None)
            self.owners.pop((key, step.name), None)
        else:
            self.owners[(key, step.name)] = owner_of(body)
            steps = self.steps.setdefault(key, {})
            # An end seen happen: not one the first list shows (a restart would post them all again).
            ended = kind is not None and step.ended and not (steps.get(step.name) and steps[step.name].ended)
            steps[step.name] = step
            ours = key in self.chains and self.owners[(key, step.name)] == self.chains[key]["metadata"].get("uid")
            if ended and ours:
                self.spawn(self._step_ended(key, body, step))
        if key in self.chains:
            self.spawn(self.reconcile(key))

    async def reconcile(self, key: Key) -> None:
        """Create the steps the state machine asks for, then write the chain's status if it changed."""
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            chain = self.chains.get(key)
            if chain is None:
                return
            try:
                spec = GpuChainSpec.model_validate(chain.get("spec") or {})
            except ValidationError as err:  # the CRD's schema refuses it first; an old object may still be there
                await self._write_status(key, chain, {"phase": "Failed", "message": describe(err, "spec")})
                return
            rules, now = rules_of(spec), self.clock()
            uid = chain["metadata"].get("uid")
            steps = {n: s for n, s in self.steps.setdefault(key, {}).items() if self.owners.get((key, n)) == uid}
            # What we wrote last is newer than the chain's status as its last event showed it (a step's
            # deletion can come before our write's own event): the steps that ended for good must hold.
            before = {**(chain.get("status") or {}), **self._written.get(key, {})}
            succeeded = parse_steps(before.get("succeededSteps"), rules.total)
            # Steps that failed for good stay so while the chain is as it was; a change of its spec (more
            # retries, say) is the user's go-ahead to try them again.
            unchanged = before.get("observedGeneration") == chain["metadata"].get("generation")
            gave_up = parse_steps(before.get("failedSteps"), rules.total) if unchanged else frozenset()
            decided = plan(rules, steps.values(), now, succeeded, gave_up)
            blocked = None  # why a step cannot be made, said in the status's message
            for index, attempt in decided.create:
                manifest = await self._judged_step(key, chain, step_manifest(chain, spec, index, attempt), index)
                name = manifest["metadata"]["name"]
                try:
                    await self.kube.create_job(manifest)
                except Conflict:  # created before (its watch event is on its way), or someone else's job
                    if (blocked := await self._not_ours(key, name, uid)) is not None:
                        break
                    self.owners[(key, name)] = uid
                except Exception as err:  # refused (admission, quota): said on the chain, tried at its next event
                    log.warning("chain %s/%s: creating step %d failed: %s", *key, index, err)
                    await self._write_status(key, chain, {"message": f"creating step {index} failed: {err}"[:1024]})
                    return
                steps.setdefault(name, StepJob(index, attempt, name))
                self.steps[key].setdefault(name, steps[name])
                self.owners.setdefault((key, name), uid)
                decided = plan(rules, steps.values(), now, succeeded, gave_up)
            step_seconds = spec.expected_run_seconds or self.run_seconds(spec.model)
            eta = estimated_completion(rules, decided, steps.values(), step_seconds, now)
            current = decided.current
            step = None
            if current is not None:
                step = ChainStep(index=current.index, attempt=current.attempt, job=current.name, phase=current.phase,
                                 position=current.position)  # fmt: skip
            status = GpuChainStatus(
                phase=decided.phase,
                progress=f"{decided.completed}/{rules.total}",
                total=rules.total,
                completed=decided.completed,
                succeeded_steps=format_steps(decided.succeeded) or None,
                failed_steps=format_steps(decided.gave_up) or None,
                failed=decided.failed,
                retried=decided.retried,
                current=step,
                # Jobs of ended steps may be gone (their TTL): the time they took is not.
                gpu_seconds=round(max(decided.gpu_seconds, float(before.get("gpuSeconds") or 0)), 1),
                estimated_completion=None if eta is None else format_time(round(eta)),  # no churn in ms
                message=blocked or decided.message,
            ).model_dump(by_alias=True, exclude_none=True)
            for field in ("current", "failedSteps"):
                status.setdefault(field, None)  # a merge patch removes the one written before
            cond = condition("Progressing", decided.phase == "Running", decided.phase, decided.message, now,
                             chain["metadata"].get("generation"))  # fmt: skip
            status["conditions"] = merge_condition(before.get("conditions"), cond)
            status["observedGeneration"] = chain["metadata"].get("generation")
            await self._write_status(key, chain, status)

    async def _judged_step(self, key: Key, chain: Body, manifest: Body, index: int) -> Body:
        """The step as its chain's author may submit it today (issue 34's L2): a chain is admitted once, its
        steps may come for days, after the rule that granted its priority is gone. A change is said once, in a
        StepJudged Event on the chain. A chain that admission never saw (no author annotation) passes as is."""
        author = author_of(chain["metadata"])
        if author is None:
            return manifest
        admission, policy = self.rules()
        manifest["spec"], notes = judge_step(manifest["spec"], author, admission, policy)
        message = "; ".join(notes)
        if notes and self._judged.get(key) != message:
            self._judged[key] = message
            await self.kube.event(chain, "StepJudged", f"step {index} and the next: {message}", warning=True,
                                  now=self.clock())  # fmt: skip
        elif not notes:
            self._judged.pop(key, None)
        return manifest

    async def _not_ours(self, key: Key, name: str, uid: str | None) -> str | None:
        """Why step job ``name`` cannot be made: a job of that name that this chain does not own; None when
        it is the chain's own (or gone meanwhile: the next reconcile makes it)."""
        try:
            job = await self.kube.get_job(key[0], name)
        except Gone:
            return None
        if owner_of(job) == uid:
            return None
        log.warning("chain %s/%s: job %s exists and is not its step", *key, name)
        return (
            f"step job {name} cannot be created: a GpuJob of that name exists that this chain does not own;"
            " delete it, and the chain goes on"
        )[:1024]

    async def _write_status(self, key: Key, chain: Body, status: Body) -> None:
        if self._written.get(key) == status:
            return
        try:
            await self.kube.patch_chain_status(key[0], key[1], {"status": status})
        except Gone:
            return
        self._written[key] = status

    async def _step_ended(self, key: Key, job: Body, step: StepJob) -> None:
        """An Event on the chain for each step's end, as on a job."""
        chain = self.chains.get(key)
        if chain is None:
            return
        status = job.get("status") or {}
        reason = "StepSucceeded" if step.phase == "Succeeded" else "StepFailed"
        message = f"step {step.index} (job {step.name}, attempt {step.attempt + 1}) {str(step.phase).lower()}"
        if status.get("reason"):
            message += f": {status['reason']}"
        ref = {"apiVersion": API_VERSION, "kind": "GpuChain", "metadata": chain["metadata"]}
        await self.kube.event(ref, reason, message, warning=step.phase != "Succeeded", now=self.clock())
