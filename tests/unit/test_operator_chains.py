"""Unit tests of gpulane/operator/chains.py against the in-memory Kube of test_operator_controller.py:
steps created one at a time, the status written, an Event per step's end, and none again after a restart."""

from __future__ import annotations

import asyncio
from typing import Any

from gpulane.admission.review import author_annotations
from gpulane.admission.rules import Caller
from gpulane.api.admission import AdmissionPolicy
from gpulane.core.policy import Policy
from gpulane.operator.chains import Chains

from .test_operator_controller import NS, Clock, FakeKube

Body = dict[str, Any]


class World:
    def __init__(self) -> None:
        self.clock = Clock()
        self.kube = FakeKube(self.clock)
        self.tasks: list[asyncio.Task[Any]] = []
        self.admission = AdmissionPolicy()
        self.chains = self.restarted()

    def restarted(self) -> Chains:
        return Chains(self.kube, self.clock, lambda c: self.tasks.append(asyncio.ensure_future(c)),
                      run_seconds=lambda model: 60.0, rules=lambda: (self.admission, Policy()))  # fmt: skip

    async def settle(self) -> None:
        while self.tasks:
            await self.tasks.pop(0)

    def chain(self, **spec: Any) -> Body:
        return self.kube.put("gpuchains", {"metadata": {"name": "film", "namespace": NS},
                                           "spec": {"model": "m", "priority": "batch", **spec}})  # fmt: skip

    def status(self) -> Body:
        return self.kube.get(f"gpuchains/{NS}/film").get("status") or {}

    def step_ends(self, name: str, phase: str = "Succeeded") -> Body:
        status = {"phase": phase, "startedAt": "2024-05-01T12:00:00Z", "finishedAt": "2024-05-01T12:04:00Z"}
        return self.kube.update(f"gpujobs/{NS}/{name}", {"status": status})

    def events(self) -> list[Any]:
        return [c.body["reason"] for c in self.kube.calls_of("event")]


def test_steps_are_created_one_at_a_time_with_the_status_and_an_event_per_end() -> None:
    async def scenario() -> None:
        w = World()
        w.chains.chain_event("ADDED", w.chain(count=3))
        await w.settle()
        assert [c.target for c in w.kube.calls_of("create_job")] == [f"gpujobs/{NS}/film-0"]
        step = w.kube.job("film-0")
        assert step["metadata"]["labels"]["gpulane.io/chain"] == "film" and step["spec"]["priority"] == "batch"
        assert w.status()["progress"] == "0/3" and w.status()["current"]["job"] == "film-0"
        w.chains.job_event("ADDED", step)
        await w.settle()
        w.chains.job_event("MODIFIED", w.step_ends("film-0"))
        await w.settle()
        assert [c.target for c in w.kube.calls_of("create_job")][-1] == f"gpujobs/{NS}/film-1"
        assert w.events() == ["StepSucceeded"]
        status = w.status()
        assert (status["progress"], status["succeededSteps"], status["gpuSeconds"]) == ("1/3", "0", 240.0)
        assert status["estimatedCompletion"], status

        # A restart: the first list shows the chain and its ended step again; no Event is posted again,
        # and no step is created twice.
        w.kube.calls.clear()
        w.chains = w.restarted()
        w.chains.chain_event(None, w.kube.get(f"gpuchains/{NS}/film"))
        w.chains.job_event(None, w.kube.job("film-0"))
        w.chains.job_event(None, w.kube.job("film-1"))
        await w.settle()
        assert w.events() == [], "no Event for an end the first list shows"
        assert {c.target for c in w.kube.calls_of("create_job")} <= {f"gpujobs/{NS}/film-1"}, "made before: a 409"

    asyncio.run(scenario())


def test_a_chain_deleted_forgets_its_steps_and_a_status_write_is_no_reason_to_reconcile() -> None:
    async def scenario() -> None:
        w = World()
        body = w.chain(count=2)
        w.chains.chain_event("ADDED", body)
        await w.settle()
        writes = len(w.kube.calls_of("patch_chain_status"))
        w.chains.chain_event("MODIFIED", w.kube.get(f"gpuchains/{NS}/film"))  # our own status write, same generation
        await w.settle()
        assert len(w.kube.calls_of("patch_chain_status")) == writes
        w.chains.chain_event("DELETED", body)
        assert ("team-a", "film") not in w.chains.chains and ("team-a", "film") not in w.chains.steps

    asyncio.run(scenario())


