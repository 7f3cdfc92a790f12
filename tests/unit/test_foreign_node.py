"""The local cluster's real node refuses to start beside another node (issue 33): a k3s, a kubelet or a
container runtime on the machine, a listener on the kubelet's port, pods' mounts under /var/lib/kubelet."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "hack") not in sys.path:
    sys.path.insert(0, str(REPO / "hack"))

from localcluster import host  # noqa: E402  (lives in hack/, which is not a package)
from localcluster.errors import ClusterError  # noqa: E402

MOUNT = "36 25 0:32 / {point} rw,relatime shared:15 - tmpfs tmpfs rw\n"


def machine(
    tmp_path: Path, commands: dict[int, str], mounts: tuple[str, ...] = (), zombies: tuple[int, ...] = ()
) -> tuple[Path, Path]:
    proc = tmp_path / "proc"
    for pid, command in commands.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(command + "\n")
        state = "Z" if pid in zombies else "S"
        (proc / str(pid) / "stat").write_text(f"{pid} ({command}) {state} 1 {pid} {pid} 0 -1 " + "0 " * 14 + "4242 0\n")
    (proc / "self").mkdir(parents=True, exist_ok=True)  # not a pid: skipped
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("".join(MOUNT.format(point=p) for p in ("/", *mounts)))
    return proc, mountinfo


@pytest.fixture(autouse=True)
def no_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "load_record", lambda: None)


def test_a_clean_machine_has_no_foreign_node(tmp_path: Path) -> None:
    proc, mountinfo = machine(tmp_path, {1: "systemd", 40: "sshd", 41: "python3"})
    assert host.foreign_node(proc, mountinfo, port_taken=lambda port: False) == []


def test_k3s_its_port_and_its_pods_mounts_are_each_named(tmp_path: Path) -> None:
    proc, mountinfo = machine(tmp_path, {1: "systemd", 812: "k3s-server", 900: "containerd"},
                              ("/var/lib/kubelet/pods/abc/volumes/kubernetes.io~projected/token",))  # fmt: skip
    found = host.foreign_node(proc, mountinfo, port_taken=lambda port: port == 10250)
    assert found == [
        "k3s-server runs (pid 812)",
        "containerd runs (pid 900)",
        "something listens on the kubelet's port 10250",
        "/var/lib/kubelet/pods/abc/volumes/kubernetes.io~projected/token is mounted (another kubelet's pods)",
    ]


def test_a_killed_child_not_yet_reaped_is_not_a_node(tmp_path: Path) -> None:
    """A killed run's containerd, SIGKILLed by its parent (the test session), shows its name until reaped
    (seen in test_host_given_back.py)."""
    proc, mountinfo = machine(tmp_path, {24593: "containerd"}, zombies=(24593,))
    assert host.foreign_node(proc, mountinfo, port_taken=lambda port: False) == []


def test_our_own_recorded_processes_are_not_foreign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "load_record", lambda: {"procs": [{"pid": 900}]})
    proc, mountinfo = machine(tmp_path, {900: "containerd"})
    assert host.foreign_node(proc, mountinfo, port_taken=lambda port: False) == []


def test_the_refusal_says_what_runs_and_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "foreign_node", lambda: ["dockerd runs (pid 77)"])
    with pytest.raises(ClusterError) as refused:
        host.refuse_foreign_node()
    message = str(refused.value)
    assert "dockerd runs (pid 77)" in message and "GPULANE_NODE=kwok" in message
    assert "values-single-node.yaml" in message
