"""hack/gpulane_cluster.py itself: clear errors for a taken port and a missing binary, and `down` stopping
exactly the processes its own `up` started (a second cluster runs beside the session's one)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .support import Cluster, localcluster

pytestmark = pytest.mark.e2e("kwok")

# Port bases away from the default (16000) so these tests never touch the session's cluster.
SPARE_BASE = 27000


def kwok_up(**kw: Any) -> localcluster.ClusterInfo:
    """A second cluster beside the session's: without a real node (the session's holds the only one)."""
    return localcluster.up(real_node=False, **kw)


def test_a_taken_port_is_a_clear_error_and_nothing_starts(cluster: Cluster, tmp_path: Path) -> None:
    ports = localcluster.Ports.from_base(SPARE_BASE)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports.apiserver))
        holder.listen()
        with pytest.raises(localcluster.ClusterError) as err:
            kwok_up(log=lambda _m: None, state_dir=tmp_path / "state", ports=ports)
    message = str(err.value)
    assert f"port {ports.apiserver} on 127.0.0.1 (for kube-apiserver) is already in use" in message
    assert "GPULANE_CLUSTER_PORT_BASE" in message
    assert not (tmp_path / "state" / "cluster.json").exists()


def test_a_missing_binary_is_a_clear_error(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in localcluster.BINARIES:
        if name != "kwok":
            (bindir / name).symlink_to(cluster.binary(name))
    monkeypatch.setenv("GPULANE_TOOLS_BIN", str(bindir))
    with pytest.raises(localcluster.ClusterError) as err:
        kwok_up(log=lambda _m: None, state_dir=tmp_path / "state", ports=localcluster.Ports.from_base(SPARE_BASE))
    assert f"missing binaries in {bindir}: kwok" in str(err.value)
    assert "make tools" in str(err.value)


def test_down_stops_exactly_the_processes_its_up_started(cluster: Cluster, tmp_path: Path) -> None:
    state = tmp_path / "second"
    second = kwok_up(log=lambda _m: None, state_dir=state, ports=localcluster.Ports.from_base(SPARE_BASE))
    try:
        assert second.started
        assert [p.component for p in second.procs] == list(localcluster.COMPONENTS)
        ours = {p.pid for p in cluster.info.procs}
        assert not ours & {p.pid for p in second.procs}
        ok, text = localcluster.status(state_dir=state)
        assert ok, text
        assert (state / "logs" / "kube-apiserver.log").stat().st_size > 0
        # A chaos run's restart: SIGKILL one component, start it with the same flags, healthy again.
        for component in ("etcd", "kube-apiserver"):
            before = next(p for p in second.procs if p.component == component)
            localcluster.restart(component, state_dir=state)
            now = localcluster.running(state)
            assert now is not None, localcluster.status(state_dir=state)[1]
            after = next(p for p in now.procs if p.component == component)
            assert after.pid != before.pid and after.argv == before.argv and not localcluster.proc_alive(before)
            second = now
        with pytest.raises(localcluster.ClusterError, match="'kubelet' is not a process of this cluster"):
            localcluster.restart("kubelet", state_dir=state)
    finally:
        assert localcluster.down(log=lambda _m: None, state_dir=state)
    assert not state.exists()
    for proc in second.procs:
        assert not localcluster.proc_alive(proc), f"{proc.component} (pid {proc.pid}) still runs"
    # The session's cluster is untouched.
    for proc in cluster.info.procs:
        assert localcluster.proc_alive(proc), f"{proc.component} of the session cluster was stopped"
    ok, text = localcluster.status(state_dir=cluster.info.state_dir)
    assert ok, text
    assert os.path.exists(cluster.kubeconfig)


def test_the_last_user_of_a_shared_cluster_stops_it(cluster: Cluster, tmp_path: Path) -> None:
    """Two pytest sessions on one cluster: the starter leaves first, so the other one stops it."""
    state = tmp_path / "shared"
    ports = localcluster.Ports.from_base(SPARE_BASE)
    other = subprocess.Popen(["sleep", "300"])  # stands in for a second pytest session (a live PID)
    try:
        first = kwok_up(log=lambda _m: None, state_dir=state, ports=ports, user=os.getpid())
        assert first.started
        reused = kwok_up(log=lambda _m: None, state_dir=state, ports=ports, user=other.pid)
        assert not reused.started
        assert [p.pid for p in reused.procs] == [p.pid for p in first.procs]

        # The starter is done, but the other session still uses the cluster: it keeps running.
        assert not localcluster.release(os.getpid(), started=True, log=lambda _m: None, state_dir=state)
        ok, text = localcluster.status(state_dir=state)
        assert ok, text

        # The last user leaves: the cluster it inherited is stopped.
        assert localcluster.release(other.pid, started=False, log=lambda _m: None, state_dir=state)
        assert not state.exists()
        assert not any(localcluster.proc_alive(p) for p in first.procs)
    finally:
        other.kill()
        other.wait()
        localcluster.down(log=lambda _m: None, state_dir=state)
    ok, text = localcluster.status(state_dir=cluster.info.state_dir)
    assert ok, text


def test_a_component_that_dies_on_start_is_reported_with_its_log(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection for the launcher itself: kube-apiserver is replaced by a script that fails the way a
    bad flag would. The error names the component and its log, shows the log's tail, and the etcd that
    had already started is stopped again."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in localcluster.BINARIES:
        if name != "kube-apiserver":
            (bindir / name).symlink_to(cluster.binary(name))
    broken = bindir / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'Error: unknown flag: --simulated-bad-flag' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("GPULANE_TOOLS_BIN", str(bindir))
    state = tmp_path / "state"
    with pytest.raises(localcluster.ClusterError) as err:
        kwok_up(log=lambda _m: None, state_dir=state, ports=localcluster.Ports.from_base(SPARE_BASE))
    message = str(err.value)
    log = state / "logs" / "kube-apiserver.log"
    assert f"kube-apiserver exited while waiting for kube-apiserver /readyz; see {log}" in message
    assert "unknown flag: --simulated-bad-flag" in message
    assert log.exists() and (state / "logs" / "etcd.log").exists(), "logs of a failed start are kept"
    assert not (state / "cluster.json").exists()
    etcd_port = localcluster.Ports.from_base(SPARE_BASE).etcd_client
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", etcd_port)) != 0, "etcd was left running"
