"""llama-swap's /unload through the bridge (issue 33): an admin key's request becomes the Lease the operator
watches; any other caller is refused, and nothing is written."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpulane.bridge.app import Bridge, BridgeSettings
from gpulane.bridge.catalog import Catalog
from gpulane.bridge.keys import KeyRing, KeysFile

ADMIN = {"name": "ops", "key": "sk-ops-000000", "member": "ops", "admin": True}
USER = {"name": "app", "key": "sk-app-000000", "member": "app", "maxPriority": 100}


class Recorder:
    def __init__(self, fails: bool = False) -> None:
        self.unloads: list[str] = []
        self.fails = fails

    async def models(self) -> Catalog:
        return Catalog.of({"m"})

    async def unload(self, by: str) -> None:
        if self.fails:
            raise OSError("connection refused")
        self.unloads.append(by)


@pytest.mark.parametrize(
    ("key", "method", "status", "code", "written"),
    [(ADMIN, "GET", 200, None, ["key ops"]), (ADMIN, "POST", 200, None, ["key ops"]),
     (USER, "GET", 403, "admin_only", []), (None, "GET", 401, "invalid_api_key", [])],
)  # fmt: skip
def test_only_an_admin_key_unloads(key: dict[str, object] | None, method: str, status: int, code: str | None,
                                   written: list[str]) -> None:  # fmt: skip
    async def scenario() -> None:
        queue = Recorder()
        bridge = Bridge(queue, KeyRing(KeysFile.model_validate({"keys": [ADMIN, USER]})), BridgeSettings())  # type: ignore[arg-type]
        headers = {"Authorization": f"Bearer {key['key']}"} if key else {}
        async with TestClient(TestServer(bridge.app())) as http:
            resp = await http.request(method, "/unload", headers=headers)
            assert resp.status == status, await resp.text()
            if code is None:
                assert await resp.text() == "OK\n"
            else:
                assert (await resp.json())["error"]["code"] == code
        assert queue.unloads == written

    asyncio.run(scenario())


def test_an_unload_the_cluster_did_not_take_is_a_503_to_retry() -> None:
    async def scenario() -> None:
        bridge = Bridge(Recorder(fails=True), KeyRing(KeysFile.model_validate({"keys": [ADMIN]})), BridgeSettings())  # type: ignore[arg-type]
        async with TestClient(TestServer(bridge.app())) as http:
            resp = await http.get("/unload", headers={"Authorization": f"Bearer {ADMIN['key']}"})
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
            assert "connection refused" in (await resp.json())["error"]["message"]

    asyncio.run(scenario())
