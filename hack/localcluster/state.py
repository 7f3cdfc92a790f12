"""What `up` records about a cluster (cluster.json), the lock that serialises up/down/status, and the
registry of processes (pytest sessions) that use a cluster."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .layout import Layout, Ports
from .processes import Proc, identity


@dataclass
class ClusterInfo:
    """What the e2e fixture and `status` need to know about a cluster."""

    state_dir: Path
    kubeconfig: Path
    server: str
    bindir: Path
    ports: Ports
    started: bool = False  # True if the `up` call that returned this started the cluster
    procs: list[Proc] = field(default_factory=list)
    real_node: str | None = None  # the real kubelet node's name, if this cluster runs one

    def env(self) -> dict[str, str]:
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        }


def load_record(layout: Layout) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(layout.record.read_text())
    except (OSError, ValueError):
        return None
    return data


def info_from_record(layout: Layout, rec: dict[str, Any]) -> ClusterInfo:
    return ClusterInfo(
        state_dir=layout.state,
        kubeconfig=layout.kubeconfig,
        server=rec["server"],
        bindir=Path(rec["bindir"]),
        ports=Ports(**rec["ports"]),
        procs=[Proc(**p) for p in rec["procs"]],
        real_node=rec.get("real_node"),
    )


def save_record(layout: Layout, info: ClusterInfo) -> None:
    rec = {
        "server": info.server,
        "bindir": str(info.bindir),
        "ports": asdict(info.ports),
        "procs": [asdict(p) for p in info.procs],
        "real_node": info.real_node,
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
    }
    tmp = layout.record.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=2))
    tmp.replace(layout.record)


@contextlib.contextmanager
def locked(state: Path) -> Iterator[None]:
    """Serialise up/down/status between processes (make, several pytest sessions)."""
    state.parent.mkdir(parents=True, exist_ok=True)
    with open(state.parent / f".{state.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def register_user(layout: Layout, pid: int) -> None:
    users = layout.state / "users"
    users.mkdir(parents=True, exist_ok=True)
    (users / str(pid)).write_text(identity(pid) or "")


def live_users(layout: Layout) -> list[int]:
    users = layout.state / "users"
    if not users.is_dir():
        return []
    return [int(f.name) for f in users.iterdir() if f.name.isdigit() and identity(int(f.name)) == f.read_text()]
