"""The web page's HTTP server: the page and its assets, login, each view as JSON, and each view as a stream of
server-sent events that carries a new copy whenever the cluster changed it.

A stream computes its view when the store moved (a watch event), at most every ``COALESCE_SECONDS`` (a burst of
status writes is one update), and sends it only when it differs from the last one sent. Nothing polls: a quiet
cluster sends a comment every ``HEARTBEAT_SECONDS`` to keep proxies from closing the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from importlib import resources
from typing import Any

from aiohttp import web

from gpulane.api.chains import CHAIN_LABEL
from gpulane.api.contract import Body
from gpulane.api.resources import GpuPolicySpec
from gpulane.core.durations import parse_duration
from gpulane.core.policy import Policy
from gpulane.explain import report
from gpulane.ui import views
from gpulane.ui.auth import SESSION_SECONDS, LoginFailed, Sessions
from gpulane.ui.scope import Viewer, hidden_job, visible
from gpulane.ui.store import Store

COOKIE = "gpulane_ui"
COALESCE_SECONDS = 0.1
HEARTBEAT_SECONDS = 15.0
VIEWS = ("lanes", "queue", "chains", "job", "usage")
SCOPES_KEPT = 64  # the viewers' cuts of the store kept at once
FAILED_LOGINS_PER_MINUTE = 10  # from one address: keys and tokens are not guessed, but nobody may try
FAILED_CLIENTS_KEPT = 10_000
STREAMS_PER_SESSION = 8  # each open page costs a view's computation per change
ASSETS = {"ui.js": "text/javascript", "ui.css": "text/css", "index.html": "text/html"}
# The page loads only its own assets: no inline script, no other origin, not inside another site's frame.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class NotVisible(Exception):
    """A view that asks for a job this viewer may not see, or one that does not exist (the same to them)."""


class Views:
    """Computes a view for a viewer from the store, each at most once per store version and scope."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock
        # Per scope: the store's version it was cut at, and the cut (pages of one scope share it).
        self._visible: dict[tuple[Any, ...], tuple[int, tuple[list[Body], ...]]] = {}
        self._namespaces: tuple[int, set[str]] = (-1, set())
        self._hidden: dict[int, tuple[Body, Body]] = {}  # id(job) -> (the job, its anonymous copy)

    def namespaces(self) -> set[str]:
        """The namespaces that hold jobs or chains now (a Kubernetes user's are asked about these)."""
        if self._namespaces[0] != self.store.version:
            found = {j["metadata"]["namespace"] for p in ("gpujobs", "gpuchains") for j in self.store.items(p)}
            self._namespaces = (self.store.version, found)
        return self._namespaces[1]

    def policy(self) -> Policy:
        spec = (self.store.get("gpupolicies", "", "default") or {}).get("spec") or {}
        try:
            return GpuPolicySpec.model_validate(spec).scoring()
        except ValueError:  # the operator refuses it too, and runs on the defaults
            return GpuPolicySpec().scoring()

    def _seen(self, viewer: Viewer) -> tuple[list[Body], ...]:
        scope, version = (viewer.namespaces, viewer.members), self.store.version
        cached = self._visible.get(scope)
        if cached is None or cached[0] != version:
            if cached is None and len(self._visible) >= SCOPES_KEPT:
                self._visible.clear()  # scopes of sessions long gone
            jobs, lanes, chains = (self.store.items(p) for p in ("gpujobs", "gpulanes", "gpuchains"))
            cached = self._visible[scope] = (version, visible(viewer, jobs, lanes, chains, hide=self._hide))
        return cached[1]

    def _hide(self, job: Body) -> Body:
        """A job's anonymous copy, made once per version of the job (the store replaces a changed job's dict)."""
        kept = self._hidden.get(id(job))
        if kept is None or kept[0] is not job:
            if len(self._hidden) > 2 * len(self.store.kinds["gpujobs"].objects) + 1000:
                self._hidden = {}  # copies of jobs long gone
            kept = self._hidden[id(job)] = (job, hidden_job(job))
        return kept[1]

    def compute(self, view: str, viewer: Viewer, query: dict[str, str]) -> Body:
        now = self.clock()
        jobs, lanes, chains = self._seen(viewer)
        models = {m["metadata"]["name"]: m.get("status") or {} for m in self.store.items("gpumodels")}
        data: Any
        if view == "lanes":
            data = views.lanes(jobs, lanes, models, now)
        elif view == "queue":
            wanted = views.QueueFilter(query.get("namespace") or None, query.get("model") or None,
                                       query.get("member") or None)  # fmt: skip
            data = views.queue(jobs, models, now, wanted)
        elif view == "chains":
            data = views.chains(chains, now)
        elif view == "usage":
            window = parse_duration(query.get("window") or "24h")
            data = {"window": window, "teams": views.usage_rows(jobs, lanes, self.policy(), now, window)}
        else:
            data = self._job(viewer, query.get("job") or "", lanes, now)
        return {"view": view, "viewer": viewer.name, "now": now, "data": data}

    def _job(self, viewer: Viewer, key: str, lanes: list[Body], now: float) -> Body:
        namespace, _, name = key.partition("/")
        job = self.store.get("gpujobs", namespace, name)
        if job is not None and viewer.sees(job):
            return views.job(job, lanes, self.policy(), now)
        chain = self.store.get("gpuchains", namespace, name)
        if chain is not None and viewer.sees_member(namespace, (chain.get("spec") or {}).get("member")):
            steps = [j for j in self.store.items("gpujobs")
                     if j["metadata"]["namespace"] == namespace
                     and (j["metadata"].get("labels") or {}).get(CHAIN_LABEL) == name]  # fmt: skip
            story = report.why_chain(chain, steps, lanes, self.policy(), now)
            return {"job": key, "chain": True, "phase": (chain.get("status") or {}).get("phase"), "story": story}
        raise NotVisible(f"no job or chain {key!r} that you may see")


