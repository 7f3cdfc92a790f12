"""The host resources a real node takes, and giving them back: the machine-wide lock (one real node per
machine), the sysctls the kubelet changes, the node bridge, the fixed host paths the kubelet, containerd and
libcni use whatever they are configured with, mounts, cgroups and netfilter tables.

Everything taken is written to ``host.json`` in the lock's directory before it is taken, so that an `up`
after a killed run (or a `down` without a state directory) can give it back.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .errors import ClusterError, Log
from .processes import Proc, proc_alive, proc_stat, stop_process

RUN_DIR = Path(os.environ.get("GPULANE_NODE_RUN_DIR", "/run/gpulane-node"))
# The node's sockets (containerd's, the kubelet's pod-resources and plugin sockets) live here rather than
# in the state directory: a unix socket path is limited to 107 bytes, and a state directory may be long.
RUNTIME_DIR = RUN_DIR / "node"
BRIDGE = "gpulane0"
BRIDGE_IP = "10.250.0.1"
POD_SUBNET = "10.250.0.0/24"
# The kubelet sets the first three at container-manager start (it has no mode that leaves them alone);
# the CNI bridge plugin (isGateway) turns on forwarding; the rest are what kube-proxy may touch.
SYSCTLS = (
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/netfilter/nf_conntrack_max",
)
# Used by the kubelet, containerd (shim sockets) and libcni whatever their configured roots are.
FIXED_PATHS = ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/var/lib/cni", "/run/containerd")
NFT_TABLES = (("ip", "kube-proxy"), ("ip6", "kube-proxy"))
# kube-router's firewall: its chains in iptables' filter table (its jumps from INPUT, FORWARD and OUTPUT lead
# there), and its ipsets. The filter table itself is removed when the node created it.
FIREWALL_CHAINS = ("KUBE-ROUTER-", "KUBE-NWPLCY-", "KUBE-POD-FW-")
FIREWALL_SETS = ("KUBE-", "kube-router")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_NAME = "kubepods"
DYING_HOLDER_SECONDS = 20.0
KUBELET_PORT = 10250


def _record_path() -> Path:
    return RUN_DIR / "host.json"


def read_sysctls() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            out[name] = (Path("/proc/sys") / name).read_text().strip()
    return out


def write_sysctls(values: dict[str, str]) -> None:
    for name, value in values.items():
        path = Path("/proc/sys") / name
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value)


def try_lock() -> tuple[int | None, str]:
    """The machine-wide real-node lock's fd if it was free, else None and who holds it."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(RUN_DIR / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        return None, holder
    return fd, ""


def unlock(fd: int) -> None:
    """Drop the lock and its directory once the host is given back (nothing of ours is left in /run)."""
    with contextlib.suppress(OSError):
        (RUN_DIR / "lock").unlink()
        RUN_DIR.rmdir()
    os.close(fd)


def claim(state: Path) -> int:
    """Take the machine-wide real-node lock and return its fd; the node's processes inherit it, so it is
    held as long as any of them lives. Raises ClusterError naming the holder if another run has it."""
    fd, holder = try_lock()
    deadline = time.monotonic() + DYING_HOLDER_SECONDS
    while fd is None and time.monotonic() < deadline and not procs_alive(load_record() or {}):
        # The recorded node is dead (killed), but a child the kubelet spawned may still hold the lock it
        # inherited for a moment (seen once in CI): wait for it rather than refuse.
        time.sleep(0.2)
        fd, holder = try_lock()
    if fd is None:
        raise ClusterError(
            f"another real node runs on this machine ({holder}); only one can (fixed host paths, the bridge "
            f"{BRIDGE}). Stop it with `GPULANE_CLUSTER_DIR=<its state dir> make cluster-down`."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"state dir {state}, started by pid {os.getpid()}".encode(), 0)
    os.set_inheritable(fd, True)
    return fd


