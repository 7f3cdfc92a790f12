"""hack/gpulane_cluster.py itself: clear errors for a taken port and a missing binary, and `down` stopping
exactly the processes its own `up` started (a second cluster runs beside the session's one)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from .support import Cluster, localcluster

pytestmark = pytest.mark.e2e

# Port bases away from the default (16000) so these tests never touch the session's cluster.
SPARE_BASE = 27000


def test_a_taken_port_is_a_clear_error_and_nothing_starts(cluster: Cluster, tmp_path: Path) -> None:
    ports = localcluster.Ports.from_base(SPARE_BASE)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports.apiserver))
        holder.listen()
        with pytest.raises(localcluster.ClusterError) as err:
            localcluster.up(log=lambda _m: None, state_dir=tmp_path / "state", ports=ports)
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
        localcluster.up(
            log=lambda _m: None, state_dir=tmp_path / "state", ports=localcluster.Ports.from_base(SPARE_BASE)
        )
    assert f"missing binaries in {bindir}: kwok" in str(err.value)
    assert "make tools" in str(err.value)


def test_down_stops_exactly_the_processes_its_up_started(cluster: Cluster, tmp_path: Path) -> None:
    state = tmp_path / "second"
    second = localcluster.up(log=lambda _m: None, state_dir=state, ports=localcluster.Ports.from_base(SPARE_BASE))
    try:
        assert second.started
        assert [p.component for p in second.procs] == list(localcluster.COMPONENTS)
        ours = {p.pid for p in cluster.info.procs}
        assert not ours & {p.pid for p in second.procs}
        ok, text = localcluster.status(state_dir=state)
        assert ok, text
        assert (state / "logs" / "kube-apiserver.log").stat().st_size > 0
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
