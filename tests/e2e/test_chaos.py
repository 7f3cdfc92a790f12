"""The chaos run (bench/chaos.py) for one round: the chart with its defaults on the real node, one fault of
every kind that applies (the leader killed with a standby running, the bridge and backend pods killed,
kube-apiserver and etcd restarted, the kubelet and containerd restarted on gpu-0; the webhook's faults when
the chart runs one), its independent checker's verdict, and what the callers met under each fault. The
ten-minute run stays in the benchmarks (`make bench-chaos`, docs/reliability.md).

It installs the chart, whose operator acts on every lane, so the session's operator steps aside. It runs
after the other tests (``last``; before the ones that stop the cluster in test_host_given_back.py): it
restarts kube-apiserver, etcd, the kubelet and containerd under the session's cluster, and no other test
should depend on how well the cluster's other clients (kwok, the scheduler) weather that.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .support import REPO, Cluster, localcluster

pytestmark = [pytest.mark.e2e("gpu-0"), pytest.mark.last]

# Fixed, so that a failure here is the same run again: `bench/chaos.py --seed 17 --rounds 1 --pause 1,2`.
SEED = 17


# The run bounds itself (its drain, the replicas' metrics agreeing, the subprocess's 900 s): pytest's 300 s
# would cut a slow run before it reports what was slow, as it did once in a make test at 300 s.
@pytest.mark.timeout(900)
def test_a_round_of_chaos_breaks_no_promise(cluster: Cluster, no_operator: None) -> None:
    if not cluster.info.real_node:
        raise AssertionError("this test needs the real node gpu-0; the cluster runs with GPULANE_NODE=kwok")
    # One round, not a clock: two minutes did not always fit every kind on a slow, stolen-from machine.
    # --outage-seconds 15 keeps the round near two minutes; the bench's own run takes 30. A pause of 1 to 2 s
    # after each recovery, not 3 to 6: every fault's window still sees calls (the run makes some 4 a second).
    argv = [sys.executable, str(REPO / "bench" / "chaos.py"), "--rounds", "1", "--seed", str(SEED),
            "--outage-seconds", "15", "--pause", "1,2"]  # fmt: skip
    env = cluster.env() | {"GPULANE_CLUSTER_DIR": str(cluster.info.state_dir)}  # the session's cluster
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    finally:  # it restarted components: the session's record of their processes must follow
        now = localcluster.running(cluster.info.state_dir)
        assert now is not None, localcluster.status(cluster.info.state_dir)[1]
        cluster.info.procs[:] = now.procs
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    assert report, f"no report (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    assert report["promises_kept"], json.dumps(report, indent=1)
    assert proc.returncode == 0
    # The chart's defaults on this Kubernetes (1.37): admission by the apiserver's policies, two bridges. The
    # webhook's faults have nothing to act on.
    assert (report["admission"], report["bridge_replicas"]) == ("policy", 2), report
    assert report["not_applicable"] == ["webhook-pod", "webhook-outage"], report["not_applicable"]
    assert set(report["faults"]) == {"leader", "bridge-pod", "backend-pod", "apiserver", "etcd", "kubelet",
                                     "containerd"}, report["faults"]  # fmt: skip
    assert report["jobs"] >= 40 and report["arrivals"].get("bridge ok", 0) >= 5, report["arrivals"]
    # Issue 39, from the run's own records of what each client met under each fault: gpulane's own pods
    # dying refuses no call and no kubectl create.
    by_fault = report["by_fault"]
    print(json.dumps(by_fault, indent=1))  # the CI round shows them
    for kind in ("leader", "bridge-pod", "backend-pod"):
        row = by_fault[kind]
        assert row.get("bridge refused", 0) == 0 and row.get("kubectl refused", 0) == 0, (kind, row, report["refusals"])
    # An apiserver or etcd restart is not asserted on here: the bridge waits up to its bound (30 s) for the
    # cluster to take a call's job, then refuses it to be retried, and how long the cluster refuses a
    # ServiceAccount varies beyond it (docs/reliability.md, "Calls through faults": after an etcd restart RBAC
    # answered Forbidden to the bridge and the operator for 50 s once, while kubectl, an admin, waited 18 s).
