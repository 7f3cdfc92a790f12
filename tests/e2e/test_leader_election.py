"""Two operator replicas on the real apiserver (issue 17): one leads through the Lease gpulane-operator,
the other stands by writing nothing; when the leader dies the standby leads and dispatches, and a leader
that was only paused (its renewals blocked) stops writing and exits instead of acting on stale state."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from gpulane.api.times import parse_time

from .operator_support import OPERATOR_NAMESPACE, OperatorProcess, World
from .support import Cluster, wait_until

pytestmark = pytest.mark.e2e("kwok")

# Short timings so the test is quick: a Lease not renewed for 4 s passes to the standby.
ELECTION = ("--leader-elect", "--leader-elect-namespace", OPERATOR_NAMESPACE, "--leader-elect-lease-seconds", "4",
            "--leader-elect-renew-deadline-seconds", "3", "--leader-elect-retry-seconds", "1")  # fmt: skip


# The chart's defaults (values.yaml, operator.leaderElection), the operator's too.
DEFAULTS = ("--leader-elect", "--leader-elect-namespace", OPERATOR_NAMESPACE)


def lease_spec(cluster: Cluster) -> dict[str, Any]:
    lease = cluster.kubectl("get", "lease", "gpulane-operator", "-n", OPERATOR_NAMESPACE, "-o", "json").stdout
    spec: dict[str, Any] = json.loads(lease)["spec"]
    return spec


def holder(cluster: Cluster) -> str:
    return str(lease_spec(cluster)["holderIdentity"])


def test_a_standby_leads_when_the_leader_dies_and_a_paused_leader_wakes_unable_to_write(
    cluster: Cluster, world: World, operator: OperatorProcess, tmp_path: Path
) -> None:
    """One run, three replicas: A leads and B stands by; A is SIGKILLed and B leads and dispatches; C
    stands by; B is paused (SIGSTOP: no renewal, as partitioned) and C leads; B wakes (SIGCONT) with stale
    state and a Lease long gone: every write it tries is refused before it is sent, and it exits.

    Three jobs wait through both takeovers, created within one second (``creationTimestamp``'s
    resolution) in the reverse of their names' order: each new leader dispatches them as they arrived,
    not by name."""
    operator.stop()  # the suite's operator steps aside for electing replicas
    cluster.kubectl("delete", "lease", "gpulane-operator", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
    replicas: list[OperatorProcess] = []

    def replica() -> OperatorProcess:
        replicas.append(proc := OperatorProcess(cluster, tmp_path, *ELECTION).start())
        return proc

    try:
        a = replica()
        wait_until(a.leads, what="the first replica to lead")
        b = replica()
        assert not b.leads() and b.ready(), "a standby is ready, and does not lead"
        assert not any(k.startswith("gpulane_api_writes_total") and v for k, v in b.metrics().items())
        lane, model = world.lane(), world.model("m")
        world.job("first", model)
        world.wait_phase("first", "Running")
        # They wait for the lane's one slot. One apply, just after a second begins: the three share a
        # creationTimestamp, so only the submission time that A writes at first sight orders them.
        arrivals = ["wait-c", "wait-b", "wait-a"]
        while time.time() % 1 > 0.2:
            time.sleep(0.01)
        world.apply(*(world.job_doc(name, model) for name in arrivals))
        created = {world.get(name)["metadata"]["creationTimestamp"] for name in arrivals}
        assert len(created) == 1, f"the jobs were created in different seconds: {created}"
        wait_until(lambda: all(world.status(n).get("submittedAt") for n in arrivals), what="submission times")

        a.kill()
        killed = time.monotonic()
        world.complete("first")
        try:
            running = world.wait_phase(arrivals[0], "Running", timeout=60)
        except AssertionError:
            raise AssertionError({n: world.status(n) for n in arrivals}) from None
        took = time.monotonic() - killed
        assert running["lane"] == lane
        assert [world.status(n)["phase"] for n in arrivals[1:]] == ["Pending", "Pending"]
        assert b.leads() and f"as {holder(cluster)}" in b.log_path.read_text()
        print(f"from the leader's SIGKILL to the next Running write: {took:.1f}s (Lease 4 s)")
        assert took < 4 + 10, f"the standby took {took:.1f}s to dispatch"
        assert b.metrics()["gpulane_leader_transitions_total"] == 1.0

        c = replica()
        assert b.proc is not None
        paused = holder(cluster)
        b.proc.send_signal(signal.SIGSTOP)
        # The fence's gap: B writes only until the start of its last renewal plus the renew deadline (3 s);
        # C writes from when it took the Lease. The Lease shows both: B's last renewTime (stamped after that
        # start, so the gap found is a lower bound) and C's acquireTime.
        renewed: list[float] = []

        def taken_over() -> dict[str, Any] | None:
            spec = lease_spec(cluster)
            if spec["holderIdentity"] == paused:
                renewed.append(parse_time(spec["renewTime"]) or 0.0)
                return None
            return spec

        taken = wait_until(taken_over, timeout=30, what="another replica to take the Lease")
        assert renewed, "the paused leader held no Lease"
        gap = (parse_time(taken["acquireTime"]) or 0.0) - (renewed[-1] + 3)
        print(f"the paused leader stopped writing at least {gap:.2f}s before the new one took the Lease")
        assert gap > 0, f"the new leader took the Lease {-gap:.2f}s before the old one's fence closed"
        wait_until(c.leads, timeout=30, what="the third replica to lead")
        world.complete(arrivals[0])
        try:
            world.wait_phase(arrivals[1], "Running", timeout=30)
        except AssertionError as err:
            jobs = {n: world.status(n) for n in arrivals}
            err.add_note(f"jobs: {jobs}\nlane: {world.cluster_status('gpulanes', lane)}\nC's log:\n{c.log_tail()}")
            raise
        b.proc.send_signal(signal.SIGCONT)  # it wakes with a Lease long expired and stale state
        b.proc.wait(timeout=30)
        log = b.log_path.read_text()
        assert "lost the Lease" in log, b.log_tail()
        # It woke with work to write (its lane's status, the job it thought was running): every write was
        # refused before it was sent, and the world is as the new leader left it.
        assert "not writing" in log, b.log_tail()
        assert [world.status(n)["phase"] for n in arrivals] == ["Succeeded", "Running", "Pending"]
        assert c.leads()
        assert world.run_through(set(arrivals[1:])) == arrivals[1:], "the order of arrival did not hold"
    finally:
        for proc in replicas:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGCONT)
            proc.stop()
        cluster.kubectl("delete", "lease", "gpulane-operator", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
        operator.start()  # the world's cleanup needs an operator (finalizers)


def test_a_leader_told_to_stop_gives_the_lease_up_and_the_standby_dispatches_without_waiting_it_out(
    cluster: Cluster, world: World, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Issue 34: a rollout's SIGTERM to the leading replica left its Lease to expire (16.3 s to the next
    dispatch, at the chart's old 15 s Lease). Now the leader gives it up once its writes have stopped, and the
    standby takes it before the Lease could have expired: its acquireTime comes before the stopped leader's last
    renewTime plus the lease duration. With the default timings (6/4/1)."""
    operator.stop()
    cluster.kubectl("delete", "lease", "gpulane-operator", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
    replicas: list[OperatorProcess] = []
    try:
        replicas.append(a := OperatorProcess(cluster, tmp_path, *DEFAULTS).start())
        wait_until(a.leads, what="the first replica to lead")
        replicas.append(b := OperatorProcess(cluster, tmp_path, *DEFAULTS).start())
        lane, model = world.lane(), world.model("m")
        world.job("first", model)
        world.wait_phase("first", "Running")
        world.job("next", model)
        wait_until(lambda: world.status("next").get("position") == 1, what="the next job queued")
        assert a.leads() and not b.leads()
        before = lease_spec(cluster)  # A renews every second: its last renewal is this one or later
        stopping, told = time.monotonic(), time.time()
        a.stop()  # SIGTERM, as a rollout or a drain sends it (it returns once A has exited)
        assert "released the Lease" in a.log_path.read_text(), a.log_tail()
        last_renewal = parse_time(before["renewTime"]) or 0.0
        world.complete("first")
        running = world.wait_phase("next", "Running", timeout=30)
        took = time.monotonic() - stopping
        assert running["lane"] == lane and b.leads()
        taken = lease_spec(cluster)
        acquired = parse_time(taken["acquireTime"]) or 0.0
        print(f"from the leader's SIGTERM: the standby took the Lease in {acquired - told:.1f}s; the next job, "
              f"dispatched once A had exited and its predecessor ended, Running after {took:.1f}s")  # fmt: skip
        assert acquired < last_renewal + 6, (before, taken)  # taken before the Lease could expire
    finally:
        for proc in replicas:
            proc.stop()
        cluster.kubectl("delete", "lease", "gpulane-operator", "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
        operator.start()