# What another Kubernetes node on this machine runs: its kubelet (or k3s, which embeds one) and its runtime.
FOREIGN_COMMANDS = ("kubelet", "k3s", "k3s-server", "k3s-agent", "rke2", "containerd", "dockerd", "crio")


def foreign_node(
    proc: Path = Path("/proc"),
    mountinfo: Path = Path("/proc/self/mountinfo"),
    port_taken: Any = None,
) -> list[str]:
    """What of another kubelet or container runtime this machine runs: its processes, a listener on the
    kubelet's port, mounts under /var/lib/kubelet. Called once our own leftovers are given back, so whatever
    remains is someone else's, and a real node here would fight it for the fixed paths and the port."""
    found = []
    ours = {p.get("pid") for p in (load_record() or {}).get("procs", [])}
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        state = proc_stat(int(entry.name), proc)
        if state is None or state[0] in ("Z", "X"):  # a killed child not yet reaped still shows its name
            continue
        with contextlib.suppress(OSError):
            command = (entry / "comm").read_text().strip()
            if command in FOREIGN_COMMANDS:
                found.append(f"{command} runs (pid {entry.name})")
    if (port_taken or _port_taken)(KUBELET_PORT):
        found.append(f"something listens on the kubelet's port {KUBELET_PORT}")
    with contextlib.suppress(OSError):
        for line in mountinfo.read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith("/var/lib/kubelet/"):
                found.append(f"{point} is mounted (another kubelet's pods)")
                break
    return found


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def refuse_foreign_node() -> None:
    """Raise ClusterError, saying what and why, when another node runs here (k3s, a kubelet, Docker)."""
    found = foreign_node()
    if found:
        raise ClusterError(
            "this machine already runs a Kubernetes node or a container runtime: "
            + "; ".join(found)
            + ". The local cluster's real node would take the same host paths (/var/lib/kubelet, /run/containerd)"
            " and ports. Install gpulane on that cluster instead (docs/chart.md: values-single-node.yaml for one box),"
            " or run the local cluster without the real node (GPULANE_NODE=kwok)."
        )


def load_record() -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(_record_path().read_text())
    except (OSError, ValueError):
        return None
    return data


def save_record(rec: dict[str, Any]) -> None:
    tmp = _record_path().with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=2))
    tmp.replace(_record_path())


def take(state: Path, log: Log) -> None:
    """Record what the host looks like, then create the node bridge. Call with the lock held."""
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        # Not from a killed run of ours (its record would have been given back already): not ours to take.
        raise ClusterError(f"a network interface {BRIDGE} already exists on this host; remove it or rename it")
    rec: dict[str, Any] = {
        "state_dir": str(state),
        "sysctls": read_sysctls(),
        "created_paths": [p for p in FIXED_PATHS if not os.path.lexists(p)],
        "procs": [],
        "filter_table": ("ip", "filter") in _nft_tables(),
    }
    save_record(rec)
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    saved = ", ".join(f"{k}={v}" for k, v in rec["sysctls"].items())
    log(f"host: bridge {BRIDGE} {BRIDGE_IP}/24, sysctls saved ({saved})")


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")


def add_procs(procs: list[Proc]) -> None:
    rec = load_record()
    if rec is not None:
        rec["procs"] = [asdict(p) for p in procs]
        save_record(rec)


def mounts_under(prefixes: tuple[str, ...]) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
            out.append(point)
    return out


def cgroup_dirs() -> list[Path]:
    return [d for d in CGROUP_ROOT.glob(f"*/{CGROUP_NAME}") if d.is_dir()]


def _kill_cgroup_procs() -> None:
    for top in cgroup_dirs():
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)


def _remove_cgroups() -> list[str]:
    left = []
    for top in cgroup_dirs():
        # Children first: a cgroup directory can only be removed once it has no children.
        children = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in [*children, top]:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                left.append(str(d))
    return left


