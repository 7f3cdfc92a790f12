"""Process supervision: start a component detached with its log, recognise it later by PID and start time
(never by name), stop it, and check that a port is free before starting."""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import ClusterError


@dataclass
class Proc:
    component: str
    pid: int
    starttime: int  # /proc/PID/stat field 22: tells a recycled PID from ours
    argv: list[str]
    log: str


def proc_stat(pid: int, proc: Path = Path("/proc")) -> tuple[str, int] | None:
    """A process's state letter and start time, or None if there is no such process."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces; fields after it are space separated.
    rest = raw[raw.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])


def proc_alive(p: Proc) -> bool:
    st = proc_stat(p.pid)
    return st is not None and st[1] == p.starttime and st[0] not in ("Z", "X")


def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def start_process(component: str, argv: list[str], log: Path, pass_fds: tuple[int, ...] = ()) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== {datetime.datetime.now(datetime.UTC).isoformat()} starting: {' '.join(argv)}\n".encode())
        out.flush()
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
        )
    st = proc_stat(child.pid)
    if st is None:
        raise ClusterError(f"{component} exited immediately; see {log}")
    return Proc(component, child.pid, st[1], argv, str(log))


def stop_process(p: Proc, timeout: float = 15.0) -> None:
    """SIGTERM the recorded process (only if it is still the same process), then SIGKILL after ``timeout``."""
    if not proc_alive(p):
        reap(p.pid)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap(p.pid)
        if not proc_alive(p):
            return
        time.sleep(0.1)
    if proc_alive(p):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
        for _ in range(50):
            reap(p.pid)
            if not proc_alive(p):
                return
            time.sleep(0.1)


def tail(path: Path | str, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:])


def port_owner(port: int) -> str:
    ss = shutil.which("ss")
    if not ss:
        return ""
    out = subprocess.run([ss, "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def _bind_error(port: int, address: str) -> OSError | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as exc:
            return exc
    return None


def check_port_free(port: int, component: str, address: str = "127.0.0.1", settle: float = 10.0) -> None:
    """Fails naming the port's holder. A port held by no process is waited for (up to ``settle`` s): a
    killed multi-threaded process shows as a zombie while its other threads still hold its sockets."""
    deadline = time.monotonic() + settle
    while (exc := _bind_error(port, address)) is not None:
        owner = port_owner(port)
        if "users:" not in owner and time.monotonic() < deadline:
            time.sleep(0.1)
            continue
        raise ClusterError(
            f"port {port} on {address} (for {component}) is already in use ({exc.strerror})"
            + (f"; held by: {owner}" if owner else "")
            + ". Stop whatever holds it, or choose other ports with GPULANE_CLUSTER_PORT_BASE"
            + " (default 16000)."
        )


def identity(pid: int) -> str | None:
    st = proc_stat(pid)
    return None if st is None or st[0] in ("Z", "X") else f"{pid} {st[1]}"
