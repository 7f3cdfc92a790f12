"""GpuChains on the real apiserver (issue 19, docs/chains.md): the operator creates a chain's steps as
GpuJobs one at a time, an interactive job overtakes between two steps, the chain's status tells progress
and an ETA, suspending stops new steps, and deleting the chain takes its steps with it. The test plays the
executor: it ends each Running step through the job's status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .operator_support import API, GROUP, VERSION, OperatorProcess, World
from .support import REPO, wait_until
from .test_explain import kubectl_gpulane

pytestmark = pytest.mark.e2e("kwok")


def chain_status(world: World, name: str) -> dict[str, Any]:
    body = world.custom.get_namespaced_custom_object(GROUP, VERSION, world.namespace, "gpuchains", name)
    return body.get("status") or {}


def patch_chain(world: World, name: str, spec: dict[str, Any]) -> None:
    world.custom.patch_namespaced_custom_object(GROUP, VERSION, world.namespace, "gpuchains", name, {"spec": spec})


def run_step(world: World, index: int) -> None:
    world.wait_phase(f"film-{index}", "Running")
    world.complete(f"film-{index}")


def test_a_ten_step_chain_runs_one_step_at_a_time_and_lets_an_interactive_job_through(
    world: World, operator: OperatorProcess
) -> None:
    world.lane()
    model = world.model("render", ready_delay="0s", expectedRunSeconds=60)
    chain = {"apiVersion": API, "kind": "GpuChain", "metadata": {"name": "film", "namespace": world.namespace},
             "spec": {"model": model, "priority": "batch", "count": 10}}  # fmt: skip
    world.apply(chain)
    for index in range(3):
        run_step(world, index)
        # The next step exists only once this one has ended, and the chain says how far it is.
        wait_until(lambda i=index: chain_status(world, "film").get("progress") == f"{i + 1}/10",
                   what=f"progress {index + 1}/10")  # fmt: skip
    status = chain_status(world, "film")
    assert status["phase"] == "Running" and status["completed"] == 3 and status["total"] == 10
    assert status["estimatedCompletion"] and status["current"]["job"] == "film-3", status
    assert {j["metadata"]["name"] for j in world.jobs()} == {"film-0", "film-1", "film-2", "film-3"}

    # Step 3 runs; an interactive job arrives. When step 3 ends, step 4 is created behind it: it goes first.
    world.wait_phase("film-3", "Running")
    world.job("urgent", model, priority="interactive")
    world.wait_phase("urgent", "Pending")
    world.complete("film-3")
    world.wait_phase("urgent", "Running")
    assert world.wait_phase("film-4", "Pending")["position"] == 1, "the next step waits behind the interactive job"
    world.complete("urgent")
    run_step(world, 4)
    # The chain's story names the job that went between its steps.
    wait_until(lambda: chain_status(world, "film").get("progress") == "5/10", what="step 4 counted")
    [row] = json.loads(kubectl_gpulane(world.cluster, "chains", "-n", world.namespace, "-o", "json"))
    assert (row["chain"], row["progress"], row["current"]) == (f"{world.namespace}/film", "5/10", "film-5"), row
    story = kubectl_gpulane(world.cluster, "why", "film", "-n", world.namespace)
    assert story.startswith(f"{world.namespace}/film (Running): 5/10 steps done"), story

    # Suspended: the step in flight ends, and no new one is made until the chain resumes.
    world.wait_phase("film-5", "Running")
    patch_chain(world, "film", {"suspend": True})
    wait_until(lambda: chain_status(world, "film").get("phase") == "Suspended" or None, what="the chain suspended")
    world.complete("film-5")
    wait_until(lambda: chain_status(world, "film").get("progress") == "6/10", what="step 5 counted")
    assert "film-6" not in {j["metadata"]["name"] for j in world.jobs()}, "a suspended chain makes no step"
    patch_chain(world, "film", {"suspend": False, "inFlight": 2})
    world.wait_phase("film-6", "Running")
    world.wait_phase("film-7", "Pending")
    status = chain_status(world, "film")
    assert status["phase"] == "Running" and status["gpuSeconds"] > 0

    # Deleting the chain takes its steps: the waiting one leaves the queue, the running one is cancelled.
    world.custom.delete_namespaced_custom_object(GROUP, VERSION, world.namespace, "gpuchains", "film")
    wait_until(lambda: not [j for j in world.jobs() if j["metadata"]["name"] in ("film-6", "film-7")],
               timeout=60, what="the chain's steps gone with it")  # fmt: skip


def test_the_example_chain_is_a_valid_gpuchain(world: World) -> None:
    out = world.cluster.kubectl("apply", "--dry-run=server", "-f", str(REPO / "examples" / "chains" / "film.yaml"))
    assert "gpuchain.gpulane.io/film created (server dry run)" in out.stdout
