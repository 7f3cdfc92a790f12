"""The cluster's life cycle: `up` (start, or reuse a healthy one), `release` (a user leaves), `down`,
`running` and `status`."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from .control_plane import component_argv, ensure_gpu_node, healthy, node_ready
from .errors import ClusterError, Log, stderr_log
from .health import api_request, http_check, tls_context, wait_for
from .layout import (
    GPU_NODE,
    GPU_RESOURCE,
    STAGES_FILE,
    Layout,
    Ports,
    default_ports,
    default_state_dir,
    missing_binaries,
    tools_bindir,
)
from .pki import generate_pki, write_kubeconfig
from .processes import Proc, check_port_free, proc_alive, start_process, stop_process
from .state import ClusterInfo, info_from_record, live_users, load_record, locked, register_user, save_record


def up(
    log: Log = stderr_log, state_dir: Path | None = None, ports: Ports | None = None, user: int | None = None
) -> ClusterInfo:
    """Start the cluster, or return the running one (``started`` tells which). Raises ClusterError.

    ``user`` (a PID, e.g. a pytest session's) registers that process as a user of the cluster, so that
    ``release`` does not stop the cluster under another live user."""
    layout = Layout(state_dir or default_state_dir())
    with locked(layout.state):
        rec = load_record(layout)
        info: ClusterInfo | None = None
        if rec is not None:
            found = info_from_record(layout, rec)
            ok, health = healthy(found, layout)
            if ok and node_ready(layout, found.server)[0]:
                log(f"cluster already running (state {layout.state})")
                info = found
            else:
                bad = "; ".join(f"{c}: {d}" for c, (good, d) in health.items() if not good) or "node not ready"
                log(f"found an unhealthy cluster in {layout.state} ({bad}); stopping it and starting afresh")
                _teardown(layout, found.procs, log)
        elif layout.state.exists():
            log(f"removing stale state in {layout.state} (no cluster record)")
            shutil.rmtree(layout.state)
        if info is None:
            info = _start(layout, ports or default_ports(), log)
        if user is not None:
            register_user(layout, user)
        return info


def release(user: int, started: bool, log: Log = stderr_log, state_dir: Path | None = None) -> bool:
    """``user`` is done with the cluster. Stop it if that user started it (or inherited it from the user
    that did) and no other registered process is still alive; else leave it running. A starter that
    leaves while others still use it hands the duty to stop it on to the last of them. Returns True if
    the cluster was stopped."""
    layout = Layout(state_dir or default_state_dir())
    with locked(layout.state):
        (layout.state / "users" / str(user)).unlink(missing_ok=True)
        rec = load_record(layout)
        if rec is None:
            return False
        handover = layout.state / "stop-when-unused"
        others = live_users(layout)
        if others:
            if started:
                handover.touch()
                log(f"leaving the cluster running for its other users (pids {others})")
            return False
        if started or handover.exists():
            _teardown(layout, info_from_record(layout, rec).procs, log)
            return True
        return False


def _timed(log: Log, t0: float) -> Log:
    """Prefix each message with the seconds since ``t0``."""
    return lambda msg: log(f"[{time.monotonic() - t0:5.1f}s] {msg}")


def _start(layout: Layout, ports: Ports, log: Log) -> ClusterInfo:
    bindir = tools_bindir()
    missing = missing_binaries(bindir)
    if missing:
        raise ClusterError(
            f"missing binaries in {bindir}: {', '.join(missing)}. Build them with `make tools` "
            "(hack/tools/build.sh; the first build takes a while, see docs/development.md)."
        )
    for comp, comp_ports in ports.by_component().items():
        for port in comp_ports:
            check_port_free(port, comp)

    t0 = time.monotonic()
    log = _timed(log, t0)
    layout.state.mkdir(parents=True, exist_ok=True)
    layout.logs.mkdir(exist_ok=True)
    generate_pki(layout.pki)
    server = f"https://127.0.0.1:{ports.apiserver}"
    write_kubeconfig(layout.kubeconfig, server, layout.pki, "admin")
    for comp in ("kube-scheduler", "kube-controller-manager", "kwok"):
        write_kubeconfig(layout.component_kubeconfig(comp), server, layout.pki, comp)
    shutil.copyfile(STAGES_FILE, layout.state / "kwok-stages.yaml")

    info = ClusterInfo(layout.state, layout.kubeconfig, server, bindir, ports, started=True)
    argv = component_argv(layout, bindir, ports, "127.0.0.1", real_node=False)

    def launch(comp: str) -> Proc:
        proc = start_process(comp, argv[comp], layout.log(comp))
        info.procs.append(proc)
        save_record(layout, info)  # record each PID as soon as it exists, so `down` can always stop it
        return proc

    try:
        log(f"starting etcd on 127.0.0.1:{ports.etcd_client}")
        etcd = launch("etcd")
        wait_for("etcd /health", http_check(f"http://127.0.0.1:{ports.etcd_client}/health", etcd=True), 60, etcd)
        log("etcd is healthy")
        log(f"starting kube-apiserver on {server}")
        apiserver = launch("kube-apiserver")
        wait_for(
            "kube-apiserver /readyz",
            http_check(f"{server}/readyz", tls_context(layout)),
            180,
            apiserver,
            0.5,
        )
        log("kube-apiserver is ready")
        log("starting kube-controller-manager, kube-scheduler and kwok")
        kcm = launch("kube-controller-manager")
        sched = launch("kube-scheduler")
        ensure_gpu_node(layout, server)
        kwok = launch("kwok")
        insecure = tls_context(None)
        for proc, url in (
            (kcm, f"https://127.0.0.1:{ports.controller_manager}/healthz"),
            (sched, f"https://127.0.0.1:{ports.scheduler}/healthz"),
            (kwok, f"http://127.0.0.1:{ports.kwok}/healthz"),
        ):
            wait_for(f"{proc.component} {url}", http_check(url, insecure), 120, proc, 0.5)
        log("kube-controller-manager, kube-scheduler and kwok are healthy")
        wait_for(f"node {GPU_NODE} Ready with {GPU_RESOURCE}=1", lambda: node_ready(layout, server), 120, kwok)
        log(f"node {GPU_NODE} is Ready with {GPU_RESOURCE}: 1")

        def default_sa() -> tuple[bool, str]:
            code, _ = api_request(layout, server, "GET", "/api/v1/namespaces/default/serviceaccounts/default")
            return code == 200, f"HTTP {code}"

        wait_for("ServiceAccount default/default (created by kube-controller-manager)", default_sa, 120, kcm)
    except BaseException as exc:
        log(f"cluster start failed: {exc}\nstopping what was started; logs are kept in {layout.logs}")
        _teardown(layout, info.procs, log, keep_logs=True)
        raise
    log(f"cluster ready (state {layout.state}, logs {layout.logs})")
    return info


def _teardown(layout: Layout, procs: list[Proc], log: Log, keep_logs: bool = False) -> None:
    for proc in reversed(procs):
        if proc_alive(proc):
            log(f"stopping {proc.component} (pid {proc.pid})")
        stop_process(proc)
    if not layout.state.exists():
        return
    if keep_logs:
        for child in layout.state.iterdir():
            if child != layout.logs:
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    else:
        shutil.rmtree(layout.state)


def down(log: Log = stderr_log, state_dir: Path | None = None) -> bool:
    """Stop the processes recorded by `up` and remove the state. Returns False if there was nothing."""
    layout = Layout(state_dir or default_state_dir())
    with locked(layout.state):
        rec = load_record(layout)
        if rec is None:
            if layout.state.exists():
                log(f"no cluster record in {layout.state}; removing the directory")
                shutil.rmtree(layout.state)
                return True
            log(f"no cluster at {layout.state}; nothing to stop")
            return False
        _teardown(layout, info_from_record(layout, rec).procs, log)
        log(f"cluster stopped; removed {layout.state}")
        return True


def running(state_dir: Path | None = None) -> ClusterInfo | None:
    """The recorded cluster if it is fully healthy, else None (no locking, no side effects)."""
    layout = Layout(state_dir or default_state_dir())
    rec = load_record(layout)
    if rec is None:
        return None
    info = info_from_record(layout, rec)
    ok, _ = healthy(info, layout)
    return info if ok and node_ready(layout, info.server)[0] else None


def status(state_dir: Path | None = None) -> tuple[bool, str]:
    layout = Layout(state_dir or default_state_dir())
    rec = load_record(layout)
    if rec is None:
        return False, f"no cluster (state dir {layout.state})"
    info = info_from_record(layout, rec)
    ok, health = healthy(info, layout)
    lines = [f"state:      {layout.state}", f"kubeconfig: {layout.kubeconfig}", f"server:     {info.server}"]
    lines += [f"{'ok  ' if good else 'FAIL'} {comp:24} {detail}" for comp, (good, detail) in health.items()]
    node_ok, node_detail = node_ready(layout, info.server) if health["kube-apiserver"][0] else (False, "no apiserver")
    lines.append(f"{'ok  ' if node_ok else 'FAIL'} {'node ' + GPU_NODE:24} {node_detail}")
    lines.append(f"logs:       {layout.logs}")
    return ok and node_ok, "\n".join(lines)
