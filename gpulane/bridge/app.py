"""The bridge's HTTP surface: OpenAI calls in, GpuJobs through the queue, the backend's answer out.

A call is judged completely (body, model, key, backpressure) before a GpuJob exists or a header is
sent. Then it waits for its job to run: a streaming client hears SSE comments with its position
meanwhile, which keeps proxies from timing it out. Then the backend's answer is copied through chunk
by chunk, and the outcome is written to the job's status. A client that leaves deletes its job, which
frees the GPU whether the job was queued or already running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientError, ClientResponse, ClientSession, ClientTimeout, web
from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.aiohttp import make_aiohttp_handler

from gpulane.api import routes
from gpulane.api.resources import Ticket
from gpulane.bridge.calls import Call, CallError, kind_of, max_run_seconds, queue_timeout, read_call, sent_headers
from gpulane.bridge.catalog import ServedModel, outgoing
from gpulane.bridge.job_queue import JobProgress, JobQueue, Submission
from gpulane.bridge.keys import Denied, Identity, KeyRing
from gpulane.bridge.tickets import TicketError, issues_ticket, settle
from gpulane.core.chains import QUEUE_FULL
from gpulane.kube.client import why

log = logging.getLogger(__name__)

# Headers of the backend's answer that must not be copied: the bridge frames its own response.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "server", "date"}


NO_BUFFERING = {"X-Accel-Buffering": "no"}  # tells nginx-style proxies to pass chunks on at once
SSE_DONE = b"data: [DONE]\n\n"
DRAIN_POLL_SECONDS = 0.2


@dataclass
class Outcome:
    """What became of a call's job: answered in full, and whether its outcome was written."""

    answered: bool = False
    written: bool = False


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What the model server gets: the job's model, and the call's body and path as ``catalog.outgoing``
    made them."""

    model: str
    body: bytes
    target: str
    ticket: Ticket | None = None  # the model's server answers with a ticket (bridge/tickets.py)


@dataclass
class BridgeSettings:
    max_body_bytes: int = 32 * 1024 * 1024
    max_queued: int = 1000  # calls waiting, over all members
    max_queued_per_member: int = 100
    max_run_seconds: int = 3600
    endpoints: dict[str, str] = field(default_factory=dict)  # model -> backend URL, overriding the pod's
    # /upstream paths that skip the queue while their model is resident (llama-swap's upstream.ignorePaths)
    upstream_ignore: tuple[re.Pattern[str], ...] = ()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = PromCounter("gpulane_bridge_calls_total", "Calls answered, per HTTP status", ["code"], registry=r)
        self.queued = Gauge("gpulane_bridge_queued", "Calls waiting for their job to run", registry=r)
        self.wait = Histogram("gpulane_bridge_wait_seconds", "Call received to its job Running", registry=r)
        self.upstream = Histogram("gpulane_bridge_upstream_seconds", "Backend request to its last byte", registry=r)


class Bridge:
    def __init__(self, queue: JobQueue, keys: KeyRing, settings: BridgeSettings) -> None:
        self.queue = queue
        self.keys = keys
        self.settings = settings
        self.metrics = Metrics()
        self._queued: Counter[str] = Counter()
        self._session: ClientSession | None = None
        self._in_flight = 0  # calls being handled, queued or running
        self.draining = False

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes + 1024)
        for path in routes.paths("POST"):
            app.router.add_post(path, self.call)
        for path in routes.paths("GET"):
            app.router.add_get(path, self.call)
        app.router.add_route("*", routes.UPSTREAM + "{tail:.*}", self.call)
        app.router.add_post("/v1/{tail:.+}", self.call)  # anything else under /v1: an OpenAI-style 404
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/running", self.running)
        app.router.add_route("*", "/unload", self.unload)
        app.router.add_get("/health", self.health)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", make_aiohttp_handler(self.metrics.registry))
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        # No total or read timeout: a render streams for as long as it takes; no decompression, so
        # bytes pass through exactly as the backend sent them.
        self._session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=10), auto_decompress=False)

    async def _close(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    # -- plain endpoints --------------------------------------------------------------------------

    def _unknown_key(self, request: web.Request) -> web.Response | None:
        """The refusal of a read-only endpoint to a caller without a valid key, or None."""
        try:
            self.keys.identify(request.headers.get("Authorization"), request.headers)
        except Denied as err:
            return self._error(_denied(err))
        return None

    async def health(self, _: web.Request) -> web.Response:
        """llama-swap's liveness endpoint, which its clients and dashboards poll."""
        return web.Response(text="OK")

    async def running(self, request: web.Request) -> web.Response:
        """llama-swap's ``/running``: the models loaded now, one entry per GPU lane (for a valid key)."""
        if (refused := self._unknown_key(request)) is not None:
            return refused
        lanes = await self.queue.lanes()
        running = [
            {"model": lane.model, "state": "ready" if lane.ready else "starting", "lane": lane.name}
            for lane in lanes
            if lane.model
        ]
        return web.json_response({"running": running})

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _: web.Request) -> web.Response:
        if self.draining:
            return web.Response(status=503, text="draining: finishing its calls before it stops\n")
        ready = getattr(self.queue, "ready", True)
        return web.Response(text="ok\n") if ready else web.Response(status=503, text="watch not started\n")

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def drain(self, seconds: float) -> int:
        """Take no new call (readiness fails, so the Service stops sending any), then let the calls in hand,
        queued or running, finish, up to ``seconds``. Returns how many were still in hand."""
        self.draining = True
        deadline = time.monotonic() + seconds
        while self._in_flight and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        return self._in_flight

    async def unload(self, request: web.Request) -> web.Response:
        """llama-swap's /unload, for an admin key: every lane gives its GPU back once its running jobs end (the
        operator does it; the next jobs load their models again)."""
        try:
            identity = self.keys.identify(request.headers.get("Authorization"), request.headers)
        except Denied as err:
            return self._error(_denied(err))
        if not identity.admin:
            why = f"key {identity.key!r} may not unload the models: only a key with admin: true in the keys file"
            return self._error(CallError(403, why, kind="permission_error", code="admin_only"))
        try:
            await self.queue.unload(f"key {identity.key}")
        except Exception as err:  # the cluster refused or was away: the caller may try again
            log.warning("/unload by key %s failed: %r", identity.key, err)
            return self._error(CallError(503, f"the cluster did not take the request: {err}", kind="server_error",
                                         retry_after=1))  # fmt: skip
        log.info("/unload by key %s: every lane gives its GPU back once its jobs end", identity.key)
        return web.Response(text="OK\n")

    async def list_models(self, request: web.Request) -> web.Response:
        if (refused := self._unknown_key(request)) is not None:
            return refused
        catalog = await self.queue.models()
        return web.json_response({"object": "list", "data": catalog.listing(int(time.time()))})

    # -- calls ----------------------------------------------------------------------------------

    def _error(self, err: CallError) -> web.Response:
        self.metrics.calls.labels(str(err.status)).inc()
        headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
        return web.json_response(err.body(), status=err.status, headers=headers)

    async def _judge(self, request: web.Request) -> tuple[Call, ServedModel, Identity, int | None, int]:
        """Everything that can refuse the call, before anything is created or sent. The key is checked
        first, from the headers alone: an unknown caller never makes the bridge read or parse a body."""
        try:
            identity = self.keys.identify(request.headers.get("Authorization"), request.headers)
        except Denied as err:
            raise _denied(err) from None
        timeout = queue_timeout(request.headers)
        run_limit = max_run_seconds(request.headers, self.settings.max_run_seconds)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise CallError(413, f"request body is over the limit of {self.settings.max_body_bytes} bytes") from None
        call = read_call(request.path, request.headers.get("Content-Type", ""), body, self.settings.max_body_bytes,
                         request.method, request.query_string)  # fmt: skip
        model = (await self.queue.models()).resolve(call.model)
        if sum(self._queued.values()) >= self.settings.max_queued:
            raise CallError(429, "the bridge's queue is full; retry shortly", kind="rate_limit_error",
                            code="queue_full", retry_after=1)  # fmt: skip
        if self._queued[identity.member] >= self.settings.max_queued_per_member:
            raise CallError(429, f"member {identity.member!r} has {self.settings.max_queued_per_member} calls waiting",
                            kind="rate_limit_error", code="member_queue_full", retry_after=1)  # fmt: skip
        return call, model, identity, timeout, run_limit

    async def call(self, request: web.Request) -> web.StreamResponse:
        if self.draining:  # a call that reached this replica before the Service noticed: another one takes it
            why = "this bridge replica is shutting down; retry and another replica takes the call"
            return self._error(CallError(503, why, kind="server_error", code="draining", retry_after=1))
        self._in_flight += 1
        try:
            return await self._handle(request)
        finally:
            self._in_flight -= 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            call, model, identity, timeout, run_limit = await self._judge(request)
        except CallError as err:
            return self._error(err)
        if self._skips_queue(call) and (base := await self.queue.resident(model.name)) is not None:
            return await self._pass(request, call, self.settings.endpoints.get(model.name) or base)
        capped = identity.requested > identity.priority
        submission = Submission(model.name, identity.priority, identity.member, identity.tier,
                                run_limit, identity.key, timeout,
                                identity.requested if capped else None, model.shard)  # fmt: skip
        headers = {"X-Gpulane-Priority": str(identity.priority)}
        if capped:
            headers["X-Gpulane-Priority-Capped"] = f"{identity.requested} -> {identity.priority} (key {identity.key})"
        self._queued[identity.member] += 1
        self.metrics.queued.inc()
        queued = True
        received = time.monotonic()
        response: web.StreamResponse | None = None

        async def waiting(name: str, reason: str) -> None:
            """The cluster cannot take the job yet (docs/bridge.md, Through faults): a stream hears it."""
            nonlocal response
            if call.stream:
                headers["X-Gpulane-Job"] = name
                response = response or await self._start_events(request, headers)
                await response.write(f": waiting for the cluster to take the job ({reason})\n\n".encode())

        try:
            name = await self.queue.submit(submission, waiting)
        except BaseException as err:
            self._queued[identity.member] -= 1
            self.metrics.queued.dec()
            if isinstance(err, CallError):  # the cluster refused the job, or stayed unavailable (docs/bridge.md)
                return await self._fail(response, err)
            raise
        headers["X-Gpulane-Job"] = name
        outcome = Outcome()
        try:
            state: JobProgress | None = None
            async for state in self.queue.follow(name):
                if state.phase == "Running" or state.ended:
                    break
                if call.stream:
                    response = response or await self._start_events(request, headers)
                    await response.write(_queued_comment(state))
            self._queued[identity.member] -= 1
            self.metrics.queued.dec()
            queued = False
            self.metrics.wait.observe(time.monotonic() - received)
            if state is None or state.phase != "Running":
                why = f"job {name} ended {state.phase if state else 'unseen'} before it ran"
                if state and state.message:
                    why += f": {state.message}"
                return await self._fail(response, not_run(why, state.reason if state else None))
            body, target = outgoing(call, model, identity.priority)
            return await self._proxy(request, call, Outgoing(model.name, body, target, model.ticket), name, state,
                                     headers,
                                     response, outcome)  # fmt: skip
        except asyncio.CancelledError:
            # The client went away: its job leaves the queue, or its lane (freeing the GPU at once),
            # unless it left only after the whole answer.
            if outcome.answered and not outcome.written:
                await self._finish(outcome, name, True)
            elif not outcome.written:
                await asyncio.shield(self.queue.cancel(name))
            raise
        finally:
            if queued:
                self._queued[identity.member] -= 1
                self.metrics.queued.dec()

    def _skips_queue(self, call: Call) -> bool:
        path = call.target.partition("?")[0]
        return call.source == "path" and any(p.search(path) for p in self.settings.upstream_ignore)

    async def _pass(self, request: web.Request, call: Call, base: str) -> web.StreamResponse:
        """An /upstream call that skips the queue: sent to the resident model's server as it is, no job."""
        assert self._session is not None
        try:
            async with self._session.request(call.method, base.rstrip("/") + call.target, data=call.body or None,
                                             headers=sent_headers(call)) as upstream:  # fmt: skip
                response = web.StreamResponse(status=upstream.status, headers={**_kept(upstream), **NO_BUFFERING})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
        except (TimeoutError, OSError, ClientError) as err:
            return self._error(CallError(502, f"the backend failed: {why(err)}", kind="server_error"))
        self.metrics.calls.labels(str(response.status)).inc()
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    async def _start_events(self, request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
        events = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **NO_BUFFERING}
        response = web.StreamResponse(status=200, headers={**headers, **events})
        await response.prepare(request)
        return response

    async def _fail(self, response: web.StreamResponse | None, err: CallError) -> web.StreamResponse:
        if response is None:
            return self._error(err)
        self.metrics.calls.labels(str(err.status)).inc()
        with contextlib.suppress(ConnectionError):
            await response.write(b"data: " + _json(err.body()) + b"\n\n")
            await response.write_eof()
        return response

    async def _finish(self, outcome: Outcome, name: str, ok: bool, message: str | None = None) -> None:
        outcome.written = True
        await asyncio.shield(self.queue.finish(name, ok, message))

    async def _proxy(self, request: web.Request, call: Call, out: Outgoing, name: str, state: JobProgress,
                     headers: dict[str, str], response: web.StreamResponse | None,
                     outcome: Outcome) -> web.StreamResponse:  # fmt: skip
        base = self.settings.endpoints.get(out.model) or state.endpoint
        if not base:
            await self._finish(outcome, name, False, "the job has no endpoint")
            return await self._fail(
                response, CallError(502, f"job {name} runs without an endpoint", kind="server_error")
            )
        assert self._session is not None
        started = time.monotonic()
        try:
            async with self._session.request(
                call.method, base.rstrip("/") + out.target, data=out.body or None, headers=sent_headers(call)
            ) as upstream:
                failed = f"the backend answered {upstream.status}"
                if upstream.status < 400 and issues_ticket(out.ticket, call.method, out.target):
                    assert out.ticket is not None
                    return await self._settle(request, out.ticket, base, await upstream.read(), name, headers,
                                              outcome)  # fmt: skip
                if response is None:
                    response = web.StreamResponse(
                        status=upstream.status, headers={**_kept(upstream), **headers, **NO_BUFFERING}
                    )
                    await response.prepare(request)
                elif upstream.status >= 400:  # the event stream has started: an error event is all that is left
                    text = (await upstream.read()).decode(errors="replace")[:500]
                    await self._finish(outcome, name, False, f"{failed}: {text}")
                    return await self._fail(
                        response, CallError(upstream.status, f"{failed}: {text}", kind="server_error")
                    )
                tail = b""  # the stream's last bytes: `[DONE]` may arrive split over two chunks
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                    # A client may hang up as soon as it has the end of an event stream.
                    tail = (tail + chunk)[-len(SSE_DONE) :]
                    outcome.answered = tail == SSE_DONE
                outcome.answered = True
                ok = upstream.status < 400
        except (TimeoutError, OSError, ClientError) as err:  # ClientError: a disconnect, a cut-short body
            await self._finish(outcome, name, False, f"the backend failed: {why(err)}")
            return await self._fail(response, CallError(502, f"the backend failed: {why(err)}", kind="server_error"))
        self.metrics.upstream.observe(time.monotonic() - started)
        self.metrics.calls.labels(str(response.status)).inc()
        with contextlib.suppress(ConnectionError):
            await response.write_eof()  # the client has its answer before the outcome is written
        await self._finish(outcome, name, ok, None if ok else failed)
        return response

    async def _settle(self, request: web.Request, ticket: Ticket, base: str, first: bytes, name: str,
                      headers: dict[str, str], outcome: Outcome) -> web.StreamResponse:  # fmt: skip
        """A ticket's call: the job runs until the server's work is done, and the caller gets the last poll's
        answer (docs/models.md#servers-that-answer-with-a-ticket)."""
        assert self._session is not None
        try:
            settled = await settle(self._session, base, ticket, first)
        except (TicketError, TimeoutError, OSError, ClientError) as err:
            failed = str(err) if isinstance(err, TicketError) else f"the backend failed: {why(err)}"
            await self._finish(outcome, name, False, failed)
            return self._error(CallError(502, failed, kind="server_error"))
        response = web.Response(body=settled.answer, content_type=settled.content_type, headers=headers)
        await response.prepare(request)
        outcome.answered = True
        self.metrics.calls.labels("200").inc()
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        await self._finish(outcome, name, True)
        return response


