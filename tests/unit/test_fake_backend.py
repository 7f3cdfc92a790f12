"""The fake model server, driven by aiohttp's test client and by the real ``openai`` client."""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import logging
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image

from gpulane.fakes.backend import (
    MODEL_HEADER,
    PNG,
    FakeBackendConfig,
    add_arguments,
    bound_port,
    make_app,
    serve,
)

FAST = FakeBackendConfig(models=["fake", "other"], chunks=4, chunk_delay=0.05, port=0)


@contextmanager
def running(config: FakeBackendConfig = FAST) -> Iterator[str]:
    """``serve(config)`` on its own loop in a thread, for the synchronous openai client; yields its URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = asyncio.run_coroutine_threadsafe(serve(config), loop).result(5)
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def client(url: str) -> openai.OpenAI:
    # No retries: a 503 or 404 must reach the test, not be retried away.
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=5)


def stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as resp:
        return dict(json.loads(resp.read()))


def with_test_client(config: FakeBackendConfig, check: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def main() -> None:
        async with TestClient(TestServer(make_app(config))) as http:
            await check(http)

    asyncio.run(main())


# --- the openai client ---------------------------------------------------------------------------------------


def test_chat_answers_with_the_model_and_the_last_user_message() -> None:
    with running() as url:
        raw = client(url).chat.completions.with_raw_response.create(
            model="other",
            messages=[
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "text", "text": "hello there"}]},
            ],
        )
    answer = raw.parse()
    assert raw.headers[MODEL_HEADER] == "other"
    assert answer.object == "chat.completion" and answer.model == "other"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == "other answered: hello there"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.total_tokens > 0


def test_chat_stream_arrives_chunk_by_chunk_then_usage() -> None:
    config = FAST
    with running(config) as url:
        stream = client(url).chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": "stream me"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        arrivals: list[float] = []
        chunks = []
        for chunk in stream:
            arrivals.append(time.monotonic())
            chunks.append(chunk)
    content, usage = chunks[:-1], chunks[-1]
    assert len(content) == config.chunks
    assert all(c.object == "chat.completion.chunk" and c.model == "fake" for c in chunks)
    assert content[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in content] == [None] * (config.chunks - 1) + ["stop"]
    assert "".join(c.choices[0].delta.content or "" for c in content) == "fake answered: stream me"
    assert usage.choices == [] and usage.usage is not None and usage.usage.completion_tokens > 0
    # Flushed one by one: the client saw them spread over the stream, not in one burst at the end.
    assert arrivals[config.chunks - 1] - arrivals[0] >= (config.chunks - 1) * config.chunk_delay * 0.5


def test_text_completions_plain_and_streamed() -> None:
    with running() as url:
        answer = client(url).completions.create(model="fake", prompt="once upon")
        pieces = list(client(url).completions.create(model="fake", prompt="once upon", stream=True))
    assert answer.object == "text_completion" and answer.choices[0].text == "fake answered: once upon"
    assert len(pieces) == FAST.chunks
    assert "".join(p.choices[0].text for p in pieces) == answer.choices[0].text


def test_embeddings_are_deterministic_vectors_of_eight() -> None:
    with running() as url:
        one = client(url).embeddings.create(model="fake", input="a")
        many = client(url).embeddings.create(model="fake", input=["a", "b", "a"])
        # Older clients ask for base64 by default: little-endian float32s.
        request = urllib.request.Request(
            f"{url}/v1/embeddings",
            data=json.dumps({"model": "fake", "input": "a", "encoding_format": "base64"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            encoded = json.loads(resp.read())["data"][0]["embedding"]
    vectors = [d.embedding for d in many.data]
    assert [d.index for d in many.data] == [0, 1, 2]
    assert all(len(v) == 8 for v in vectors)
    assert vectors[0] == vectors[2] == one.data[0].embedding != vectors[1]
    assert list(struct.unpack("<8f", base64.b64decode(encoded))) == pytest.approx(vectors[0])


def test_images_are_n_decodable_pngs() -> None:
    with running() as url:
        answer = client(url).images.generate(model="fake", prompt="a cat", n=2)
    assert answer.data is not None and len(answer.data) == 2
    for image in answer.data:
        assert image.b64_json is not None
        assert Image.open(io.BytesIO(base64.b64decode(image.b64_json))).size == (1, 1)


def test_models_list() -> None:
    with running() as url:
        models = client(url).models.list()
    assert [m.id for m in models.data] == ["fake", "other"]
    assert all(m.object == "model" for m in models.data)


def test_speech_is_mpeg_audio() -> None:
    with running() as url:
        raw = client(url).audio.speech.with_raw_response.create(model="fake", voice="alloy", input="hi")
    assert raw.headers["Content-Type"] == "audio/mpeg" and raw.headers[MODEL_HEADER] == "fake"
    assert raw.content[:2] == b"\xff\xfb"  # an MPEG audio frame sync


def test_responses_api() -> None:
    with running() as url:
        response = client(url).responses.create(model="fake", input="describe gpulane")
    assert response.object == "response" and response.status == "completed" and response.model == "fake"
    assert response.output_text == "fake answered: describe gpulane"


def test_multipart_transcription_and_image_edit_route_by_the_form_model() -> None:
    with running() as url:
        text = client(url).audio.transcriptions.create(model="other", file=("clip.wav", b"RIFF1234"))
        edited = client(url).images.edit(model="fake", image=("in.png", PNG), prompt="add a hat", n=3)
        counts = stats(url)
    assert text.text == "other transcribed 8 bytes"
    assert edited.data is not None and len(edited.data) == 3
    assert counts["per_model"] == {"other": 1, "fake": 1}


def test_unknown_model_is_a_404_in_openai_format() -> None:
    with running() as url:
        with pytest.raises(openai.NotFoundError) as caught:
            client(url).chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
        assert stats(url)["total"] == 0
    assert caught.value.code == "model_not_found" and caught.value.param == "model"


async def _until(get: Any, ok: Any, json_check: Any = None, seconds: float = 5.0) -> Any:
    """Poll ``get()`` until its response passes ``ok`` (and ``json_check`` on its body), for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        resp = await get()
        if ok(resp) and (json_check is None or json_check(await resp.json())):
            return resp
        assert time.monotonic() < deadline, f"still {resp.status} after {seconds}s"
        await asyncio.sleep(0.01)


