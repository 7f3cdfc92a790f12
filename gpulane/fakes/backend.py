"""An OpenAI-compatible fake model server, for tests, benchmarks and the demo.

It stands in for a GPU model server behind gpulane's bridge and behaves like one where it matters: it takes a
while to load (``/health`` and every ``/v1`` call answer 503 until then), takes a while per request, streams
Server-Sent Events one flushed chunk at a time, says which model answered (``X-Fake-Backend-Model`` and the
body), and can ignore SIGTERM like a server that is slow to stop. It answers ComfyUI's prompt protocol too
(``fakes/comfy.py``). ``GET /stats`` counts the calls it served,
so tests can tell whether the bridge called it at all.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import logging
import math
import signal
import struct
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from gpulane.fakes.comfy import ComfyPrompts

log = logging.getLogger(__name__)

MODEL_HEADER = "X-Fake-Backend-Model"
EMBEDDING_SIZE = 8
# Uploads (audio, images) are read whole; real clients send a few MB.
MAX_BODY_BYTES = 64 * 1024 * 1024
# In-flight answers get this long to finish when the server stops: a stop must not wait aiohttp's minute.
SHUTDOWN_SECONDS = 1.0
# A 1x1 transparent PNG: enough for a client to decode an image.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=")
# One silent MPEG-1 Layer III frame (32 kbit/s, 48 kHz, mono: 144 * 32000 / 48000 = 96 bytes, zero side info).
MP3 = bytes([0xFF, 0xFB, 0x14, 0xC0]) + bytes(92)
FAKE_CHUNK = 1 << 20


def fake_bytes(size: int) -> Iterator[bytes]:
    """``size`` bytes in 1 MiB chunks, each different (so a chunk lost or repeated changes the checksum)."""
    for index, start in enumerate(range(0, size, FAKE_CHUNK)):
        block = index.to_bytes(8, "big") * (FAKE_CHUNK // 8)
        yield block[: min(FAKE_CHUNK, size - start)]


@dataclass
class FakeBackendConfig:
    models: list[str] = field(default_factory=lambda: ["fake"])  # the models it answers for; any model if empty
    load_seconds: float = 0.0  # /health answers 503 until this long after start
    request_seconds: float = 0.0  # spent before answering, or before the first chunk of a stream
    chunks: int = 5  # SSE chunks per streamed answer
    chunk_delay: float = 0.05  # seconds between chunks
    render_seconds: float = 1.0  # a ComfyUI prompt's render (fakes/comfy.py)
    ignore_sigterm: bool = False  # the CLI keeps running on SIGTERM, like a server slow to stop
    host: str = "127.0.0.1"
    port: int = 8000

    def __post_init__(self) -> None:
        if self.chunks < 1:
            raise ValueError(f"chunks must be at least 1, not {self.chunks}")
        if min(self.load_seconds, self.request_seconds, self.chunk_delay, self.render_seconds) < 0:
            raise ValueError("load_seconds, request_seconds, chunk_delay and render_seconds cannot be negative")


class _ApiError(Exception):
    """A call refused with an OpenAI-format error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def response(self) -> web.Response:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return web.json_response({"error": error}, status=self.status, headers=self.headers)


