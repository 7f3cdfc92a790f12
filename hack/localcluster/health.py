"""Talking to the components: TLS contexts, plain GETs of health endpoints, JSON calls to the apiserver with
the admin certificate, and waiting for a check while watching the process that should satisfy it."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from .errors import ClusterError
from .layout import Layout
from .processes import Proc, proc_alive, reap, tail


def tls_context(layout: Layout | None) -> ssl.SSLContext:
    if layout is None:  # the components' self-signed health endpoints
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    ctx.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
    return ctx


def http_get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def api_request(
    layout: Layout,
    server: str,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, context=tls_context(layout), timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def http_check(url: str, ctx: ssl.SSLContext | None = None, etcd: bool = False) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        code, body = http_get(url, ctx)
        return code == 200 and (not etcd or "true" in body), f"{code} {body[-200:]}"

    return check


def wait_for(
    what: str,
    check: Callable[[], tuple[bool, str]],
    timeout: float,
    proc: Proc | None = None,
    interval: float = 0.25,
) -> None:
    deadline = time.monotonic() + timeout
    detail = ""
    while time.monotonic() < deadline:
        ok, detail = check()
        if ok:
            return
        if proc is not None and not proc_alive(proc):
            reap(proc.pid)
            raise ClusterError(f"{proc.component} exited while waiting for {what}; see {proc.log}:\n{tail(proc.log)}")
        time.sleep(interval)
    where = f"; see {proc.log}:\n{tail(proc.log)}" if proc else ""
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what} (last: {detail[:300]}){where}")
