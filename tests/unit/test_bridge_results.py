"""GET /results/NAMESPACE/JOB on the bridge: a job's answer file, only for a token whose holder may get the
job (TokenReview, then SubjectAccessReview), and only from inside the results volume."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpulane.api.contract import BRIDGE_AUDIENCE
from gpulane.bridge.results import ResultReader, ResultStore
from gpulane.kube.client import Gone

TOKENS = {"alice-token": ("alice", ["team-a"]), "bob-token": ("bob", ["team-b"])}


class FakeKube:
    def __init__(self, jobs: dict[str, dict[str, Any]]) -> None:
        self.jobs = jobs
        self.reviews: list[tuple[str, str, str]] = []
        self.audiences: list[str] = []  # asked of each TokenReview

    async def authenticate(self, token: str, audience: str) -> tuple[str, list[str]] | None:
        self.audiences.append(audience)
        return TOKENS.get(token)

    async def may_read_jobs(self, user: str, groups: list[str], namespace: str, name: str | None = None) -> bool:
        self.reviews.append((user, namespace, name))
        return namespace in groups  # each team may read its own namespace's jobs

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.jobs[f"{namespace}/{name}"]
        except KeyError:
            raise Gone(name) from None


def job(name: str, path: str, sha: str = "abc", uid: str = "12345678-0000") -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": name, "uid": uid},
            "status": {"result": {"volume": {"path": path, "bytes": 5, "sha256": sha}}}}  # fmt: skip


@pytest.mark.parametrize(
    ("token", "target", "status", "says"),
    [
        (None, "team-a/film", 401, "bearer token is needed"),
        ("forged", "team-a/film", 401, "not accepted"),
        ("bob-token", "team-a/film", 403, "bob may not get GpuJob team-a/film"),
        ("alice-token", "team-a/ghost", 404, "does not exist"),
        ("alice-token", "team-a/escape", 404, "has no answer on the results volume"),
        # issue 34's L1: her own job's status names another job's answer (an executor may write it).
        ("alice-token", "team-a/thief", 404, "has no answer on the results volume"),
        ("alice-token", "team-a/film", 200, None),
    ],
)
def test_only_who_may_get_the_job_reads_its_answer(
    tmp_path: Path, token: str | None, target: str, status: int, says: str | None
) -> None:
    (tmp_path / "team-a" / "film-12345678").mkdir(parents=True)
    (tmp_path / "team-a" / "film-12345678" / "answer").write_bytes(b"video")
    (tmp_path.parent / "secret").write_bytes(b"not yours")
    kube = FakeKube({"team-a/film": job("film", "team-a/film-12345678/answer", "f00d"),
                     "team-a/escape": job("escape", "../../secret"),
                     "team-a/thief": job("thief", "team-a/film-12345678/answer", uid="87654321-0000")})  # fmt: skip

    async def scenario() -> None:
        app = web.Application()
        ResultReader(kube, ResultStore(tmp_path)).add_routes(app)
        async with TestClient(TestServer(app)) as http:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            resp = await http.get(f"/results/{target}", headers=headers)
            assert resp.status == status
            if says is None:
                assert await resp.read() == b"video"
                assert resp.headers["X-Gpulane-Sha256"] == "f00d"
            else:
                assert says in (await resp.json())["error"]["message"]

    asyncio.run(scenario())
    if token in TOKENS:
        assert kube.reviews[0][0] == TOKENS[token][0], "the access review names the token's holder"
    assert set(kube.audiences) <= {BRIDGE_AUDIENCE}, "a token must be one for the bridge (review M7)"