class _FakeBackend:
    def __init__(self, config: FakeBackendConfig) -> None:
        self.config = config
        self.started = time.monotonic()
        self.served: Counter[str] = Counter()
        self.in_flight = 0
        self.disconnected = 0  # calls whose client left before the answer was complete
        self.comfy = ComfyPrompts(config.render_seconds, PNG)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._middleware])
        app.on_startup.append(self._on_startup)
        app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/stats", self.stats),
                web.get("/v1/models", self.list_models),
                web.post("/v1/chat/completions", self.chat_completions),
                web.post("/v1/completions", self.completions),
                web.post("/v1/embeddings", self.embeddings),
                web.post("/v1/images/generations", self.image_generations),
                web.post("/v1/images/edits", self.image_edits),
                web.post("/v1/audio/speech", self.speech),
                web.post("/v1/audio/transcriptions", self.transcriptions),
                web.post("/v1/responses", self.responses),
                # What other servers behind llama-swap answer: a stable-diffusion server, llama-server's own.
                web.post("/sdapi/v1/txt2img", self.txt2img),
                web.get("/props", self.props),
                *self.comfy.routes(),  # ComfyUI's: a render answered with a ticket
            ]
        )
        return app

    async def _on_startup(self, _: web.Application) -> None:
        # Loading starts when the server does, not when the app object was built.
        self.started = time.monotonic()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except _ApiError as err:
            response = err.response()
        except web.HTTPException as err:
            if err.status < 400:
                raise
            # Unknown paths and methods answer in OpenAI's format too, as clients parse every error body.
            response = _ApiError(err.status, err.reason).response()
        if not response.prepared:
            # Responses about no single model name what this server serves.
            response.headers.setdefault(MODEL_HEADER, ", ".join(self.config.models) or "*")
        return response

    def _remaining_load(self) -> float:
        return self.config.load_seconds - (time.monotonic() - self.started)

    def _check_loaded(self) -> None:
        remaining = self._remaining_load()
        if remaining > 0:
            raise _ApiError(
                503,
                "the model is still loading",
                type_="unavailable_error",
                code="model_loading",
                headers={"Retry-After": str(math.ceil(remaining))},
            )

    def _model(self, value: object) -> str:
        if not isinstance(value, str) or not value:
            raise _ApiError(400, "you must provide a model parameter", param="model")
        if self.config.models and value not in self.config.models:
            raise _ApiError(
                404, f"the model {value!r} does not exist on this server", param="model", code="model_not_found"
            )
        return value

    async def _json_call(self, request: web.Request) -> tuple[dict[str, Any], str]:
        self._check_loaded()
        try:
            payload = await request.json()
        except ValueError:
            raise _ApiError(400, "the body is not valid JSON") from None
        if not isinstance(payload, dict):
            raise _ApiError(400, "the body must be a JSON object")
        return payload, self._model(payload.get("model"))

    async def _form_call(self, request: web.Request) -> tuple[dict[str, str], str, bytes]:
        """The text fields, model and uploaded file of a multipart call (the first file part, whatever its name)."""
        self._check_loaded()
        if request.content_type != "multipart/form-data":
            raise _ApiError(400, "this endpoint takes multipart/form-data")
        try:
            form = await request.post()
        except ValueError as err:
            raise _ApiError(400, f"the multipart body cannot be read: {err}") from None
        model = self._model(form.get("model"))
        upload = next((v for v in form.values() if isinstance(v, web.FileField)), None)
        if upload is None:
            raise _ApiError(400, "a file part is required", param="file")
        return {k: v for k, v in form.items() if isinstance(v, str)}, model, upload.file.read()

    @asynccontextmanager
    async def _serving(self, model: str) -> AsyncIterator[None]:
        """Count one accepted call for ``model`` and spend ``request_seconds`` on it."""
        self.served[model] += 1
        self.in_flight += 1
        try:
            await asyncio.sleep(self.config.request_seconds)
            yield
        except asyncio.CancelledError:
            # The server cancels a handler whose client disconnected (or when it stops).
            self.disconnected += 1
            log.debug("a %s call was cancelled: its client left", model)
            raise
        finally:
            self.in_flight -= 1

    async def _stream(
        self, request: web.Request, model: str, chunks: list[dict[str, Any]], usage: dict[str, Any] | None
    ) -> web.StreamResponse:
        """Send ``chunks`` as SSE events ``chunk_delay`` apart, each flushed on its own, then usage and [DONE]."""
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # proxies (nginx) must not hold events back either
                MODEL_HEADER: model,
            }
        )
        await response.prepare(request)
        try:
            for i, chunk in enumerate(chunks):
                if i:
                    await asyncio.sleep(self.config.chunk_delay)
                await response.write(_event(chunk))
            if usage is not None:
                await response.write(_event(usage))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            self.disconnected += 1
            log.debug("a %s stream lost its client", model)
        return response

    async def health(self, _: web.Request) -> web.Response:
        if self._remaining_load() > 0:
            return web.json_response({"status": "loading"}, status=503)
        return web.json_response({"status": "ok"})

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "total": sum(self.served.values()),
                "per_model": dict(self.served),
                "in_flight": self.in_flight,
                "disconnected": self.disconnected,
            }
        )

    async def list_models(self, _: web.Request) -> web.Response:
        self._check_loaded()
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "gpulane-fake"} for m in self.config.models]
        return web.json_response({"object": "list", "data": data})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        payload, model = await self._json_call(request)
        prompt = _last_user_text(payload.get("messages"))
        text = _answer(model, prompt)
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": ident, "created": created, "model": model}
        async with self._serving(model):
            if payload.get("stream") is True:
                chunks = [
                    {
                        **head,
                        "object": "chat.completion.chunk",
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"role": "assistant", "content": piece} if i == 0 else {"content": piece},
                                "logprobs": None,
                                "finish_reason": finish,
                            }
                        ],
                    }
                    for i, (piece, finish) in enumerate(_pieces(text, self.config.chunks))
                ]
                usage = {**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(prompt, text)}
                return await self._stream(request, model, chunks, usage if _include_usage(payload) else None)
            message = {"role": "assistant", "content": text, "refusal": None}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
            body = {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(prompt, text)}
            return _reply(model, body)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        payload, model = await self._json_call(request)
        prompt = _text(payload.get("prompt"))
        text = _answer(model, prompt)
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        async with self._serving(model):
            if payload.get("stream") is True:
                chunks = [
                    {**head, "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}]}
                    for piece, finish in _pieces(text, self.config.chunks)
                ]
                usage = {**head, "choices": [], "usage": _usage(prompt, text)}
                return await self._stream(request, model, chunks, usage if _include_usage(payload) else None)
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
            return _reply(model, {**head, "choices": [choice], "usage": _usage(prompt, text)})

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        payload, model = await self._json_call(request)
        inputs = _embedding_inputs(payload.get("input"))
        if inputs is None:
            raise _ApiError(400, "input must be a string, a list of strings or token arrays", param="input")
        as_base64 = payload.get("encoding_format") == "base64"  # what older openai clients ask for by default
        data = []
        for i, text in enumerate(inputs):
            vector = _vector(text)
            encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if as_base64 else vector
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(len(t.split()) for t in inputs)
        async with self._serving(model):
            usage = {"prompt_tokens": tokens, "total_tokens": tokens}
            return _reply(model, {"object": "list", "data": data, "model": model, "usage": usage})

    async def image_generations(self, request: web.Request) -> web.StreamResponse:
        payload, model = await self._json_call(request)
        count = _count(payload.get("n", 1))
        async with self._serving(model):
            return _reply(model, _images(model, count))

    async def txt2img(self, request: web.Request) -> web.StreamResponse:
        """A stable-diffusion server's sdapi call: base64 images, and the parameters it drew them with."""
        payload, model = await self._json_call(request)
        count = _count(payload.get("batch_size", 1))
        async with self._serving(model):
            images = [base64.b64encode(PNG).decode()] * count
            return _reply(model, {"images": images, "parameters": payload, "info": f"drawn by {model}"})

    async def props(self, _: web.Request) -> web.Response:
        """llama-server's /props: what it serves (reached through the bridge's /upstream route)."""
        self._check_loaded()
        return web.json_response({"model_path": (self.config.models or ["any"])[0], "total_slots": 1})

    async def image_edits(self, request: web.Request) -> web.StreamResponse:
        fields, model, _ = await self._form_call(request)
        count = _count(fields.get("n", "1"))
        async with self._serving(model):
            return _reply(model, _images(model, count))

    async def speech(self, request: web.Request) -> web.StreamResponse:
        payload, model = await self._json_call(request)
        size = payload.get("fake_bytes")  # a fake's own field: an answer of that many bytes (a long video, say)
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= 2**32):
            raise _ApiError(400, "fake_bytes must be a whole number of bytes up to 4 GiB", param="fake_bytes")
        async with self._serving(model):
            if size is None:
                return web.Response(body=MP3, content_type="audio/mpeg", headers={MODEL_HEADER: model})
            response = web.StreamResponse(headers={"Content-Type": "audio/mpeg", MODEL_HEADER: model})
            response.content_length = size
            await response.prepare(request)
            for chunk in fake_bytes(size):
                await response.write(chunk)
            await response.write_eof()
            return response

    async def transcriptions(self, request: web.Request) -> web.StreamResponse:
        _, model, audio = await self._form_call(request)
        async with self._serving(model):
            return _reply(model, {"text": f"{model} transcribed {len(audio)} bytes"})

    async def responses(self, request: web.Request) -> web.StreamResponse:
        payload, model = await self._json_call(request)
        if payload.get("stream") is True:
            # Streamed Responses use named events this fake does not speak; saying so beats a silent hang.
            raise _ApiError(400, "this fake backend does not stream /v1/responses", param="stream")
        prompt = _last_user_text(payload.get("input"))
        text = _answer(model, prompt)
        content = [{"type": "output_text", "text": text, "annotations": []}]
        message = {
            "type": "message",
            "id": f"msg_{uuid.uuid4().hex}",
            "status": "completed",
            "role": "assistant",
            "content": content,
        }
        counts = _usage(prompt, text)
        usage = {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"],
        }
        body = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": model,
            "output": [message],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
            "error": None,
            "incomplete_details": None,
        }
        async with self._serving(model):
            return _reply(model, body)


