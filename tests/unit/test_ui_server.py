"""The web page's server: logging in with a bridge key or a Kubernetes token, sessions in an HttpOnly cookie, the
views as JSON and as a live stream, and what it refuses. A fake apiserver answers the reviews; the store is fed
as the watches would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpulane.bridge.keys import KeyRing
from gpulane.ui import auth
from gpulane.ui import server as server_module
from gpulane.ui.auth import UI_AUDIENCE, LoginFailed, Sessions
from gpulane.ui.server import COOKIE, Server
from gpulane.ui.store import Store

from .helpers import until
from .ui_world import NOW, filled, world

KEYS = """
keys:
- {name: film-app, key: sk-film-app-key, member: film}
- {name: ops, key: sk-operations-key, member: ops, admin: true}
"""
TOKENS = {"alice-token": ("alice", ["team-a"]), "root-token": ("root", ["admins"])}


class Reviews:
    """TokenReview and SubjectAccessReview as the apiserver answers them: a token only for the page's audience;
    a group reads its own namespace, admins every namespace."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.revoked: set[str] = set()

    async def authenticate(self, token: str, audience: str) -> tuple[str, list[str]] | None:
        return TOKENS.get(token) if audience == UI_AUDIENCE else None

    async def may_read_jobs(self, user: str, groups: list[str], namespace: str, name: str | None = None) -> bool:
        self.asked.append((user, namespace))
        if user in self.revoked:
            return False
        return "admins" in groups or namespace in groups


def server(tmp_path: Path, *, anonymous: bool = False, store: Store | None = None,
           reviews: Reviews | None = None) -> Server:  # fmt: skip
    """The page's server on ``world()`` (or ``store``), with the keys file and a fake apiserver's reviews."""
    (tmp_path / "keys.yaml").write_text(KEYS)
    sessions = Sessions(reviews or Reviews(), KeyRing.load(tmp_path / "keys.yaml"), "team-a", anonymous)
    return Server(store or filled(), sessions, clock=lambda: NOW)


def serve(tmp_path: Path, scenario: Callable[[TestClient, Store, Sessions], Awaitable[None]], *,
          ui: Server | None = None, **options: Any) -> None:  # fmt: skip
    ui = ui or server(tmp_path, **options)

    async def run() -> None:
        async with TestClient(TestServer(ui.app(), handler_cancellation=True)) as http:  # as gpulane ui runs it
            await scenario(http, ui.store, ui.sessions)

    asyncio.run(run())


async def login(http: TestClient, secret: str) -> Any:
    answer = await http.post("/api/login", json={"secret": secret})
    return answer.status, await answer.json()