def shim_pids(socket: str) -> list[int]:
    """containerd shims of our containerd: their command line names our socket (they outlive containerd)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if socket.encode() in argv:
                    pids.append(int(entry.name))
    return pids


def _nft_tables() -> set[tuple[str, ...]]:
    if shutil.which("nft") is None:
        return set()
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False).stdout
    return {tuple(line.split()[1:3]) for line in out.splitlines() if line.startswith("table ")}


def nft_tables() -> list[tuple[str, str]]:
    found = _nft_tables()
    return [t for t in NFT_TABLES if t in found]


def firewall_left() -> list[str]:
    """kube-router's chains and ipsets still on the host."""
    chains = [c for c in _filter_chains() if c.startswith(FIREWALL_CHAINS)]
    return chains + _firewall_sets()


def _filter_chains() -> list[str]:
    return [line[1:].split()[0] for line in _filter_rules() if line.startswith(":")]


def _filter_rules() -> list[str]:
    if shutil.which("iptables-save") is None:
        return []
    out = subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()


def _firewall_sets() -> list[str]:
    if shutil.which("ipset") is None:
        return []
    out = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=False).stdout
    return [name for name in out.split() if name.startswith(FIREWALL_SETS)]


def _drop_firewall(created_filter_table: bool) -> None:
    """Remove kube-router's jumps, chains and ipsets (its own --cleanup-config also deletes every IPVS
    service on the host), then the filter table if the node created it and nothing else is in it."""
    ours = [c for c in _filter_chains() if c.startswith(FIREWALL_CHAINS)]
    for line in _filter_rules():
        words = shlex.split(line)
        if words[:1] == ["-A"] and words[1] not in ours and "-j" in words and words[words.index("-j") + 1] in ours:
            subprocess.run(["iptables", "-t", "filter", "-D", *words[1:]], capture_output=True, check=False)
    for flag in ("-F", "-X"):
        for chain in ours:
            subprocess.run(["iptables", "-t", "filter", flag, chain], capture_output=True, check=False)
    for name in _firewall_sets():
        subprocess.run(["ipset", "destroy", name], capture_output=True, check=False)
    if created_filter_table and not any(line.startswith("-A") for line in _filter_rules()):
        subprocess.run(["nft", "delete", "table", "ip", "filter"], capture_output=True, check=False)


def give_back(rec: dict[str, Any], socket: str, log: Log) -> list[str]:
    """Undo everything ``take`` and the node did, from its record. Returns what could not be removed."""
    node_dir = Path(rec["state_dir"]) / "node"
    for p in reversed(rec.get("procs", [])):
        stop_process(Proc(**p), timeout=10)
    _kill_cgroup_procs()
    for pid in shim_pids(socket):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    left: list[str] = []
    prefixes = (str(node_dir), str(RUNTIME_DIR), *rec.get("created_paths", []), "/run/containerd", "/var/lib/kubelet")
    for point in sorted(mounts_under(prefixes), key=len, reverse=True):
        proc = subprocess.run(["umount", "-l", point], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            left.append(f"mount {point}: {proc.stderr.strip()}")
    left += [f"cgroup {d}" for d in _remove_cgroups()]
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
    for family, table in nft_tables():
        subprocess.run(["nft", "delete", "table", family, table], capture_output=True, check=False)
    _drop_firewall(created_filter_table=not rec.get("filter_table", True))
    left += [f"firewall {name}" for name in firewall_left()]
    for path in [*rec.get("created_paths", []), str(RUNTIME_DIR)]:
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
            if os.path.lexists(path):
                left.append(f"path {path}")
    write_sysctls(rec.get("sysctls", {}))
    with contextlib.suppress(FileNotFoundError):
        _record_path().unlink()
    log("host: bridge, mounts, cgroups, nft tables, firewall and host paths removed; sysctls restored")
    return left


def procs_alive(rec: dict[str, Any]) -> bool:
    return any(proc_alive(Proc(**p)) for p in rec.get("procs", []))
