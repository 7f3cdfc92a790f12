"""``gpulane why`` / ``queue`` / ``lanes`` on the real control plane, through the kubectl plugin too."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from .operator_support import OperatorProcess, World
from .support import REPO, Cluster, wait_until

pytestmark = pytest.mark.e2e


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
    operator.start()
    time.sleep(2)
    assert {n: world.status(n).get("position") for n in positions} == positions, "positions survive a restart"

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