def _reply(model: str, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, headers={MODEL_HEADER: model})


def _event(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def _answer(model: str, prompt: str) -> str:
    return f"{model} answered: {prompt}"


def _usage(prompt: str, answer: str) -> dict[str, int]:
    # Words stand in for tokens: stable, and enough for clients that add them up.
    prompt_tokens, completion_tokens = len(prompt.split()), len(answer.split())
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _include_usage(payload: dict[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _pieces(text: str, parts: int) -> list[tuple[str, str | None]]:
    """``text`` in ``parts`` nearly equal pieces, each with its finish reason ("stop" on the last one only).

    A stream thus joins to the non-streamed answer; pieces of a short text may be empty.
    """
    size, extra = divmod(len(text), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [(text[bounds[i] : bounds[i + 1]], "stop" if i == parts - 1 else None) for i in range(parts)]


def _text(content: object) -> str:
    """The text of a prompt or message content: a string, or a list of strings and ``{"text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p.get("text") if isinstance(p, dict) else p for p in content)
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _last_user_text(items: object) -> str:
    """The last user message's text in chat messages or Responses input (where a bare string is the message)."""
    if isinstance(items, list):
        for item in reversed(items):
            if isinstance(item, dict) and item.get("role") == "user":
                return _text(item.get("content"))
        return ""
    return _text(items)


def _embedding_inputs(value: object) -> list[str] | None:
    """One text per vector: a string, a list of strings, one token array, or a list of token arrays."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(v, int) for v in value):
        return [json.dumps(value)]
    if all(isinstance(v, str | list) for v in value):
        return [v if isinstance(v, str) else json.dumps(v) for v in value]
    return None


def _vector(text: str) -> list[float]:
    # Deterministic per input, in [-1, 1): equal texts embed equally, different texts differently.
    digest = hashlib.sha256(text.encode()).digest()
    return [(b - 128) / 128 for b in digest[:EMBEDDING_SIZE]]


def _count(value: object) -> int:
    """The ``n`` of an image call, from JSON (an int) or a form field (a string)."""
    try:
        count = int(value) if isinstance(value, int | str) and not isinstance(value, bool) else 0
    except ValueError:
        count = 0
    if not 1 <= count <= 10:
        raise _ApiError(400, "n must be an integer from 1 to 10", param="n")
    return count


def _images(model: str, count: int) -> dict[str, Any]:
    image = {"b64_json": base64.b64encode(PNG).decode(), "revised_prompt": f"drawn by {model}"}
    return {"created": int(time.time()), "data": [image] * count}


def make_app(config: FakeBackendConfig) -> web.Application:
    return _FakeBackend(config).app()


async def serve(config: FakeBackendConfig) -> web.AppRunner:
    """Start the server on ``config.host``/``config.port`` (0 picks a free port: see ``bound_port``)."""
    # Handlers are cancelled when their client disconnects, like a model server aborting a generation,
    # so /stats shows whether the caller (the bridge) really let go.
    runner = web.AppRunner(
        make_app(config), handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS
    )
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    port: int = runner.addresses[0][1]
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=[], help="a model it serves (repeatable; default: fake)")
    parser.add_argument("--any-model", action="store_true", help="answer for any model name")
    parser.add_argument("--load-seconds", type=float, default=0.0, help="/health answers 503 this long after start")
    parser.add_argument("--request-seconds", type=float, default=0.0, help="time spent per request")
    parser.add_argument("--chunks", type=int, default=5, help="SSE chunks per streamed answer")
    parser.add_argument("--chunk-delay", type=float, default=0.05, help="seconds between chunks")
    parser.add_argument("--render-seconds", type=float, default=1.0, help="a ComfyUI prompt's render time")
    parser.add_argument("--ignore-sigterm", action="store_true", help="keep running on SIGTERM (stop with SIGINT)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (logged)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = FakeBackendConfig(
            models=[] if args.any_model else args.model or ["fake"],
            load_seconds=args.load_seconds,
            request_seconds=args.request_seconds,
            chunks=args.chunks,
            chunk_delay=args.chunk_delay,
            render_seconds=args.render_seconds,
            ignore_sigterm=args.ignore_sigterm,
            host=args.host,
            port=args.port,
        )
    except ValueError as err:
        log.error("%s", err)
        return 2
    asyncio.run(_run(config))
    return 0


async def _run(config: FakeBackendConfig) -> None:
    # Signal handlers first: whoever reads the ready line may signal at once.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if config.ignore_sigterm:
        loop.add_signal_handler(signal.SIGTERM, lambda: log.info("ignoring SIGTERM (stop with SIGINT)"))
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    runner = await serve(config)
    try:
        log.info(
            "fake backend listening on http://%s:%d for %s; healthy after %.1fs",
            config.host,
            bound_port(runner),
            ", ".join(config.models) or "any model",
            config.load_seconds,
        )
        await stop.wait()
    finally:
        await runner.cleanup()
