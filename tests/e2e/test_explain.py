"""``gpulane why`` / ``queue`` / ``lanes`` on the real control plane, through the kubectl plugin too."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from .operator_support import OperatorProcess, World
from .support import REPO, Cluster, wait_until

pytestmark = pytest.mark.e2e("kwok")


def kubectl_gpulane(cluster: Cluster, *args: str) -> str:
    """``kubectl gpulane ...``: kubectl finds the plugin ``kubectl-gpulane`` on the PATH."""
    env = {**cluster.env(), "KUBECONFIG": str(cluster.kubeconfig)}
    env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run([str(cluster.binary("kubectl")), "gpulane", *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_why_names_the_jobs_that_ran_ahead_and_the_term_and_survives_a_restart(
    cluster: Cluster, world: World, operator: OperatorProcess
) -> None:
    lane = world.lane()
    a, b = world.model("a"), world.model("b")
    world.job("blocker", a, member="z")
    world.wait_phase("blocker", "Running")
    world.job("victim", b, member="x")
    time.sleep(1.1)  # later submissions: only their terms can put them first
    world.job("vip-band", b, priority="interactive", member="yb")
    world.job("vip-tier", b, tier="max", member="yt")
    for name in ("victim", "vip-band", "vip-tier"):
        world.wait_phase(name, "Pending")
    positions = wait_until(
        lambda: (
            (p := {n: world.status(n).get("position") for n in ("victim", "vip-band", "vip-tier")})
            == {"vip-band": 1, "vip-tier": 2, "victim": 3}
            and p
        ),
        what="exact positions",
    )
    queue = kubectl_gpulane(cluster, "queue", "-n", world.namespace)
    assert queue.index("vip-band") < queue.index("vip-tier") < queue.index("victim")

    operator.kill()
    for name in positions:  # what the restarted operator must write again from what the API holds
        world.erase_status(name, "position")
    operator.start()
    wait_until(
        lambda: {n: world.status(n).get("position") for n in positions} == positions,
        timeout=30,
        what="the restarted operator to write the same positions",
    )

    assert world.run_through({"blocker", "vip-band", "vip-tier", "victim"})[-1] == "victim"
    story = kubectl_gpulane(cluster, "why", "victim", "-n", world.namespace)
    lines = story.splitlines()
    band_line = next(line for line in lines if "/vip-band on" in line)
    tier_line = next(line for line in lines if "/vip-tier on" in line)
    assert "because of a higher priority band" in band_line
    assert "because of a better tier" in tier_line
    assert f"Its model {b} was already loaded" in story  # vip-tier had just run on it

    operator.kill()
    operator.start()
    assert kubectl_gpulane(cluster, "why", "victim", "-n", world.namespace) == story, "the story is on the job"
    lanes = kubectl_gpulane(cluster, "lanes")
    assert lane in lanes and b in lanes
    # Four jobs ran in this namespace: its GPU time in the last hour, per member, and the decayed usage the
    # lane's status keeps (issue 37's gpulane usage).
    rows = json.loads(kubectl_gpulane(cluster, "usage", "--window", "1h", "-o", "json"))
    [mine] = [r for r in rows if r["team"] == world.namespace]
    assert {m["member"] for m in mine["members"]} == {"z", "x", "yb", "yt"}
    assert mine["gpuSeconds"] > 0 and mine["usage"] > 0 and mine["weight"] == 1
    assert world.namespace in kubectl_gpulane(cluster, "usage")


def _why(cluster: Cluster, world: World, job: str) -> str:
    return kubectl_gpulane(cluster, "why", job, "-n", world.namespace)


def _line(story: str, job: str) -> str:
    return next(line for line in story.splitlines() if f"/{job} on" in line)


def test_why_names_affinity_and_fair_share(cluster: Cluster, world: World, operator: OperatorProcess) -> None:
    world.lane()
    a, b = world.model("a"), world.model("b")
    world.job("blocker", a, member="z")
    world.wait_phase("blocker", "Running")
    world.job("other-model", b, member="x")
    world.job("m-first", a, priority="batch", member="mia")
    world.job("m-second", a, priority="batch", member="mia")
    time.sleep(1.1)
    world.job("n-later", a, priority="batch", member="nina")
    world.job("warm", a, member="w")  # submitted after other-model; only its loaded model can put it first
    for name in ("other-model", "m-first", "m-second", "n-later", "warm"):
        world.wait_phase(name, "Pending")
    order = world.run_through({"blocker", "other-model", "m-first", "m-second", "n-later", "warm"})
    assert order.index("warm") < order.index("other-model")
    assert order.index("n-later") < order.index("m-second"), order
    assert "because of swap affinity" in _line(_why(cluster, world, "other-model"), "warm")
    assert "because of fair share" in _line(_why(cluster, world, "m-second"), "n-later")


def test_why_names_aging_across_a_band(cluster: Cluster, world: World, operator: OperatorProcess) -> None:
    default = {"apiVersion": "gpulane.io/v1alpha1", "kind": "GpuPolicy", "metadata": {"name": "default"}}
    try:
        world.apply({**default, "spec": {"agingDivisorSeconds": 0.05}})  # 20 points a second
        wait_until(
            lambda: world.cluster_status("gpupolicies", "default").get("observedGeneration") == 1,
            what="the fast-aging policy in effect",
        )
        world.lane()
        a = world.model("a")
        world.job("blocker", a, member="z")
        world.wait_phase("blocker", "Running")
        world.job("old-batch", a, priority="batch", member="film")
        time.sleep(6)  # 120 points of aging: more than the band between batch and normal
        world.job("fresh-normal", a, member="x")
        world.wait_phase("fresh-normal", "Pending")
        assert world.run_through({"blocker", "old-batch", "fresh-normal"}) == ["blocker", "old-batch", "fresh-normal"]
        assert "because of aging" in _line(_why(cluster, world, "fresh-normal"), "old-batch")
    finally:
        world.cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")
