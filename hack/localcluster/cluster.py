"""The cluster's life cycle: `up` (start, or reuse a healthy one), `release` (a user leaves), `down`,
`running`, `status`, and `restart` of one component (for chaos runs)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from . import host, node
from .control_plane import component_argv, ensure_gpu_node, healthy, node_ready
from .errors import ClusterError, Log, stderr_log
from .health import api_request, http_check, tls_context, wait_for
from .images import Image, build_images
from .layout import (
    BINARIES,
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
    log: Log = stderr_log,
    state_dir: Path | None = None,
    ports: Ports | None = None,
    user: int | None = None,
    real_node: bool | None = None,
) -> ClusterInfo:
    """Start the cluster, or return the running one (``started`` tells which). Raises ClusterError.

    ``user`` (a PID, e.g. a pytest session's) registers that process as a user of the cluster, so that
    ``release`` does not stop the cluster under another live user. ``real_node`` (default: True unless
    GPULANE_NODE=kwok) makes gpu-0 the real kubelet node (node.py), else a kwok node; a running cluster
    without the real node is then an error, not restarted."""
    want_real = node.enabled() if real_node is None else real_node
    layout = Layout(state_dir or default_state_dir())
    with locked(layout.state):
        rec = load_record(layout)
        info: ClusterInfo | None = None
        if rec is not None:
            found = info_from_record(layout, rec)
            ok, health = _health(found, layout)
            if ok and want_real and not found.real_node:
                # Never restart a healthy cluster under its users (a pytest session, say) to add the node.
                raise ClusterError(
                    f"a cluster without the real node runs in {layout.state}; stop it first (`make cluster-down`),"
                    " or start a second one beside it with GPULANE_CLUSTER_DIR and GPULANE_CLUSTER_PORT_BASE"
                )
            if ok:  # a cluster with the real node also serves a caller that did not ask for it
                log(f"cluster already running (state {layout.state})")
                info = found
                if found.real_node:
                    # The sources may have changed since it started: its node gets the images built now.
                    node.sync_images(layout, found.bindir, build_images(log), log)
            else:
                bad = "; ".join(f"{c}: {d}" for c, (good, d) in health.items() if not good)
                log(f"found an unhealthy cluster in {layout.state} ({bad}); stopping it and starting afresh")
                _teardown(layout, found, log)
        elif layout.state.exists():
            log(f"removing stale state in {layout.state} (no cluster record)")
            shutil.rmtree(layout.state)
        if info is None:
            info = _start(layout, ports or default_ports(), log, want_real)
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
            _teardown(layout, info_from_record(layout, rec), log)
            return True
        return False


def users(state_dir: Path | None = None) -> list[int]:
    """The live processes registered as users of the cluster (``up(user=...)``)."""
    return live_users(Layout(state_dir or default_state_dir()))


def _timed(log: Log, t0: float) -> Log:
    """Prefix each message with the seconds since ``t0``."""
    return lambda msg: log(f"[{time.monotonic() - t0:5.1f}s] {msg}")


def _start(layout: Layout, ports: Ports, log: Log, real_node: bool) -> ClusterInfo:
    bindir = tools_bindir()
    needed = BINARIES + (node.NODE_BINARIES if real_node else ())
    missing = missing_binaries(bindir, needed)
    if missing:
        raise ClusterError(
            f"missing binaries in {bindir}: {', '.join(missing)}. Build them with `make tools` "
            "(hack/tools/build.sh; the first build takes a while, see docs/development.md)."
        )
    if real_node:
        node.check_prerequisites()
    t0 = time.monotonic()
    log = _timed(log, t0)
    lock_fd = -1
    images: list[Image] = []
    if real_node:
        # First, so that a second real node is refused as such (not by the ports the first one holds).
        lock_fd = host.claim(layout.state)
    try:
        for comp, comp_ports in ports.by_component().items():
            for port in comp_ports:
                if comp != "kube-apiserver" or not real_node:
                    check_port_free(port, comp)
        if real_node:
            _give_back_stale(log)
            host.refuse_foreign_node()  # before anything is taken: our own leftovers are gone, the rest is not ours
            images = build_images(log)  # before taking the host: a failed build leaves nothing to undo
    except BaseException:
        if lock_fd >= 0:
            os.close(lock_fd)
        raise
    layout.state.mkdir(parents=True, exist_ok=True)
    layout.logs.mkdir(exist_ok=True)
    # With a real node the apiserver serves on the node bridge's address, which kube-proxy maps the
    # `kubernetes` Service to, so in-cluster config works in pods.
    address = host.BRIDGE_IP if real_node else "127.0.0.1"
    server = f"https://{address}:{ports.apiserver}"
    info = ClusterInfo(
        layout.state,
        layout.kubeconfig,
        server,
        bindir,
        ports,
        started=True,
        real_node=GPU_NODE if real_node else None,
    )
    save_record(layout, info)

    def launch(comp: str, argv: list[str], pass_fds: tuple[int, ...] = ()) -> Proc:
        proc = start_process(comp, argv, layout.log(comp), pass_fds)
        info.procs.append(proc)
        save_record(layout, info)  # record each PID as soon as it exists, so `down` can always stop it
        if real_node:
            host.add_procs(info.procs)
        return proc

    try:
        if real_node:
            host.take(layout.state, log)
            for port, what in ((ports.apiserver, "kube-apiserver"), (node.KUBELET_PORT, "kubelet")):
                check_port_free(port, what, address)
        generate_pki(
            layout.pki,
            extra_ips=(address,) if real_node else (),
            extra_clients=node.CLIENTS if real_node else None,
        )
        write_kubeconfig(layout.kubeconfig, server, layout.pki, "admin")
        clients = ("kube-scheduler", "kube-controller-manager", "kwok") + (
            ("kubelet", "kube-proxy", "coredns", "kube-router") if real_node else ()
        )
        for comp in clients:
            write_kubeconfig(layout.component_kubeconfig(comp), server, layout.pki, comp)
        shutil.copyfile(STAGES_FILE, layout.state / "kwok-stages.yaml")
        if real_node:
            log(f"starting containerd for the real node {GPU_NODE}; its images are imported meanwhile")
            imported = node.start_runtime(layout, bindir, images, launch, log)
        argv = component_argv(layout, bindir, ports, address, real_node)

        log(f"starting etcd on 127.0.0.1:{ports.etcd_client}")
        etcd = launch("etcd", argv["etcd"])
        wait_for("etcd /health", http_check(f"http://127.0.0.1:{ports.etcd_client}/health", etcd=True), 60, etcd)
        log("etcd is healthy")
        log(f"starting kube-apiserver on {server}")
        apiserver = launch("kube-apiserver", argv["kube-apiserver"])
        wait_for(
            "kube-apiserver /readyz",
            http_check(f"{server}/readyz", tls_context(layout)),
            180,
            apiserver,
            0.5,
        )
        log("kube-apiserver is ready")
        log("starting kube-controller-manager, kube-scheduler and kwok")
        kcm = launch("kube-controller-manager", argv["kube-controller-manager"])
        sched = launch("kube-scheduler", argv["kube-scheduler"])
        if not real_node:
            ensure_gpu_node(layout, server)
        kwok = launch("kwok", argv["kwok"])
        insecure = tls_context(None)
        for proc, url in (
            (kcm, f"https://127.0.0.1:{ports.controller_manager}/healthz"),
            (sched, f"https://127.0.0.1:{ports.scheduler}/healthz"),
            (kwok, f"http://127.0.0.1:{ports.kwok}/healthz"),
        ):
            wait_for(f"{proc.component} {url}", http_check(url, insecure), 120, proc, 0.5)
        log("kube-controller-manager, kube-scheduler and kwok are healthy")
        if not real_node:
            wait_for(f"node {GPU_NODE} Ready with {GPU_RESOURCE}=1", lambda: node_ready(layout, server), 120, kwok)
            log(f"node {GPU_NODE} (kwok) is Ready with {GPU_RESOURCE}: 1")

        def default_sa() -> tuple[bool, str]:
            code, _ = api_request(layout, server, "GET", "/api/v1/namespaces/default/serviceaccounts/default")
            return code == 200, f"HTTP {code}"

        wait_for("ServiceAccount default/default (created by kube-controller-manager)", default_sa, 120, kcm)
        if real_node:
            log(f"starting the real node {GPU_NODE}: CoreDNS, kubelet, kube-proxy")
            node.start(layout, bindir, server, lock_fd, imported, launch, log)
    except BaseException as exc:
        log(f"cluster start failed: {exc}\nstopping what was started; logs are kept in {layout.logs}")
        if lock_fd >= 0:
            os.close(lock_fd)
            lock_fd = -1
        _teardown(layout, info, log, keep_logs=True)
        raise
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)  # the node's processes hold it now
    log(f"cluster ready (state {layout.state}, logs {layout.logs})")
    return info


def _give_back_stale(log: Log) -> None:
    """A real node left by a killed run (its record survives in the host's run directory): undo it."""
    stale = host.load_record()
    if stale is not None:
        log(f"host: giving back what a previous real node left (state dir {stale['state_dir']})")
        left = host.give_back(stale, str(node.socket_path()), log)
        if left:
            raise ClusterError("could not clean up after a previous real node: " + "; ".join(left))


def _give_back_own(layout: Layout, log: Log) -> None:
    """Undo what this cluster's real node did to the host, once its processes are gone (they held the
    lock; if another run holds it now, the host is that run's)."""
    fd, holder = host.try_lock()
    if fd is None:
        log(f"host: the real-node lock is held by another run ({holder}); leaving the host to it")
        return
    try:
        rec = host.load_record()
        if rec is not None and Path(rec["state_dir"]) == layout.state:
            left = host.give_back(rec, str(node.socket_path()), log)
            if left:
                log("host: could not remove: " + "; ".join(left))
    finally:
        host.unlock(fd)


def _teardown(layout: Layout, info: ClusterInfo, log: Log, keep_logs: bool = False) -> None:
    for proc in reversed(info.procs):
        if proc_alive(proc):
            log(f"stopping {proc.component} (pid {proc.pid})")
        stop_process(proc)
    if info.real_node:
        _give_back_own(layout, log)
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
        _teardown(layout, info_from_record(layout, rec), log)
        log(f"cluster stopped; removed {layout.state}")
        return True


def restart(component: str, state_dir: Path | None = None, crash: bool = True, timeout: float = 180.0) -> float:
    """Stop one component of the running cluster and start it again with the same command line, as a
    supervisor would: SIGKILL when ``crash`` (a crash or an OOM kill), else SIGTERM. Returns the seconds
    from the stop until every component is healthy again. The kubelet gets the real-node lock back."""
    layout = Layout(state_dir or default_state_dir())
    with locked(layout.state):
        rec = load_record(layout)
        if rec is None:
            raise ClusterError(f"no cluster at {layout.state}; start one with `make cluster-up`")
        info = info_from_record(layout, rec)
        index = next((i for i, p in enumerate(info.procs) if p.component == component), None)
        if index is None:
            names = ", ".join(p.component for p in info.procs)
            raise ClusterError(f"{component!r} is not a process of this cluster; it runs {names}")
        old = info.procs[index]
        started = time.monotonic()
        if crash and proc_alive(old):
            os.kill(old.pid, signal.SIGKILL)
        stop_process(old)  # waits until it is gone (SIGTERM first unless killed already)
        # A killed multi-threaded process shows as a zombie while its other threads still hold its sockets.
        address = host.BRIDGE_IP if info.real_node and component == "kube-apiserver" else "127.0.0.1"
        ports = [(port, address) for port in info.ports.by_component().get(component, [])]
        if component == "kubelet":
            ports += [(node.KUBELET_PORT, host.BRIDGE_IP), (node.KUBELET_HEALTHZ, "127.0.0.1")]
        for port, where in ports:
            check_port_free(port, component, where, settle=30.0)
        lock_fd = _reclaim(layout.state) if component == "kubelet" else -1  # it held the lock
        try:
            info.procs[index] = start_process(component, old.argv, Path(old.log), (lock_fd,) if lock_fd >= 0 else ())
        finally:
            if lock_fd >= 0:
                os.close(lock_fd)
        save_record(layout, info)
        if info.real_node:
            host.add_procs(info.procs)
    wait_for(f"the cluster healthy after restarting {component}", lambda: _all_healthy(info, layout), timeout,
             info.procs[index], 0.2)  # fmt: skip
    return time.monotonic() - started


def _reclaim(state: Path, seconds: float = 10.0) -> int:
    """The real-node lock, once the stopped kubelet's children have let go of it too."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return host.claim(state)
        except ClusterError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _all_healthy(info: ClusterInfo, layout: Layout) -> tuple[bool, str]:
    ok, health = _health(info, layout)
    return ok, "; ".join(f"{comp}: {detail}" for comp, (good, detail) in health.items() if not good)


def dead(state_dir: Path | None = None) -> list[str]:
    """The recorded cluster's components whose process has exited (no locking, no side effects)."""
    layout = Layout(state_dir or default_state_dir())
    rec = load_record(layout)
    return [] if rec is None else [p.component for p in info_from_record(layout, rec).procs if not proc_alive(p)]


def running(state_dir: Path | None = None) -> ClusterInfo | None:
    """The recorded cluster if it is fully healthy, else None (no locking, no side effects)."""
    layout = Layout(state_dir or default_state_dir())
    rec = load_record(layout)
    if rec is None:
        return None
    info = info_from_record(layout, rec)
    ok, _ = _health(info, layout)
    return info if ok else None


def status(state_dir: Path | None = None) -> tuple[bool, str]:
    layout = Layout(state_dir or default_state_dir())
    rec = load_record(layout)
    if rec is None:
        return False, f"no cluster (state dir {layout.state})"
    info = info_from_record(layout, rec)
    ok, health = _health(info, layout)
    lines = [f"state:      {layout.state}", f"kubeconfig: {layout.kubeconfig}", f"server:     {info.server}"]
    lines += [f"{'ok  ' if good else 'FAIL'} {comp:24} {detail}" for comp, (good, detail) in health.items()]
    if info.real_node and health["kube-apiserver"][0]:
        lines.append("images:     " + ", ".join(node.image_names(info.bindir)))
    lines.append(f"logs:       {layout.logs}")
    return ok, "\n".join(lines)


def _health(info: ClusterInfo, layout: Layout) -> tuple[bool, dict[str, tuple[bool, str]]]:
    """Every component, then the GPU node: (healthy, detail)."""
    _, health = healthy(info, layout)
    if info.real_node:
        health.update(node.component_health(info))
    api_ok = health["kube-apiserver"][0]
    health[f"node {GPU_NODE}"] = node_ready(layout, info.server) if api_ok else (False, "no apiserver")
    return all(ok for ok, _ in health.values()), health
