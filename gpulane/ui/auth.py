"""Logging in to the web page: a bridge API key, or a Kubernetes token for the audience ``gpulane-ui``
(``kubectl create token NAME --audience gpulane-ui``), or nobody at all when the operator enables an anonymous
page. A login becomes a session: a random id in an HttpOnly cookie, so neither the key nor the token is ever
in the page or its URLs.

- A bridge key sees its own member's jobs (a trusted key: its users' too; an admin key: all of them) in the
  bridge's namespace.
- A Kubernetes user sees the namespaces whose GpuJobs they may list (a SubjectAccessReview per namespace, or one
  for every namespace at once), asked again when a new namespace appears and every ``RECHECK_SECONDS``.
- Anonymous sees no job by name: the whole cluster as load.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from gpulane.bridge.keys import Denied, KeyRing
from gpulane.ui.scope import Viewer

UI_AUDIENCE = "gpulane-ui"
SESSION_SECONDS = 12 * 3600.0
RECHECK_SECONDS = 300.0  # a user's namespaces are asked again this often (a RoleBinding removed takes effect)
ANONYMOUS = Viewer("anonymous", frozenset())


class Reviews(Protocol):
    async def authenticate(self, token: str, audience: str) -> tuple[str, list[str]] | None: ...
    async def may_read_jobs(self, user: str, groups: list[str], namespace: str, name: str | None = None) -> bool: ...


class LoginFailed(Exception):
    """A key or token the page refuses; the message is for the login form."""


@dataclass
class Session:
    viewer: Viewer
    expires: float
    user: tuple[str, list[str]] | None = None  # a Kubernetes user's name and groups: their namespaces are asked
    allowed: dict[str, bool] = field(default_factory=dict)
    checked: float = 0.0


class Sessions:
    def __init__(self, reviews: Reviews | None, keys: KeyRing | None, bridge_namespace: str, anonymous: bool,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.reviews, self.keys, self.bridge_namespace = reviews, keys, bridge_namespace
        self.anonymous = anonymous
        self.clock = clock
        self._sessions: dict[str, Session] = {}

    async def login(self, secret: str) -> tuple[str, Viewer]:
        """A new session for a bridge key or a Kubernetes token: (its id, who it is)."""
        secret = secret.strip()
        if not secret:
            raise LoginFailed("give a bridge API key or a Kubernetes token")
        session = self._by_key(secret) or await self._by_token(secret)
        if session is None:
            raise LoginFailed("neither a bridge API key nor a Kubernetes token for the audience gpulane-ui")
        self._expire()
        sid = secrets.token_urlsafe(32)
        self._sessions[_digest(sid)] = session
        return sid, session.viewer

    def logout(self, sid: str | None) -> None:
        if sid:
            self._sessions.pop(_digest(sid), None)

    async def viewer(self, sid: str | None, namespaces: Iterable[str]) -> Viewer | None:
        """Who holds session ``sid`` (anonymous without one when enabled), their namespaces up to date with the
        cluster's ``namespaces``; None: log in first."""
        session = self._sessions.get(_digest(sid)) if sid else None
        if session is None or session.expires < self.clock():
            return ANONYMOUS if self.anonymous else None
        if session.user is not None:
            await self._recheck(session, set(namespaces))
        return session.viewer

    def _by_key(self, secret: str) -> Session | None:
        if self.keys is None:
            return None
        try:
            who = self.keys.identify(f"Bearer {secret}", {})
        except Denied:
            return None
        members = None if who.admin else frozenset({who.member})
        viewer = Viewer(f"key {who.key}", frozenset({self.bridge_namespace}), members)
        return Session(viewer, self.clock() + SESSION_SECONDS)

    async def _by_token(self, secret: str) -> Session | None:
        if self.reviews is None:
            return None
        who = await self.reviews.authenticate(secret, UI_AUDIENCE)
        if who is None:
            return None
        session = Session(Viewer(f"user {who[0]}", frozenset()), self.clock() + SESSION_SECONDS, user=who)
        await self._recheck(session, set())
        return session

    async def _recheck(self, session: Session, namespaces: set[str]) -> None:
        assert session.user is not None and self.reviews is not None
        user, groups = session.user
        if self.clock() - session.checked >= RECHECK_SECONDS:
            session.allowed, session.checked = {}, self.clock()
        if "" not in session.allowed:  # "": every namespace at once
            session.allowed[""] = await self.reviews.may_read_jobs(user, groups, "")
        if not session.allowed[""]:
            new = sorted(namespaces - session.allowed.keys())
            answers = await asyncio.gather(*(self.reviews.may_read_jobs(user, groups, n) for n in new))
            session.allowed.update(zip(new, answers, strict=True))
        seen = None if session.allowed[""] else frozenset(n for n, ok in session.allowed.items() if ok and n)
        session.viewer = Viewer(session.viewer.name, seen)

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, s in self._sessions.items() if s.expires < now]:
            del self._sessions[key]


def _digest(sid: str) -> str:
    """Sessions are kept by digest: a memory dump or a timing difference does not give one away."""
    return hashlib.sha256(sid.encode()).hexdigest()
