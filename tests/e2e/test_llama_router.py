"""The router client against the real llama-server in router mode (issue 36): the binary the suite builds
(``make llama-server``), started here as a process with three tiny generated models and a broken one in its
preset. It checks the facts ``gpulane/servers/llama_router.py`` relies on, on the binary itself: no model
loads until asked, a load answers at once and shows ``loaded`` later, a call for a model not loaded is refused,
past ``--models-max`` the router gives the least recently used up, and a model whose process exits is a
failed load with its exit code."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Iterator

import pytest
from aiohttp import ClientSession

from gpulane.api.resources import GpuModelSpec
from gpulane.operator.server_pods import preset_ini
from gpulane.servers.llama_router import LOADED, UNLOADED, LoadFailed, RouterClient, RouterError

from .support import localcluster, wait_until
from .tiny_gguf import write_tiny_model

pytestmark = pytest.mark.e2e("kwok")  # no cluster: the server runs here, as a process

MODELS = ("alpha", "beta", "gamma")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    built = localcluster.llama_server.built_dir()
    binary, vocabulary = built / "llama-server", built / localcluster.llama_server.VOCAB
    assert binary.exists(), f"{binary} is missing: `make llama-server` builds it"
    weights = tmp_path_factory.mktemp("router")
    held: dict[str, GpuModelSpec] = {}
    for seed, name in enumerate(MODELS):
        write_tiny_model(vocabulary, weights / f"{name}.gguf", seed=seed, context=256)
        held[name] = GpuModelSpec(server="router", preset={"model": str(weights / f"{name}.gguf"), "c": "256"})
    (weights / "broken.gguf").write_bytes(b"GGUF, but not a model")
    held["broken"] = GpuModelSpec(server="router", preset={"model": str(weights / "broken.gguf")})
    (weights / "preset.ini").write_text(preset_ini(held))  # as the operator writes it
    port = free_port()
    argv = [str(binary), "--models-preset", str(weights / "preset.ini"), "--no-models-autoload",
            "--models-max", "2", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    log = (weights / "server.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: asyncio.run(listed(url)), timeout=30, what="the router listing its models")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


async def listed(url: str) -> bool:
    async with ClientSession() as session:
        try:
            return set(await RouterClient(url, session).models()) == {*MODELS, "broken"}
        except RouterError:
            return False


async def chat(session: ClientSession, url: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        return resp.status


def test_the_router_loads_only_when_asked_and_serves_what_it_loaded(router: str) -> None:
    async def check() -> None:
        async with ClientSession() as session:
            client = RouterClient(router, session, timeout=30)
            assert {s.value for s in (await client.models()).values()} == {UNLOADED}
            assert await chat(session, router, "alpha") == 400  # not loaded, and never loaded on its own
            assert (await client.models())["alpha"].value == UNLOADED
            for name in ("alpha", "beta"):
                await client.load(name)
                await client.wait_loaded(name, timeout=60)
            assert {n for n, s in (await client.models()).items() if s.value == LOADED} == {"alpha", "beta"}
            assert await chat(session, router, "alpha") == 200
            assert await chat(session, router, "beta") == 200  # alpha is now the least recently used
            await client.load("gamma")  # a third, past --models-max 2
            await client.wait_loaded("gamma", timeout=60)
            assert {n for n, s in (await client.models()).items() if s.value == LOADED} == {"beta", "gamma"}
            await client.unload("gamma")
            await wait_for(client, "gamma", UNLOADED)

    asyncio.run(check())


def test_a_model_whose_process_exits_is_a_failed_load_and_an_unknown_one_is_refused(router: str) -> None:
    async def check() -> None:
        async with ClientSession() as session:
            client = RouterClient(router, session, timeout=30)
            await client.load("broken")
            with pytest.raises(LoadFailed, match="exited with code"):
                await client.wait_loaded("broken", timeout=60)
            with pytest.raises(RouterError, match="404"):
                await client.load("nowhere")

    asyncio.run(check())


async def wait_for(client: RouterClient, model: str, value: str, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (await client.models())[model].value != value:
        assert asyncio.get_running_loop().time() < deadline, f"{model} never {value}"
        await asyncio.sleep(0.05)
