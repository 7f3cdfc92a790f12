"""llama.cpp's ``llama-server`` in router mode, as the operator drives it: the lane's one server pod that holds
several models and loads and unloads them on request.

The facts this client relies on, read in llama.cpp's ``tools/server`` (README "Router mode", ``GET /models``,
``POST /models/load``, ``POST /models/unload``; ``server-models.cpp``) and checked against the binary the suite
builds (``tests/e2e/test_llama_router.py``):

- Started with no model and ``--models-preset FILE.ini``, it lists each preset section as a model; started with
  ``--no-models-autoload`` it answers a call for a model not loaded with 400 ("model is not loaded") instead of
  loading it, so every load is the operator's decision.
- ``POST /models/load {"model": NAME}`` answers ``{"success": true}`` at once and loads in the background, in a
  child process of its own; ``GET /models`` then shows the model's ``status.value`` go ``loading`` ->
  ``loaded``, or back to ``unloaded`` with ``failed: true`` and the child's ``exit_code``. A name it does not
  know is a 404.
- ``POST /models/unload {"model": NAME}`` stops that child. Past ``--models-max`` loaded models the router
  unloads the least recently used by itself; the operator unloads first what the core evicts, so that
  never happens behind its back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout

LOADED, LOADING, UNLOADED = "loaded", "loading", "unloaded"


class RouterError(Exception):
    """The server could not be asked, or refused: its answer, for the lane's condition."""


class LoadFailed(RouterError):
    """The server tried the model and its process exited: the same ``Failed`` as a backend that never loads."""


@dataclass(frozen=True, slots=True)
class ModelStatus:
    name: str
    value: str  # loaded, loading, unloaded, sleeping, downloading
    failed: bool = False
    exit_code: int | None = None


def statuses(body: Any) -> dict[str, ModelStatus]:
    """``GET /models``'s answer, each model's status by its name."""
    out: dict[str, ModelStatus] = {}
    for entry in (body or {}).get("data") or []:
        status = entry.get("status") or {}
        name = str(entry.get("id"))
        out[name] = ModelStatus(name, str(status.get("value")), bool(status.get("failed")), status.get("exit_code"))
    return out


class RouterClient:
    def __init__(self, base_url: str, session: ClientSession, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.timeout = ClientTimeout(total=timeout)

    async def models(self) -> dict[str, ModelStatus]:
        return statuses(await self._call("GET", "/models"))

    async def load(self, model: str) -> None:
        """Ask for ``model``'s load; it goes on in the background (``wait_loaded``)."""
        await self._call("POST", "/models/load", {"model": model})

    async def unload(self, model: str) -> None:
        await self._call("POST", "/models/unload", {"model": model})

    async def wait_loaded(self, model: str, timeout: float, poll: float = 0.05) -> float:
        """Seconds until ``model`` shows loaded; ``LoadFailed`` if its process exited, ``TimeoutError`` past
        ``timeout``."""
        started = time.monotonic()
        while True:
            status = (await self.models()).get(model)
            if status is None:
                raise RouterError(f"the server does not list model {model!r}")
            if status.value == LOADED:
                return time.monotonic() - started
            if status.failed:
                raise LoadFailed(f"the server's process for {model!r} exited with code {status.exit_code}")
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{model!r} still {status.value} after {timeout:g}s")
            await asyncio.sleep(poll)

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            async with self.session.request(method, self.base_url + path, json=body, timeout=self.timeout) as resp:
                if resp.status >= 400:
                    raise RouterError(f"{method} {path}: {resp.status} {(await resp.text())[:300]}")
                return await resp.json(content_type=None)
        except (TimeoutError, ClientError) as err:
            raise RouterError(f"{method} {path}: {err or type(err).__name__}") from err