def _query(request: web.Request) -> tuple[str, dict[str, str]]:
    view = request.match_info["view"]
    if view not in VIEWS:
        raise web.HTTPNotFound(text=json.dumps({"error": f"no view {view!r}; the views are {', '.join(VIEWS)}"}),
                               content_type="application/json")  # fmt: skip
    query = dict(request.query)
    if "window" in query:
        try:
            parse_duration(query["window"])
        except ValueError as err:
            raise web.HTTPBadRequest(text=json.dumps({"error": f"window: {err}"}),
                                     content_type="application/json") from None  # fmt: skip
    return view, query


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class Server:
    def __init__(self, store: Store, sessions: Sessions, clock: Callable[[], float] = time.time) -> None:
        self.store, self.sessions, self.views, self.clock = store, sessions, Views(store, clock), clock
        self._failed: dict[str, list[float]] = {}  # a client's failed logins in the last minute
        self._streams: Counter[str] = Counter()  # open streams per session (or client, anonymous)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._headers])
        app.router.add_get("/", self.page)
        app.router.add_get("/static/{name}", self.asset)
        app.router.add_get("/healthz", self.health)
        app.router.add_post("/api/login", self.login)
        app.router.add_post("/api/logout", self.logout)
        app.router.add_get("/api/views/{view}", self.view)
        app.router.add_get("/api/stream/{view}", self.stream)
        return app

    @web.middleware
    async def _headers(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        if not response.prepared:
            response.headers.update(HEADERS)
        return response

    async def page(self, request: web.Request) -> web.Response:
        return self._asset("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in ASSETS:
            raise web.HTTPNotFound()
        return self._asset(name)

    @staticmethod
    def _asset(name: str) -> web.Response:
        text = resources.files("gpulane.ui").joinpath("static", name).read_text()
        return web.Response(text=text, content_type=ASSETS[name], headers={"Cache-Control": "no-cache"})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok" if self.store.ready else "listing", status=200 if self.store.ready else 503)

    async def login(self, request: web.Request) -> web.Response:
        # JSON only: a form on another site cannot send it without the browser asking this server first.
        if request.content_type != "application/json":
            return _error(415, 'send JSON (Content-Type: application/json): {"secret": "<a key or a token>"}')
        client = request.remote or "-"
        failed = [t for t in self._failed.get(client, []) if t > self.clock() - 60]
        if len(failed) >= FAILED_LOGINS_PER_MINUTE:
            return web.json_response({"error": "too many failed logins: wait a minute"}, status=429,
                                     headers={"Retry-After": "60"})  # fmt: skip
        try:
            secret = str((await request.json()).get("secret") or "")
        except (ValueError, AttributeError):
            return _error(400, 'send JSON: {"secret": "<a bridge API key or a Kubernetes token>"}')
        try:
            sid, viewer = await self.sessions.login(secret)
        except LoginFailed as err:
            if len(self._failed) > FAILED_CLIENTS_KEPT:  # addresses whose last failure is a minute old go
                self._failed = {c: t for c, t in self._failed.items() if t[-1] > self.clock() - 60}
            self._failed[client] = [*failed, self.clock()]
            return _error(401, str(err))
        response = web.json_response({"viewer": viewer.name})
        response.set_cookie(COOKIE, sid, httponly=True, samesite="Strict", path="/", secure=request.secure,
                            max_age=int(SESSION_SECONDS))  # fmt: skip
        return response

    async def logout(self, request: web.Request) -> web.Response:
        self.sessions.logout(request.cookies.get(COOKIE))
        response = web.json_response({"viewer": None})
        response.del_cookie(COOKIE, path="/")
        return response

    async def _viewer(self, request: web.Request) -> Viewer | None:
        return await self.sessions.viewer(request.cookies.get(COOKIE), self.views.namespaces())

    async def view(self, request: web.Request) -> web.Response:
        view, query = _query(request)
        viewer = await self._viewer(request)
        if viewer is None:
            return _error(401, "log in first")
        if not self.store.ready:
            return _error(503, "still listing the cluster: try again in a moment")
        try:
            return web.json_response(self.views.compute(view, viewer, query))
        except NotVisible as err:
            return _error(404, str(err))

    async def stream(self, request: web.Request) -> web.StreamResponse:
        view, query = _query(request)
        if await self._viewer(request) is None:
            return _error(401, "log in first")
        cookie = request.cookies.get(COOKIE)  # kept by digest, as the sessions are
        holder = hashlib.sha256(cookie.encode()).hexdigest() if cookie else request.remote or "-"
        if self._streams[holder] >= STREAMS_PER_SESSION:
            return _error(429, f"{STREAMS_PER_SESSION} pages of this session are open already: close one")
        response = web.StreamResponse(headers={**HEADERS, "Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        await response.prepare(request)
        self._streams[holder] += 1
        try:
            with contextlib.suppress(ConnectionResetError):  # the page went away (a new view, a closed tab)
                await self._send(request, response, view, query)
        finally:
            self._streams[holder] -= 1
            if not self._streams[holder]:
                del self._streams[holder]
        return response

    async def _send(self, request: web.Request, response: web.StreamResponse, view: str, query: dict[str, str]) -> None:
        """The view to ``response`` now and whenever it changes, until the session ends or the page goes."""
        while not self.store.ready:  # an empty cluster is not shown while the first lists are under way
            await self.store.wait(self.store.version)
        sent = None
        while True:
            viewer = await self._viewer(request)
            if viewer is None:  # the session ended: the page shows the login
                await response.write(b"event: login\ndata: {}\n\n")
                return
            try:
                body = self.views.compute(view, viewer, query)
                event = "view"
            except NotVisible as err:
                body, event = {"error": str(err)}, "missing"
            same = {k: v for k, v in body.items() if k != "now"}
            if same != sent:
                await response.write(f"event: {event}\ndata: {json.dumps(body, default=str)}\n\n".encode())
                sent = same
            version = self.store.version
            try:
                await asyncio.wait_for(self.store.wait(version), HEARTBEAT_SECONDS)
            except TimeoutError:
                await response.write(b": still here\n\n")
            await asyncio.sleep(COALESCE_SECONDS)
