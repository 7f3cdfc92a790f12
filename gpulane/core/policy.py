"""The scoring policy: tier bonuses, affinity, aging and the band invariant it must keep."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gpulane.core.durations import MAX_SECONDS
from gpulane.core.priority import band_of, shown

# "Far larger": the band spacing must exceed the bounded offsets by this factor, so that
# tier and affinity can only ever break near-ties inside a band (100 vs 2 + 10 passes).
SPACING_FACTOR = 4

FairShare = Literal["usage", "turns"]
FAIR_SHARE_MODES: tuple[FairShare, ...] = ("usage", "turns")


class PolicyError(ValueError):
    """A policy that must not be accepted; the message states the numbers involved."""


class CamelModel(BaseModel):
    """Fields are snake_case in Python and camelCase in YAML/JSON, as Kubernetes resources are."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class PriorityBounds(CamelModel):
    min: int = -1000
    max: int = 1000

    @model_validator(mode="after")
    def _ordered(self) -> PriorityBounds:
        if self.min > self.max:
            raise PolicyError(
                f"priorityBounds.min ({shown(self.min)}) is greater than priorityBounds.max ({shown(self.max)})"
            )
        return self


MAX_WEIGHT = 1000.0
_WEIGHT_SCHEMA: dict[str, Any] = {
    "additionalProperties": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_WEIGHT},
    "maxProperties": 10_000,
}


class FairShareWeights(CamelModel):
    """Shares of GPU time under fair share by usage, 1 when not named: a team's (a namespace's) among the teams
    waiting in a band, then a member's among its team's members (or among all, for a member without a team)."""

    # The schema bounds each weight as the validator below does, so that the apiserver refuses it too.
    namespaces: dict[str, float] = Field(default_factory=dict, json_schema_extra=_WEIGHT_SCHEMA)
    members: dict[str, float] = Field(default_factory=dict, json_schema_extra=_WEIGHT_SCHEMA)

    @model_validator(mode="after")
    def _positive(self) -> FairShareWeights:
        for kind, weights in (("namespaces", self.namespaces), ("members", self.members)):
            for name, weight in weights.items():
                if isinstance(weight, bool) or not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
                    raise PolicyError(
                        f"fairShareWeights.{kind}[{name[:63]!r}] must be a number above 0 and at most "
                        f"{MAX_WEIGHT:g}, got {str(weight)[:40]}"
                    )
        return self

    def of(self, team: str | None, member: str) -> tuple[float, float]:
        """(the team's weight, the member's weight inside it); a member without a team is a team of its own."""
        own = self.members.get(member, 1.0)
        return (own, 1.0) if team is None else (self.namespaces.get(team, 1.0), own)


# A team's name, and the namespace part of a team's entry: what a namespace's name may be (a DNS label).
DNS_LABEL = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_DNS_LABEL = re.compile(DNS_LABEL)
_TEAMS_SCHEMA: dict[str, Any] = {  # the entries' form is the apiserver's to refuse too; names and repeats: below
    "additionalProperties": {
        "type": "array",
        "items": {"type": "string", "maxLength": 317, "pattern": DNS_LABEL[:-1] + "(/[^/]+)?$"},
        "maxItems": 1000,
    },
    "maxProperties": 1000,
}


def team_index(teams: dict[str, list[str]]) -> dict[str, str]:
    """``fairShareTeams`` as entry -> team: each entry a namespace (all of its jobs) or ``namespace/member`` (that
    member's jobs there and its users', ``member/user``). An entry in two teams, or one that names no namespace,
    is a PolicyError."""
    index: dict[str, str] = {}
    for team, entries in teams.items():
        if not _DNS_LABEL.match(team):
            raise PolicyError(f"fairShareTeams: {team[:70]!r} is not a team name: a namespace's name (a DNS label)")
        for entry in entries:
            namespace, _, member = entry.partition("/")
            if not _DNS_LABEL.match(namespace) or ("/" in entry and not member) or "/" in member:
                raise PolicyError(
                    f"fairShareTeams[{team!r}]: {entry[:70]!r} is neither a namespace nor namespace/member"
                )
            if entry in index and index[entry] != team:
                raise PolicyError(f"fairShareTeams: {entry!r} is in two teams, {index[entry]!r} and {team!r}")
            index[entry] = team
    return index