def _kept(upstream: ClientResponse) -> dict[str, str]:
    """The backend's answer headers that pass on: the bridge frames its own response."""
    return {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}


def _json(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def _queued_comment(state: JobProgress) -> bytes:
    parts = ["queued"]
    if state.position is not None:
        parts.append(f"position {state.position}")
    if state.estimated_start:
        parts.append(f"estimated start {state.estimated_start}")
    return f": {', '.join(parts)}\n\n".encode()


def not_run(why: str, reason: str | None) -> CallError:
    """A call whose job ended before it ran. A full queue (the GpuPolicy's maxPendingPerNamespace or
    maxPendingPerMember) is a 429, as the bridge's own caps are; a QueueTimeout says so in its code (the caller's
    own deadline passed, and retrying later may find a shorter queue)."""
    if reason in QUEUE_FULL:
        code = "member_queue_full" if reason == "MemberQueueFull" else "namespace_queue_full"
        return CallError(429, why, kind="rate_limit_error", code=code, retry_after=1)
    code = "queue_timeout" if reason == "QueueTimeout" else "job_not_run"
    return CallError(503, why, kind="server_error", code=code, retry_after=1)


def _denied(err: Denied) -> CallError:
    """A key's refusal (unknown, or a header it may not set) as an OpenAI error."""
    return CallError(err.status, str(err), kind=kind_of(err.status))
