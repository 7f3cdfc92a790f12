"""vLLM's sleep mode, in the same terms as llama-server's router (``llama_router.py``): a server that keeps a
model's weights in host memory and gives the GPU back, then takes them back in well under a second.

The routes, from vLLM's ``vllm/entrypoints/serve/sleep/api_router.py`` (v0.14) and its sleep mode guide: they
exist only when the server runs with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``.

- ``POST /sleep?level=1|2``: level 1 moves the weights to host memory and drops the KV cache (to run the same
  model again); level 2 drops the weights too (to switch to another model). It answers 200 with no body.
- ``POST /wake_up``: the weights back on the GPU.
- ``GET /is_sleeping``: ``{"is_sleeping": true|false}``.

How a lane would run it (not built yet): one vLLM pod per model on the lane, all but one asleep at level 1,
their weights in the node's memory; a switch is ``/sleep?level=1`` on the serving one, then ``/wake_up`` on the
next, the model's switch time is the wake-up's (0.26-0.82 s for small models on an A100, against a cold reload
of about 48 s), and the lane's memory counts only the awake model on the GPU and every sleeping one in the host.
"""

from __future__ import annotations

from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout


class SleepError(Exception):
    """The server could not be asked, or refused."""


class SleepClient:
    def __init__(self, base_url: str, session: ClientSession, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.timeout = ClientTimeout(total=timeout)

    async def sleep(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"vLLM sleeps at level 1 or 2, not {level}")
        await self._call("POST", f"/sleep?level={level}")

    async def wake_up(self) -> None:
        await self._call("POST", "/wake_up")

    async def is_sleeping(self) -> bool:
        body = await self._call("GET", "/is_sleeping")
        answer = body.get("is_sleeping") if isinstance(body, dict) else None
        if not isinstance(answer, bool):
            raise SleepError(f"GET /is_sleeping: unexpected answer {body!r}")
        return answer

    async def _call(self, method: str, path: str) -> Any:
        try:
            async with self.session.request(method, self.base_url + path, timeout=self.timeout) as resp:
                if resp.status >= 400:
                    raise SleepError(f"{method} {path}: {resp.status} {(await resp.text())[:300]}")
                text = await resp.text()
                return await resp.json(content_type=None) if text.strip() else None
        except (TimeoutError, ClientError) as err:
            raise SleepError(f"{method} {path}: {err or type(err).__name__}") from err