# --- aiohttp's test client -----------------------------------------------------------------------------------


def test_loading_phase_is_503_then_200() -> None:
    async def check(http: TestClient[Any, Any]) -> None:
        health = await http.get("/health")
        assert health.status == 503 and await health.json() == {"status": "loading"}
        call = await http.post("/v1/chat/completions", json={"model": "fake", "messages": []})
        assert call.status == 503 and int(call.headers["Retry-After"]) >= 1
        assert (await call.json())["error"]["code"] == "model_loading"
        assert (await http.get("/v1/models")).status == 503
        health = await _until(lambda: http.get("/health"), lambda r: r.status == 200)
        assert await health.json() == {"status": "ok"}
        assert (await http.post("/v1/chat/completions", json={"model": "fake", "messages": []})).status == 200

    # A second of loading: the three calls above must land inside it even on a busy machine (0.25 s did not).
    with_test_client(FakeBackendConfig(load_seconds=1.0), check)


def test_bad_requests_are_400_in_openai_format() -> None:
    async def check(http: TestClient[Any, Any]) -> None:
        for body, param in (("{not json", None), ("[1]", None), ('{"messages": []}', "model")):
            resp = await http.post("/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
            assert error["type"] == "invalid_request_error" and error["param"] == param
        resp = await http.post("/v1/audio/transcriptions", json={"model": "fake"})
        assert resp.status == 400  # multipart only
        resp = await http.post("/v1/images/generations", json={"model": "fake", "n": 0})
        assert resp.status == 400 and (await resp.json())["error"]["param"] == "n"
        resp = await http.get("/v1/nothing")
        assert resp.status == 404 and "error" in await resp.json()
        assert (await (await http.get("/stats")).json())["total"] == 0

    with_test_client(FAST, check)


def test_any_model_when_the_list_is_empty_and_every_response_names_one() -> None:
    async def check(http: TestClient[Any, Any]) -> None:
        resp = await http.post("/v1/embeddings", json={"model": "whatever", "input": [[1, 2], [3]]})
        assert resp.status == 200 and resp.headers[MODEL_HEADER] == "whatever"
        assert len((await resp.json())["data"]) == 2
        assert (await http.get("/health")).headers[MODEL_HEADER] == "*"

    with_test_client(FakeBackendConfig(models=[]), check)


def test_stats_count_served_and_in_flight_calls() -> None:
    async def check(http: TestClient[Any, Any]) -> None:
        chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
        started = time.monotonic()
        pending = asyncio.ensure_future(http.post("/v1/chat/completions", json=chat))
        stats = await _until(lambda: http.get("/stats"), lambda r: r.status == 200, json_check=lambda j: j["in_flight"])
        assert await stats.json() == {
            "total": 1,
            "per_model": {"fake": 1},
            "in_flight": 1,
            "disconnected": 0,
        }
        assert (await pending).status == 200
        assert time.monotonic() - started >= 0.2  # request_seconds was spent
        await http.post("/v1/completions", json={"model": "other", "prompt": "x"})
        await http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        counts = await (await http.get("/stats")).json()
        assert counts == {"total": 2, "per_model": {"fake": 1, "other": 1}, "in_flight": 0, "disconnected": 0}

    with_test_client(FakeBackendConfig(models=["fake", "other"], request_seconds=0.2), check)


@pytest.mark.parametrize("cancelled", [True, False], ids=["serve-cancels-handlers", "write-fails"])
def test_clients_that_leave_are_counted_not_raised(caplog: pytest.LogCaptureFixture, cancelled: bool) -> None:
    config = FakeBackendConfig(request_seconds=0.1, chunks=20, chunk_delay=0.05, port=0)

    async def main() -> dict[str, Any]:
        # serve() cancels a handler when its client leaves; aiohttp's default lets it run until a write fails.
        if cancelled:
            runner = await serve(config)
        else:
            runner = web.AppRunner(make_app(config))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{bound_port(runner)}"
        chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{base}/v1/chat/completions", json={**chat, "stream": True}) as resp:
                    assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: ")
                if cancelled:  # only a cancelled handler can tell a non-streaming client left
                    with pytest.raises(asyncio.TimeoutError):
                        timeout = aiohttp.ClientTimeout(total=0.05)
                        await session.post(f"{base}/v1/chat/completions", json=chat, timeout=timeout)
                await asyncio.sleep(0.2)
                async with session.get(f"{base}/stats") as resp:
                    return dict(await resp.json())
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.DEBUG):
        counts = asyncio.run(main())
    assert counts["in_flight"] == 0 and counts["disconnected"] == (2 if cancelled else 1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --- the command line ----------------------------------------------------------------------------------------


def test_arguments_cover_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "a", "--model", "b", "--load-seconds", "1.5", "--chunks", "3"])
    assert args.model == ["a", "b"] and args.load_seconds == 1.5 and args.chunks == 3
    assert parser.parse_args([]).port == 8000
    with pytest.raises(ValueError):
        FakeBackendConfig(chunks=0)


def test_cli_ignores_sigterm_when_asked_and_stops_on_sigint() -> None:
    code = (
        "import argparse, sys; from gpulane.fakes.backend import add_arguments, run; "
        "p = argparse.ArgumentParser(); add_arguments(p); sys.exit(run(p.parse_args(sys.argv[1:])))"
    )
    argv = [sys.executable, "-c", code, "--port", "0", "--ignore-sigterm", "--model", "m"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert found, line
        url = f"http://127.0.0.1:{found.group(1)}"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert proc.poll() is None
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            assert resp.status == 200 and resp.headers[MODEL_HEADER] == "m"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
