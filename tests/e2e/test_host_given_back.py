"""Stopping the real node gives the host back: processes, containerd shims, mounts, the bridge, netfilter
rules, cgroups, the files in fixed host paths, and the sysctls the kubelet changes.

These tests run after every other test of the session (the ``last`` marker; see conftest.py), because
they stop the session's cluster: the real node is one per machine. Once they are done, a cluster this
session did not start (someone's `make cluster-up`) is started again, afresh.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .operator_support import OperatorProcess
from .support import Cluster, localcluster, wait_until

# Away from the session's cluster (16000) and the lifecycle tests' (27000, 28000).
REAL_BASE = 29000
# How long to wait for other pytest sessions that still use the cluster.
SHARED_WAIT = 900.0

# The first test's setup may wait SHARED_WAIT for other sessions: beyond the suite's timeout (pyproject.toml).
pytestmark = [pytest.mark.e2e("gpu-0"), pytest.mark.last, pytest.mark.timeout(SHARED_WAIT + 300)]
host = localcluster.host


@dataclass
class HostSnapshot:
    """What the real node may change on the host."""

    sysctls: dict[str, str]
    links: list[str]
    mounts: list[str]
    nft: str
    iptables: str
    ipsets: str
    paths: dict[str, bool]

    @classmethod
    def take(cls) -> HostSnapshot:
        links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout)
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        return cls(
            sysctls=host.read_sysctls(),
            links=sorted(link["ifname"] for link in links),
            mounts=sorted(mounts),
            nft=subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True, check=True).stdout,
            iptables=_iptables(),
            ipsets=subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=True).stdout,
            paths={p: os.path.lexists(p) for p in (*host.FIXED_PATHS, str(host.RUN_DIR))},
        )


def _iptables() -> str:
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    return "\n".join(line for line in out.splitlines() if not line.startswith("#"))


@dataclass
class Stopped:
    """The session's cluster, as it was just before the fixture stopped it."""

    info: localcluster.ClusterInfo
    record: dict[str, Any]  # the host record: what the node took, and the sysctls from before it started
    socket: str


@pytest.fixture(scope="module")
def stopped(cluster: Cluster, shared_operator: OperatorProcess) -> Iterator[Stopped]:
    """Stop the session's cluster once this session is its only user, so that these tests may take the host."""
    shared_operator.stop()
    assert cluster.info.real_node, "the cluster runs without the real node (GPULANE_NODE=kwok)"
    wait_until(
        lambda: localcluster.users(cluster.info.state_dir) in ([], [os.getpid()]),
        timeout=SHARED_WAIT,
        what="the other pytest sessions on this cluster to finish",
    )
    record = host.load_record()
    assert record is not None and record["state_dir"] == str(cluster.info.state_dir), record
    socket = str(localcluster.node.socket_path())
    assert localcluster.down(log=lambda _m: None, state_dir=cluster.info.state_dir)
    yield Stopped(cluster.info, record, socket)
    if not cluster.started_here:
        localcluster.up(log=lambda _m: None, state_dir=cluster.info.state_dir, ports=cluster.info.ports)


def test_down_gives_the_host_back(stopped: Stopped) -> None:
    for proc in stopped.info.procs:
        assert not localcluster.proc_alive(proc), f"{proc.component} (pid {proc.pid}) still runs"
    assert host.shim_pids(stopped.socket) == [], "containerd shims left"
    assert host.mounts_under((str(stopped.info.state_dir), str(host.RUN_DIR), *host.FIXED_PATHS)) == []
    assert not Path(f"/sys/class/net/{host.BRIDGE}").exists(), "the bridge is left"
    assert host.nft_tables() == [], "kube-proxy's nft tables are left"
    assert "KUBE-" not in _iptables(), "the kubelet, kube-proxy or kube-router left iptables chains"
    assert host.firewall_left() == [], "kube-router's chains or ipsets are left"
    assert host.cgroup_dirs() == [], "kubepods cgroups left"
    for path in [*stopped.record["created_paths"], str(host.RUN_DIR)]:
        assert not os.path.lexists(path), f"{path} is left"
    assert host.read_sysctls() == stopped.record["sysctls"]
    assert not stopped.info.state_dir.exists()


def test_down_leaves_nothing_behind_even_after_a_killed_run(stopped: Stopped, tmp_path: Path) -> None:
    """Start a real node, kill every one of its processes (as a killed session would leave it), start another
    one (its `up` gives back the stale host state first), then `down` it and compare the host with the
    snapshot taken before the first start, item by item."""
    before = HostSnapshot.take()
    ports = localcluster.Ports.from_base(REAL_BASE)
    first, state = tmp_path / "first", tmp_path / "after-kill"
    try:
        killed = localcluster.up(log=lambda _m: None, state_dir=first, ports=ports, real_node=True)
        for proc in killed.procs:
            os.kill(proc.pid, signal.SIGKILL)
        wait_until(lambda: not any(localcluster.proc_alive(p) for p in killed.procs), what="the killed cluster")
        info = localcluster.up(log=lambda _m: None, state_dir=state, ports=ports, real_node=True)
        ok, text = localcluster.status(state_dir=state)
        assert ok, text
        assert localcluster.down(log=lambda _m: None, state_dir=state)
    finally:
        localcluster.down(log=lambda _m: None, state_dir=state)  # a no-op unless an assertion failed above
        localcluster.down(log=lambda _m: None, state_dir=first)  # what is left of the killed one's state dir

    after = HostSnapshot.take()
    for proc in [*killed.procs, *info.procs]:
        assert not localcluster.proc_alive(proc), f"{proc.component} (pid {proc.pid}) still runs"
    assert host.shim_pids(stopped.socket) == [], "containerd shims left"
    assert after.mounts == before.mounts
    assert host.BRIDGE not in after.links and after.links == before.links
    assert after.nft == before.nft
    assert after.iptables == before.iptables
    assert after.ipsets == before.ipsets
    assert host.cgroup_dirs() == [], "kubepods cgroups left"
    assert after.paths == before.paths
    assert after.sysctls == before.sysctls
    assert not state.exists() and not first.exists()


def test_a_foreign_interface_named_like_the_bridge_is_a_clear_error(stopped: Stopped, tmp_path: Path) -> None:
    """An interface gpulane0 that is not ours is never taken (nor deleted at teardown)."""
    subprocess.run(["ip", "link", "add", host.BRIDGE, "type", "bridge"], check=True)
    try:
        with pytest.raises(localcluster.ClusterError) as err:
            localcluster.up(
                log=lambda _m: None, state_dir=tmp_path / "state", ports=localcluster.Ports.from_base(REAL_BASE)
            )
        assert f"a network interface {host.BRIDGE} already exists on this host" in str(err.value)
        assert Path(f"/sys/class/net/{host.BRIDGE}").exists(), "the foreign interface was removed"
        assert not host.RUN_DIR.exists(), "the host record and lock were left behind"
        assert not (tmp_path / "state" / "cluster.json").exists()
    finally:
        subprocess.run(["ip", "link", "del", host.BRIDGE], check=False)
