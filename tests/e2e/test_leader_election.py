"""Two operator replicas on the real apiserver (issue 17): one leads through the Lease gpulane-operator,
the other stands by writing nothing; when the leader dies the standby leads and dispatches, and a leader
that was only paused (its renewals blocked) stops writing and exits instead of acting on stale state."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .operator_support import OPERATOR_NAMESPACE, OperatorProcess, World
from .support import Cluster, wait_until

pytestmark = pytest.mark.e2e

# Short timings so the test is quick: a Lease not renewed for 4 s passes to the standby.
ELECTION = ("--leader-elect", "--leader-elect-namespace", OPERATOR_NAMESPACE, "--leader-elect-lease-seconds", "4",
            "--leader-elect-renew-deadline-seconds", "3", "--leader-elect-retry-seconds", "1")  # fmt: skip


def leads(proc: OperatorProcess) -> bool:
    return proc.metrics().get("gpulane_leader") == 1.0


def holder(cluster: Cluster) -> str:
    lease = cluster.kubectl("get", "lease", "gpulane-operator", "-n", OPERATOR_NAMESPACE, "-o", "json").stdout
    return str(json.loads(lease)["spec"]["holderIdentity"])


@pytest.fixture
def replicas(cluster: Cluster, operator: OperatorProcess, tmp_path: Path) -> Iterator[list[OperatorProcess]]:
    """The suite's operator steps aside for two electing replicas; the first one started leads."""
    operator.stop()
    cluster.kubectl("delete", "lease", "gpulane-operator", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
    first = OperatorProcess(cluster, tmp_path, *ELECTION).start()
    wait_until(lambda: leads(first), what="the first replica to lead")
    second = OperatorProcess(cluster, tmp_path, *ELECTION).start()
    try:
        yield [first, second]
    finally:
        for proc in (first, second):
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGCONT)
            proc.stop()
        cluster.kubectl("delete", "lease", "gpulane-operator", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
        operator.start()


def test_the_standby_writes_nothing_then_leads_and_dispatches_when_the_leader_dies(
    world: World, replicas: list[OperatorProcess]
) -> None:
    first, second = replicas
    assert not leads(second) and second.ready(), "a standby is ready, and does not lead"
    assert not any(k.startswith("gpulane_api_writes_total") and v for k, v in second.metrics().items())
    lane, model = world.lane(), world.model("m")
    world.job("first", model)
    world.wait_phase("first", "Running")
    world.job("second", model)  # waits for the lane's one slot

    first.kill()
    killed = time.monotonic()
    world.complete("first")
    running = world.wait_phase("second", "Running", timeout=60)
    took = time.monotonic() - killed
    assert running["lane"] == lane
    assert leads(second) and f"as {holder(world.cluster)}" in second.log_path.read_text()
    print(f"from the leader's SIGKILL to the next Running write: {took:.1f}s (Lease 4 s)")
    assert took < 4 + 10, f"the standby took {took:.1f}s to dispatch"
    transitions = second.metrics()["gpulane_leader_transitions_total"]
    assert transitions == 1.0, transitions


def test_a_paused_leader_stops_writing_and_exits_once_the_standby_leads(
    world: World, replicas: list[OperatorProcess]
) -> None:
    first, second = replicas
    model = world.model("m")
    world.lane()
    world.job("first", model)
    world.wait_phase("first", "Running")
    assert first.proc is not None
    first.proc.send_signal(signal.SIGSTOP)  # as partitioned: no renewal, no write
    wait_until(lambda: leads(second), timeout=30, what="the standby to lead")
    world.complete("first")
    world.job("second", model)
    world.wait_phase("second", "Running", timeout=30)

    first.proc.send_signal(signal.SIGCONT)  # it wakes with a Lease long expired and stale state
    first.proc.wait(timeout=30)
    log = first.log_path.read_text()
    assert "lost the Lease" in log, first.log_tail()
    # It woke with work to write (its lane's status, the job it thought was running): every write was
    # refused before it was sent.
    assert "not writing" in log, first.log_tail()
    # Whatever it tried after waking was refused before it was sent, and the world is as the new leader left it.
    assert world.status("second")["phase"] == "Running" and world.status("first")["phase"] == "Succeeded"
    assert leads(second)