def test_without_a_login_there_is_no_data_only_the_page(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        page = await http.get("/")
        assert page.status == 200 and "gpulane" in await page.text()
        assert "default-src 'self'" in page.headers["Content-Security-Policy"]
        for path in ("/api/views/queue", "/api/stream/queue"):
            answer = await http.get(path)
            assert (answer.status, await answer.json()) == (401, {"error": "log in first"})

    serve(tmp_path, scenario)


@pytest.mark.parametrize("secret", ["", "sk-unknown-key", "bob-token", '"; drop'])
def test_a_bad_key_or_token_gets_the_login_again(tmp_path: Path, secret: str) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        status, body = await login(http, secret)
        assert status == 401 and ("API key" in body["error"] or "give a" in body["error"])
        assert COOKIE not in http.session.cookie_jar.filter_cookies(http.make_url("/"))
        assert (await http.get("/api/views/lanes")).status == 401

    serve(tmp_path, scenario)


def test_a_login_body_that_is_not_json_is_refused(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        # A form (another site's, say) is not JSON: refused before it is read, and no session comes of it.
        answer = await http.post("/api/login", data={"secret": "sk-film-app-key"})
        assert answer.status == 415 and "send JSON" in (await answer.json())["error"]
        assert "Set-Cookie" not in answer.headers
        broken = await http.post("/api/login", data="{not json", headers={"Content-Type": "application/json"})
        assert broken.status == 400 and "send JSON" in (await broken.json())["error"]

    serve(tmp_path, scenario)


def test_failed_logins_from_one_address_are_slowed(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        for i in range(server_module.FAILED_LOGINS_PER_MINUTE):
            assert (await login(http, f"sk-guess-{i:04d}"))[0] == 401
        answer = await http.post("/api/login", json={"secret": "sk-film-app-key"})  # even a right one, for now
        assert answer.status == 429 and answer.headers["Retry-After"] == "60"

    serve(tmp_path, scenario)


def test_a_session_opens_a_few_streams_at_most(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        await login(http, "alice-token")
        streams = [await http.get("/api/stream/lanes") for _ in range(server_module.STREAMS_PER_SESSION)]
        for answer in streams:
            assert answer.status == 200
            await asyncio.wait_for(next_event(answer.content), 5)
        extra = await http.get("/api/stream/queue")
        assert extra.status == 429 and "close one" in (await extra.json())["error"]
        streams[0].close()  # a page moved to another view: its slot is free at once, with no write to notice it
        again = await until_status(http, "/api/stream/queue", 200)
        assert again.status == 200
        again.close()
        for answer in streams[1:]:
            answer.close()

    serve(tmp_path, scenario)


def test_a_key_logs_in_to_an_httponly_session_and_sees_its_own_jobs(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        answer = await http.post("/api/login", json={"secret": "sk-film-app-key"})
        assert answer.status == 200 and (await answer.json()) == {"viewer": "key film-app"}
        cookie = answer.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "sk-film-app-key" not in cookie
        queue = await (await http.get("/api/views/queue")).json()
        # The key's member is "film": team-a's chat (member alice) is load, like team-b's job.
        assert [r["job"] for r in queue["data"]["waiting"]] == [None, None]
        ops = await login(http, "sk-operations-key")  # an admin key: the bridge namespace in full
        assert ops == (200, {"viewer": "key ops"})
        queue = await (await http.get("/api/views/queue")).json()
        assert [r["job"] for r in queue["data"]["waiting"]] == [None, "team-a/chat"]

    serve(tmp_path, scenario)


def test_a_token_sees_the_namespaces_its_user_may_list(tmp_path: Path) -> None:
    reviews = Reviews()

    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        assert await login(http, "alice-token") == (200, {"viewer": "user alice"})
        queue = await (await http.get("/api/views/queue")).json()
        assert [r["job"] for r in queue["data"]["waiting"]] == [None, "team-a/chat"]
        assert sorted(reviews.asked) == [("alice", ""), ("alice", "team-a"), ("alice", "team-b")]
        await login(http, "root-token")
        queue = await (await http.get("/api/views/queue")).json()
        assert [r["job"] for r in queue["data"]["waiting"]] == ["team-b/secret-plan", "team-a/chat"]
        assert ("root", "team-b") not in reviews.asked  # a reader of every namespace: one question

    serve(tmp_path, scenario, reviews=reviews)


def test_a_revoked_reader_loses_the_namespace_at_the_next_check(tmp_path: Path) -> None:
    reviews, clock = Reviews(), [NOW]
    sessions = Sessions(reviews, None, "team-a", False, clock=lambda: clock[0])

    async def scenario() -> None:
        sid, viewer = await sessions.login("alice-token")
        assert viewer.namespaces == frozenset()  # no namespace known yet: none asked about
        seen = await sessions.viewer(sid, {"team-a", "team-b"})
        assert seen is not None and seen.namespaces == frozenset({"team-a"})
        reviews.revoked.add("alice")
        seen = await sessions.viewer(sid, {"team-a", "team-b"})
        assert seen is not None and seen.namespaces == frozenset({"team-a"})  # not asked again yet
        clock[0] += auth.RECHECK_SECONDS
        seen = await sessions.viewer(sid, {"team-a", "team-b"})
        assert seen is not None and seen.namespaces == frozenset()
        clock[0] += auth.SESSION_SECONDS
        assert await sessions.viewer(sid, set()) is None  # expired: log in again

    asyncio.run(scenario())


def test_a_token_for_another_audience_is_refused() -> None:
    sessions = Sessions(Reviews(), None, "team-a", False)

    async def scenario() -> None:
        reviews = sessions.reviews
        assert (
            reviews is not None and await reviews.authenticate("alice-token", "https://kubernetes.default.svc") is None
        )
        with pytest.raises(LoginFailed):
            await sessions.login("sk-film-app-key")  # no keys file: keys are not accepted

    asyncio.run(scenario())


def test_an_anonymous_page_shows_load_and_no_name(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        body = await (await http.get("/api/views/lanes")).json()
        assert body["viewer"] == "anonymous"
        text = json.dumps(body)
        assert "film-3" not in text and "team-a" not in text and body["data"][0]["resident"] == "flux"

    serve(tmp_path, scenario, anonymous=True)


def test_logging_out_ends_the_session(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        await login(http, "sk-operations-key")
        assert (await http.get("/api/views/chains")).status == 200
        sid = http.session.cookie_jar.filter_cookies(http.make_url("/"))[COOKIE].value
        await http.post("/api/logout")
        assert await sessions.viewer(sid, set()) is None  # the id is void, not only the cookie gone
        assert (await http.get("/api/views/chains")).status == 401

    serve(tmp_path, scenario)


def test_unknown_views_bad_windows_and_hidden_jobs(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        await login(http, "alice-token")
        assert (await http.get("/api/views/pods")).status == 404
        bad = await http.get("/api/views/usage", params={"window": "forever"})
        assert bad.status == 400 and "window" in (await bad.json())["error"]
        hidden = await http.get("/api/views/job", params={"job": "team-b/secret-plan"})
        assert hidden.status == 404 and "secret-plan" in (await hidden.json())["error"]  # its own words, no more
        assert (await http.get("/static/../server.py")).status == 404

    serve(tmp_path, scenario)


def test_views_wait_for_the_first_lists(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        await login(http, "alice-token")
        assert (await http.get("/healthz")).status == 503
        assert (await http.get("/api/views/lanes")).status == 503
        for plural in ("gpujobs", "gpulanes", "gpumodels", "gpuchains", "gpupolicies"):
            store.in_step(plural, True)
        assert (await http.get("/healthz")).status == 200
        assert (await http.get("/api/views/lanes")).status == 200

    serve(tmp_path, scenario, store=Store())


async def until_status(http: TestClient, path: str, status: int) -> Any:
    """GET ``path`` until it answers ``status`` (at most 2 s): the server notices a closed page in its own time."""
    for _ in range(40):
        answer = await http.get(path)
        if answer.status == status:
            return answer
        answer.close()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never answered {status}")


async def next_event(lines: Any) -> tuple[str, Any]:
    """The next server-sent event: (its name, its data)."""
    event = None
    async for raw in lines:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            return str(event), json.loads(line[6:])
    raise AssertionError("the stream ended")


def test_the_stream_sends_a_change_and_the_login_when_the_session_ends(tmp_path: Path) -> None:
    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        await login(http, "alice-token")
        answer = await http.get("/api/stream/queue")
        assert answer.headers["Content-Type"] == "text/event-stream"
        event, first = await asyncio.wait_for(next_event(answer.content), 5)
        assert event == "view" and [r["job"] for r in first["data"]["waiting"]] == [None, "team-a/chat"]
        chat = store.get("gpujobs", "team-a", "chat")
        assert chat is not None
        store.deliver("gpujobs", "MODIFIED", {**chat, "status": {**chat["status"], "position": 1}})
        event, second = await asyncio.wait_for(next_event(answer.content), 5)
        assert [r["position"] for r in second["data"]["waiting"] if r["job"]] == [1]
        sessions.logout(http.session.cookie_jar.filter_cookies(http.make_url("/"))[COOKIE].value)
        store.deliver("gpujobs", "DELETED", chat)
        assert (await asyncio.wait_for(next_event(answer.content), 5))[0] == "login"

    serve(tmp_path, scenario)


def test_a_relist_after_a_broken_watch_drops_what_was_deleted_meanwhile() -> None:
    store = filled()
    assert store.get("gpujobs", "team-a", "chat") is not None
    store.in_step("gpujobs", False)  # the watch broke; the list that follows lacks chat
    for job in world()["gpujobs"]:
        if job["metadata"]["name"] != "chat":
            store.deliver("gpujobs", "ADDED", job)
    assert store.get("gpujobs", "team-a", "chat") is not None  # until the list is complete
    store.in_step("gpujobs", True)
    assert store.get("gpujobs", "team-a", "chat") is None
    assert len(store.items("gpujobs")) == 4


def test_a_page_that_goes_away_ends_its_stream_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ui = server(tmp_path)

    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        await login(http, "alice-token")
        answer = await http.get("/api/stream/lanes")
        await asyncio.wait_for(next_event(answer.content), 5)
        assert ui._streams, "the stream is counted while its page is open"
        answer.close()  # the browser moved to another view
        await until(lambda: not ui._streams, "the stream's handler to end")  # its slot freed, with no write
        store.deliver("gpujobs", "MODIFIED", world()["gpujobs"][0])  # nobody left to write it to

    with caplog.at_level("ERROR", logger="aiohttp.server"):
        serve(tmp_path, scenario, ui=ui)
    assert not [r for r in caplog.records if r.name == "aiohttp.server"], caplog.text


def test_failed_logins_of_long_ago_are_forgotten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The failures kept per address do not grow without end: past FAILED_CLIENTS_KEPT addresses, those whose
    last failure is a minute old go."""
    monkeypatch.setattr(server_module, "FAILED_CLIENTS_KEPT", 2)
    ui = server(tmp_path)
    ui._failed = {"10.0.0.1": [NOW - 120], "10.0.0.2": [NOW - 90], "10.0.0.3": [NOW - 5]}

    async def scenario(http: TestClient, store: Store, sessions: Sessions) -> None:
        assert (await login(http, "sk-wrong-guess"))[0] == 401

    serve(tmp_path, scenario, ui=ui)
    assert set(ui._failed) == {"10.0.0.3", "127.0.0.1"}
