"""``gpulane fake-backend``: an OpenAI-compatible fake model server, for tests, benchmarks and the demo.

It behaves like a model server where it matters to gpulane: it takes a while to load (``/health`` is
503 until then), takes a while per request, streams Server-Sent Events chunk by chunk, says which
model answered, and can ignore SIGTERM like a server that is slow to stop.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import logging
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

# A 1x1 transparent PNG: enough for a client to decode an image.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=")


@dataclass
class FakeConfig:
    models: list[str] = field(default_factory=list)  # the models it serves; any model when empty
    load_seconds: float = 0.0
    request_seconds: float = 0.0
    chunks: int = 5
    chunk_delay: float = 0.05
    ignore_sigterm: bool = False
    host: str = "127.0.0.1"
    port: int = 8000


class FakeServer:
    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.started = time.monotonic()
        self.served: dict[str, int] = {}
        self.in_flight = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/stats", self.stats)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/{tail:.+}", self.call)
        return app

    @property
    def loaded(self) -> bool:
        return time.monotonic() - self.started >= self.config.load_seconds

    async def health(self, _: web.Request) -> web.Response:
        if not self.loaded:
            return web.json_response({"status": "loading"}, status=503)
        return web.json_response({"status": "ok"})

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"total": sum(self.served.values()), "models": self.served, "inFlight": self.in_flight}
        )

    async def models(self, _: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.config.models]
        return web.json_response({"object": "list", "data": data})

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
        return web.json_response(body, status=status)

    async def call(self, request: web.Request) -> web.StreamResponse:
        if not self.loaded:
            return self._error(503, "the model is still loading")
        payload: dict[str, Any]
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            payload = {"model": str(form.get("model", "")), "prompt": str(form.get("prompt", ""))}
        else:
            try:
                payload = await request.json()
            except ValueError:
                return self._error(400, "the body is not valid JSON")
        model = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(model, str) or not model:
            return self._error(400, "'model' is required")
        if self.config.models and model not in self.config.models:
            return self._error(404, f"this server does not serve {model!r}")
        self.served[model] = self.served.get(model, 0) + 1
        self.in_flight += 1
        try:
            await asyncio.sleep(self.config.request_seconds)
            headers = {"X-Fake-Backend-Model": model}
            if payload.get("stream"):
                return await self._stream(request, payload, model, headers)
            return web.json_response(self._answer(request.path, payload, model), headers=headers)
        finally:
            self.in_flight -= 1

    def _answer(self, path: str, payload: dict[str, Any], model: str) -> dict[str, Any]:
        created, ident = int(time.time()), f"fake-{uuid.uuid4().hex[:8]}"
        text = f"{model} answered: {_last_user_text(payload)}"
        if path.endswith("/embeddings"):
            inputs = payload.get("input")
            items = inputs if isinstance(inputs, list) else [inputs]
            data = [{"object": "embedding", "index": i, "embedding": _vector(str(x))} for i, x in enumerate(items)]
            return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        if path.endswith(("/images/generations", "/images/edits")):
            n = payload.get("n")
            count = n if isinstance(n, int) and 0 < n <= 10 else 1
            return {"created": created, "data": [{"b64_json": base64.b64encode(PNG).decode()}] * count}
        if path.endswith("/audio/transcriptions"):
            return {"text": text}
        if path.endswith("/completions") and "/chat/" not in path:
            choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
            return {"id": ident, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
        if path.endswith("/responses"):
            content = [{"type": "output_text", "text": text, "annotations": []}]
            output = [{"type": "message", "id": ident, "role": "assistant", "status": "completed", "content": content}]
            return {"id": ident, "object": "response", "created_at": created, "model": model, "status": "completed",
                    "output": output}  # fmt: skip
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return {"id": ident, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
                "usage": usage}  # fmt: skip

    async def _stream(
        self, request: web.Request, payload: dict[str, Any], model: str, headers: dict[str, str]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        ident, created = f"fake-{uuid.uuid4().hex[:8]}", int(time.time())
        chat = "/chat/" in request.path

        def event(delta: dict[str, Any] | str, finish: str | None = None) -> bytes:
            if chat:
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
                chunk = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                         "choices": [choice]}  # fmt: skip
            else:
                chunk = {"id": ident, "object": "text_completion", "created": created, "model": model,
                         "choices": [{"index": 0, "text": delta, "finish_reason": finish}]}  # fmt: skip
            return f"data: {json.dumps(chunk)}\n\n".encode()

        try:
            for i in range(self.config.chunks):
                if i:
                    await asyncio.sleep(self.config.chunk_delay)
                piece = f"{model} chunk {i} " if i else f"{model} answered: {_last_user_text(payload)} "
                await response.write(event({"role": "assistant", "content": piece} if chat and i == 0 else
                                           ({"content": piece} if chat else piece)))  # fmt: skip
            await response.write(event({} if chat else "", "stop"))
            if (payload.get("stream_options") or {}).get("include_usage"):
                usage = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                         "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": self.config.chunks,
                                                  "total_tokens": self.config.chunks + 1}}  # fmt: skip
                await response.write(f"data: {json.dumps(usage)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            log.debug("the client left mid-stream")
        return response


def _last_user_text(payload: dict[str, Any]) -> str:
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return str(message.get("content", ""))
    return str(payload.get("prompt", payload.get("input", "")))


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round(b / 255, 4) for b in digest[:8]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=[], help="a model it serves (repeatable; default any)")
    parser.add_argument("--load-seconds", type=float, default=0.0, help="/health is 503 until then")
    parser.add_argument("--request-seconds", type=float, default=0.0, help="time spent per request")
    parser.add_argument("--chunks", type=int, default=5, help="SSE chunks per streamed answer")
    parser.add_argument("--chunk-delay", type=float, default=0.05, help="seconds between chunks")
    parser.add_argument("--ignore-sigterm", action="store_true", help="keep running on SIGTERM")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = FakeConfig(args.model, args.load_seconds, args.request_seconds, args.chunks, args.chunk_delay,
                        args.ignore_sigterm, args.host, args.port)  # fmt: skip
    asyncio.run(_serve(config))
    return 0


async def _serve(config: FakeConfig) -> None:
    runner = web.AppRunner(FakeServer(config).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    log.info("fake backend on %s:%d serving %s", config.host, config.port, ", ".join(config.models) or "any model")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if config.ignore_sigterm:
        loop.add_signal_handler(signal.SIGTERM, lambda: log.info("ignoring SIGTERM"))
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