class Policy(CamelModel):
    tier_bonus: dict[str, int] = Field(default_factory=lambda: {"free": 0, "pro": 1, "max": 2})
    affinity_bonus: int = Field(default=10, ge=0)
    aging_divisor_seconds: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    band_spacing: int = Field(default=100, gt=0)
    priority_bounds: PriorityBounds = Field(default_factory=PriorityBounds)
    # How members of one band share the GPU: by decayed GPU seconds (usage) or by taking turns.
    fair_share: FairShare = "usage"
    fair_share_half_life_seconds: float = 3600.0
    # Under usage: a namespace's share among the namespaces of a band, a member's inside its namespace.
    fair_share_weights: FairShareWeights = Field(default_factory=FairShareWeights)
    # The tree's teams, when a namespace is not one: {research: [research, research-batch, gpulane-system/ui]}.
    # A team named after a namespace takes that namespace's jobs too, unless another team lists it.
    fair_share_teams: dict[str, list[str]] = Field(default_factory=dict, json_schema_extra=_TEAMS_SCHEMA)
    # Per band (keyed by the band's priority, e.g. 100), how long a job may wait before it expires.
    queue_timeout_seconds: dict[int, float] = Field(default_factory=dict)
    # The same per namespace (``Job.team``) and per member, over the band's: {team-a: {100: 300}}.
    namespace_queue_timeout_seconds: dict[str, dict[int, float]] = Field(default_factory=dict)
    member_queue_timeout_seconds: dict[str, dict[int, float]] = Field(default_factory=dict)
    # A load no job has started on gives way to a newly arrived job that outscores it past the offsets.
    load_yield: bool = False
    _teams: dict[str, str] = PrivateAttr(default_factory=dict)  # fairShareTeams by entry (``team_index``)

    @field_validator("fair_share", mode="before")
    @classmethod
    def _known_mode(cls, value: object) -> object:
        if value not in FAIR_SHARE_MODES:
            raise PolicyError(f"fairShare must be one of {', '.join(FAIR_SHARE_MODES)}, got {str(value)[:40]!r}")
        return value

    @field_validator("fair_share_half_life_seconds", mode="before")
    @classmethod
    def _half_life(cls, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= MAX_SECONDS:
            raise PolicyError(
                f"fairShareHalfLifeSeconds must be a number of seconds from 1 to {MAX_SECONDS:.0f} (10 years), "
                f"got {str(value)[:40]!r}"
            )
        return value

    @model_validator(mode="after")
    def _invariant(self) -> Policy:
        if not self.tier_bonus:
            raise PolicyError("tierBonus must name at least one tier")
        negative = {t: b for t, b in self.tier_bonus.items() if b < 0}
        if negative:
            listed = ", ".join(f"{t}: {shown(b)}" for t, b in negative.items())
            raise PolicyError(f"tier bonuses must be >= 0, got {listed}")
        largest = max(self.tier_bonus.values())
        offsets = largest + self.affinity_bonus
        needed = SPACING_FACTOR * offsets
        if self.band_spacing < needed or self.band_spacing <= offsets:
            raise PolicyError(
                f"bandSpacing {shown(self.band_spacing)} is too small: the largest tier bonus plus the affinity "
                f"bonus is {shown(largest)} + {shown(self.affinity_bonus)} = {shown(offsets)}, and the "
                f"spacing must be at least {SPACING_FACTOR}x that ({shown(needed)}) so that tier and affinity "
                f"never lift a job over a higher band"
            )
        weights = self.fair_share_weights
        if self.fair_share == "turns" and (weights.namespaces or weights.members):
            raise PolicyError("fairShareWeights share GPU time: they need fairShare: usage (members take turns now)")
        if self.fair_share == "turns" and self.fair_share_teams:
            raise PolicyError("fairShareTeams group GPU usage: they need fairShare: usage (members take turns now)")
        self._teams = team_index(self.fair_share_teams)
        self._check_timeouts("queueTimeoutSeconds", self.queue_timeout_seconds)
        for field, by_name in (
            ("namespaceQueueTimeoutSeconds", self.namespace_queue_timeout_seconds),
            ("memberQueueTimeoutSeconds", self.member_queue_timeout_seconds),
        ):
            for name, timeouts in by_name.items():
                self._check_timeouts(f"{field}[{name[:63]!r}]", timeouts)
        return self

    def _check_timeouts(self, field: str, timeouts: dict[int, float]) -> None:
        for band, seconds in timeouts.items():
            if band % self.band_spacing:
                raise PolicyError(
                    f"{field} key {shown(band)} is not a band: use the band's priority, a multiple of "
                    f"bandSpacing {shown(self.band_spacing)} (e.g. 100 for interactive)"
                )
            if not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
                raise PolicyError(
                    f"{field} for band {shown(band)} must be more than 0 seconds and at most 10 years, got {seconds}"
                )

    def fair_share_team(self, namespace: str | None, member: str) -> str | None:
        """The team a job counts in at the upper level of fair share: the one ``fairShareTeams`` gives its member
        (a trusted key's user, ``key/user``, by its key), else its namespace's, else the namespace itself."""
        if namespace is None or not self._teams:
            return namespace
        key = member.split("/", 1)[0]
        return self._teams.get(f"{namespace}/{key}") or self._teams.get(namespace) or namespace

    def queue_timeout(
        self, priority: int, own: float | None, team: str | None = None, member: str | None = None
    ) -> float | None:
        """The job's own timeout or its default, whichever is smaller (as llm-d's flow control). The default is
        its member's for its band, else its namespace's (``team``), else the band's."""
        band = self.band(priority) * self.band_spacing
        default = next(
            (
                timeouts[band]
                for timeouts in (
                    self.member_queue_timeout_seconds.get(member or "", {}),
                    self.namespace_queue_timeout_seconds.get(team or "", {}),
                    self.queue_timeout_seconds,
                )
                if band in timeouts
            ),
            None,
        )
        if own is None or default is None:
            return default if own is None else own
        return min(own, default)

    def bonus_for_tier(self, tier: str) -> int:
        try:
            return self.tier_bonus[tier]
        except KeyError:
            known = ", ".join(sorted(self.tier_bonus))
            raise PolicyError(f"unknown tier {tier!r}; this policy knows {known}") from None

    def band(self, priority: int) -> int:
        return band_of(priority, self.band_spacing)

    def check_priority(self, priority: object) -> int:
        """The priority if it is an int inside the policy's bounds; a PolicyError saying why otherwise."""
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise PolicyError(f"priority must be an integer, got {type(priority).__name__}")
        low, high = self.priority_bounds.min, self.priority_bounds.max
        if not low <= priority <= high:
            raise PolicyError(f"priority {shown(priority)} is outside this policy's bounds [{low}, {high}]")
        return priority
