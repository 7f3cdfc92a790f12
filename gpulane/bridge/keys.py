"""API keys: who is calling the bridge, and what they may ask for.

The keys file (mounted from a Secret) lists each key with the member and tier its calls count
against, the highest priority it may request, and whether it is trusted to speak for its own users
(``X-LlamaSwap-Member`` / ``X-LlamaSwap-Tier``). Keys are stored as SHA-256 digests or in clear.

    keys:
    - name: mort
      sha256: 9f86d0...            # or key: sk-...
      member: mort
      tier: pro
      maxPriority: 100
      trusted: true
    anonymous:                     # optional: callers without a key; absent means 401
      member: anonymous
      maxPriority: 0
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, model_validator

from gpulane.core.policy import CamelModel
from gpulane.core.priority import parse_priority
from gpulane.core.validation import describe

MEMBER_HEADER = "X-LlamaSwap-Member"
TIER_HEADER = "X-LlamaSwap-Tier"
PRIORITY_HEADER = "X-LlamaSwap-Priority"
# A GpuJob's spec.member is at most 253 characters: a key's member and its user's name take half each.
MEMBER_LIMIT = 252
# How often the keys file is looked at again (as the webhook re-reads its certificate).
RELOAD_SECONDS = 10.0

log = logging.getLogger(__name__)


class Grant(CamelModel):
    member: str = Field(min_length=1, max_length=MEMBER_LIMIT // 2)
    tier: str = Field(default="free", min_length=1, max_length=63)
    max_priority: int = 0
    trusted: bool = False
    # The tiers a trusted key may give its users with X-LlamaSwap-Tier; unset: only its own tier.
    tiers: list[str] | None = None
    # May call /unload: every lane gives its GPU back once its running jobs end (llama-swap's /unload).
    admin: bool = False

    def allowed_tiers(self) -> list[str]:
        return [self.tier] if self.tiers is None else self.tiers


class Key(Grant):
    name: str = Field(min_length=1, max_length=63)
    key: str | None = Field(default=None, min_length=8)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _one_secret(self) -> Key:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError(f"key {self.name!r}: give exactly one of 'key' and 'sha256'")
        return self

    @property
    def digest(self) -> str:
        return self.sha256 or hashlib.sha256((self.key or "").encode()).hexdigest()


class KeysFile(CamelModel):
    keys: list[Key] = Field(default_factory=list)
    anonymous: Grant | None = None


class KeysError(ValueError):
    """A keys file that cannot be used; the message says where."""


class Denied(Exception):
    """A caller the bridge refuses (401 or 403), with the message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a call runs for, and at which priority."""

    key: str  # the key's name ("anonymous" without one)
    member: str
    tier: str
    priority: int
    requested: int  # what the header asked for, before the key's cap
    admin: bool = False  # the key's: it may call /unload


class KeyRing:
    def __init__(self, parsed: KeysFile, digest: str | None = None) -> None:
        self.use(parsed)
        self._digest = digest  # of the file the keys were read from: a change is one from this

    def use(self, parsed: KeysFile) -> None:
        """From now on, these keys (both fields at once: no call sees half of a change)."""
        self._by_digest, self._anonymous = {k.digest: k for k in parsed.keys}, parsed.anonymous

    def __len__(self) -> int:
        return len(self._by_digest)

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        text = _read(path)
        return cls(_parse(path, text), hashlib.sha256(text).hexdigest())

    async def follow(self, path: Path, interval: float = RELOAD_SECONDS) -> None:
        """Re-read ``path`` every ``interval`` seconds, until cancelled, and use its keys when it changed:
        a revoked key stops working without a restart (a mounted Secret's update lands within about a
        minute, then here). A file that cannot be used is logged and the keys in use stay."""
        while True:
            await asyncio.sleep(interval)
            try:
                text = path.read_bytes()
            except OSError:
                continue  # absent for a moment: a mounted Secret's files are swapped by symlink
            digest = hashlib.sha256(text).hexdigest()
            if digest == self._digest:
                continue
            self._digest = digest
            try:
                self.use(_parse(path, text))
            except KeysError as err:
                log.error("keys file not reloaded, the previous keys stay in use: %s", err)
                continue
            log.info("reloaded %s: %d keys", path, len(self))

    def identify(self, authorization: str | None, headers: Mapping[str, str]) -> Identity:
        """The caller's identity from ``Authorization: Bearer KEY`` and the X-LlamaSwap headers
        (``headers`` should be case-insensitive, as HTTP header names are)."""
        grant: Grant
        name = "anonymous"
        token = _bearer(authorization)
        if token is None:
            if self._anonymous is None:
                raise Denied(401, "an API key is required: send Authorization: Bearer <key>")
            grant = self._anonymous
        else:
            digest = hashlib.sha256(token.encode()).hexdigest()
            key = next((k for d, k in self._by_digest.items() if hmac.compare_digest(d, digest)), None)
            if key is None:
                raise Denied(401, "unknown API key")
            grant, name = key, key.name
        member, tier = grant.member, grant.tier
        for header, current in ((MEMBER_HEADER, member), (TIER_HEADER, tier)):
            value = headers.get(header)
            if value is not None and value != current and not grant.trusted:
                raise Denied(403, f"key {name!r} may not set {header}: only trusted keys speak for their users")
        if grant.trusted:
            member = _forwarded_member(name, grant, headers.get(MEMBER_HEADER))
            tier = headers.get(TIER_HEADER) or tier
            if tier not in grant.allowed_tiers():
                raise Denied(403, f"key {name!r} may give its users only tier {', '.join(grant.allowed_tiers())}, "
                                  f"not {tier[:63]!r} (its 'tiers' in the keys file)")  # fmt: skip
        requested = parse_priority(headers.get(PRIORITY_HEADER))
        return Identity(name, member, tier, min(requested, grant.max_priority), requested, grant.admin)


def _forwarded_member(name: str, grant: Grant, value: str | None) -> str:
    """A trusted key's user counts as ``<key's member>/<user>``: never as another key's member or a real
    user of the cluster, whatever name the application sends."""
    if not value or value == grant.member:
        return grant.member
    if len(value) > MEMBER_LIMIT // 2 or not value.isprintable():
        raise Denied(400, f"{MEMBER_HEADER} must be printable and at most {MEMBER_LIMIT // 2} characters")
    return f"{grant.member}/{value}"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise KeysError(f"{path}: {err.strerror}") from None


def _parse(path: Path, text: bytes) -> KeysFile:
    try:
        return KeysFile.model_validate(yaml.safe_load(text) or {})
    except yaml.YAMLError as err:
        raise KeysError(f"{path}: not YAML: {err}") from None
    except ValidationError as err:
        raise KeysError(f"{path}: {describe(err)}") from None


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