def test_a_chain_that_failed_stays_failed_after_its_steps_jobs_are_deleted() -> None:
    """Review M5: the failed step's job goes (its TTL); the chain neither comes back to Running nor makes the
    step again. A change of its spec is the go-ahead to try again."""

    async def scenario() -> None:
        w = World()
        w.chains.chain_event("ADDED", w.chain(count=2))
        await w.settle()
        w.chains.job_event("ADDED", w.kube.job("film-0"))
        w.chains.job_event("MODIFIED", w.step_ends("film-0", "Failed"))
        await w.settle()
        assert (w.status()["phase"], w.status()["failedSteps"]) == ("Failed", "0")
        w.chains.job_event("DELETED", w.kube.job("film-0"))  # the TTL
        await w.settle()
        assert w.status()["phase"] == "Failed", w.status()
        assert "its jobs are gone" in w.status()["message"]
        assert [c.target for c in w.kube.calls_of("create_job")] == [f"gpujobs/{NS}/film-0"], "never made again"

        # The user raises the retries: a new generation, and the step is tried afresh.
        chain = w.kube.get(f"gpuchains/{NS}/film")
        chain["spec"]["onFailure"] = {"retries": 1}
        chain["metadata"]["generation"] = 2
        w.chains.chain_event("MODIFIED", w.kube.put("gpuchains", chain))
        await w.settle()
        assert w.status()["phase"] == "Running" and "failedSteps" not in w.status(), w.status()
        assert len(w.kube.calls_of("create_job")) == 2

    asyncio.run(scenario())


def test_a_job_that_only_carries_a_chains_labels_is_not_its_step() -> None:
    """Review L6: anyone who may create jobs in the namespace can write a chain's labels. A forged step marked
    Succeeded no longer marks the shot done, and one that took a step's name stalls the chain saying so."""

    async def scenario() -> None:
        w = World()
        forged_done = {"metadata": {"name": "not-a-step", "namespace": NS,
                                    "labels": {"gpulane.io/chain": "film", "gpulane.io/step": "0"}},
                       "spec": {"model": "m"}, "status": {"phase": "Succeeded"}}  # fmt: skip
        w.chains.job_event("ADDED", w.kube.put("gpujobs", forged_done))
        squatter = {"metadata": {"name": "film-1", "namespace": NS,
                                 "labels": {"gpulane.io/chain": "film", "gpulane.io/step": "1"}},
                    "spec": {"model": "m"}}  # fmt: skip
        w.chains.job_event("ADDED", w.kube.put("gpujobs", squatter))
        w.chains.chain_event("ADDED", w.chain(count=2))
        await w.settle()
        assert [c.target for c in w.kube.calls_of("create_job")] == [f"gpujobs/{NS}/film-0"], "step 0 is not done"
        assert w.status()["progress"] == "0/2"
        w.chains.job_event("ADDED", w.kube.job("film-0"))
        w.chains.job_event("MODIFIED", w.step_ends("film-0"))
        await w.settle()
        assert w.events() == ["StepSucceeded"], "one Event, for the chain's own step"
        assert (
            "step job film-1 cannot be created: a GpuJob of that name exists that this chain does not own"
            in (w.status()["message"])
        )
        assert w.status()["progress"] == "1/2"

    asyncio.run(scenario())


def test_each_step_is_judged_again_as_its_authors_against_the_rules_in_force() -> None:
    """Issue 34's L2: a chain is admitted once, as its author's; its steps may come for days. Once the rule that
    granted its priority (and its tier) is gone, the next step is capped to what the author gets today, said
    once in a StepJudged Event; a chain that admission never saw (no author annotation) passes as it is."""

    async def scenario() -> None:
        w = World()
        rule = {"name": "studio", "users": ["alice"], "maxPriority": 100, "tier": "pro"}
        w.admission = AdmissionPolicy.model_validate({"rules": [rule]})
        chain = w.chain(count=3, priority=100, tier="pro", member="alice")
        chain["metadata"]["annotations"] = author_annotations(Caller("alice", ("studio-artists",), NS))
        w.chains.chain_event("ADDED", w.kube.put("gpuchains", chain))
        await w.settle()
        first = w.kube.job("film-0")["spec"]
        assert (first["priority"], first["tier"], first["member"]) == (100, "pro", "alice")

        w.admission = AdmissionPolicy()  # the rule is removed: alice gets the default cap 0 and tier free
        w.chains.job_event("ADDED", w.kube.job("film-0"))
        await w.settle()
        w.chains.job_event("MODIFIED", w.step_ends("film-0"))
        await w.settle()
        second = w.kube.job("film-1")["spec"]
        assert (second["priority"], second["tier"], second["member"]) == (0, "free", "alice")
        [judged] = [c.body for c in w.kube.calls_of("event") if c.body["reason"] == "StepJudged"]
        assert judged["warning"] and "priority 100 capped to 0 for user alice" in judged["message"]
        assert "tier 'pro' is not user alice's: 'free'" in judged["message"]

        unjudged = World()  # no author annotation: created without admission, its steps pass as they are
        unjudged.chains.chain_event("ADDED", unjudged.chain(count=1, priority=100))
        await unjudged.settle()
        assert unjudged.kube.job("film-0")["spec"]["priority"] == 100

    asyncio.run(scenario())
