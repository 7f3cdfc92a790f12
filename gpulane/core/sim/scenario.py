"""The scenario file of ``gpulane simulate``: models, job streams and one-off jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BeforeValidator, Field, ValidationError, model_validator

from gpulane.core.durations import parse_duration
from gpulane.core.policy import CamelModel, Policy
from gpulane.core.priority import resolve_priority
from gpulane.core.sim.llamaswap import LlamaSwapConfig
from gpulane.core.validation import describe

Seconds = Annotated[float, BeforeValidator(parse_duration)]
Priority = Annotated[int, BeforeValidator(resolve_priority)]


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; the message names the file and the field."""


class Range(CamelModel):
    min: Seconds
    max: Seconds

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self


class ModelDecl(CamelModel):
    name: str = Field(min_length=1)
    load_seconds: Seconds = 0.0  # in a new pod
    max_concurrency: int = Field(default=1, ge=1)
    # A server that holds it beside its other models (llama-server's router mode, llama-swap's groups);
    # its load into the running server takes switchSeconds (else loadSeconds) and no new pod.
    server: str | None = Field(default=None, min_length=1)
    memory_mib: int = Field(default=0, ge=0)
    switch_seconds: Seconds | None = None


class DefaultModel(CamelModel):
    load_seconds: Seconds = 30.0
    max_concurrency: int = Field(default=1, ge=1)


class Arrival(CamelModel):
    every_seconds: Seconds | None = Field(default=None, gt=0)
    poisson_per_hour: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one(self) -> Arrival:
        if (self.every_seconds is None) == (self.poisson_per_hour is None):
            raise ValueError("arrival needs exactly one of everySeconds or poissonPerHour")
        return self


Name = Annotated[str, Field(min_length=1, max_length=253)]


class Stream(CamelModel):
    name: str = Field(min_length=1)
    member: Name | None = None
    members: list[Name] | None = Field(default=None, min_length=1)
    team: Name | None = None  # its members' team under fair share (the operator: their namespace)
    tier: str = "free"
    priority: Priority = 0
    model: str = Field(min_length=1)
    run_seconds: Seconds | Range
    submit: Literal["chain", "burst"] | None = None
    count: int | None = Field(default=None, ge=1, le=1_000_000)
    at: Seconds = 0.0
    arrival: Arrival | None = None
    from_: Seconds = Field(default=0.0, alias="from")
    until: Seconds | None = None
    queue_timeout_seconds: Seconds | None = Field(default=None, gt=0)  # callers give up after this

    @model_validator(mode="after")
    def _shape(self) -> Stream:
        if (self.member is None) == (self.members is None):
            raise ValueError("a stream needs exactly one of member or members")
        if (self.submit is None) == (self.arrival is None):
            raise ValueError("a stream needs exactly one of submit (chain or burst) or arrival")
        if self.submit is not None and self.count is None:
            raise ValueError(f"submit: {self.submit} needs a count")
        if self.arrival is not None and self.until is None and self.count is None:
            raise ValueError("an arrival stream needs until or count, or it never ends")
        if self.until is not None and self.until <= self.from_:
            raise ValueError(f"until ({self.until:g}s) must be after from ({self.from_:g}s)")
        return self

    def member_at(self, index: int) -> str:
        if self.member is not None:
            return self.member
        assert self.members is not None
        return self.members[index % len(self.members)]


class OneJob(CamelModel):
    name: str = Field(min_length=1)
    at: Seconds = 0.0
    member: Name = "anonymous"
    team: Name | None = None
    tier: str = "free"
    priority: Priority = 0
    model: str = Field(min_length=1)
    run_seconds: Seconds
    queue_timeout_seconds: Seconds | None = Field(default=None, gt=0)


class Scenario(CamelModel):
    name: str = Field(min_length=1)
    seed: int = 0
    policy: Policy = Field(default_factory=Policy)
    lanes: int = Field(default=1, ge=1, le=64)
    lane_memory_mib: int | None = Field(default=None, ge=1)  # what a lane's server may hold at once
    models: list[ModelDecl] = Field(default_factory=list)
    default_model: DefaultModel = Field(default_factory=DefaultModel)
    initial_model: str | None = None
    streams: list[Stream] = Field(default_factory=list)
    jobs: list[OneJob] = Field(default_factory=list)
    llama_swap: LlamaSwapConfig = Field(default_factory=LlamaSwapConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        names = [s.name for s in self.streams] + [j.name for j in self.jobs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"stream and job names must be unique, repeated: {', '.join(duplicates)}")
        tiers = {s.tier for s in self.streams} | {j.tier for j in self.jobs}
        unknown = sorted(tiers - set(self.policy.tier_bonus))
        if unknown:
            raise ValueError(
                f"unknown tier(s) {', '.join(unknown)}; the policy knows {', '.join(sorted(self.policy.tier_bonus))}"
            )
        if not names:
            raise ValueError("a scenario needs at least one stream or job")
        models = [m.name for m in self.models]
        repeated = sorted({m for m in models if models.count(m) > 1})
        if repeated:
            raise ValueError(f"model names must be unique, repeated: {', '.join(repeated)}")
        items: list[Stream | OneJob] = [*self.streams, *self.jobs]
        for item in items:
            try:
                self.policy.check_priority(item.priority)
            except ValueError as err:
                raise ValueError(f"{item.name}: {err}") from None
        return self

    def without_servers(self) -> Scenario:
        """The same day on today's lanes: every model in a pod of its own, replaced on each swap."""
        models = [m.model_copy(update={"server": None}) for m in self.models]
        return self.model_copy(update={"models": models, "lane_memory_mib": None})

    def warnings(self) -> list[str]:
        """Legal but suspicious: models used without a declaration, or capped but never used (typos)."""
        declared = {m.name for m in self.models}
        requested = {s.model for s in self.streams} | {j.model for j in self.jobs}
        used = requested | ({self.initial_model} if self.initial_model is not None else set())
        undeclared = [
            f"model {name!r} is not declared under models; it loads in "
            f"{self.default_model.load_seconds:g}s (defaultModel)"
            for name in sorted(used - declared)
        ]
        uncapped = [
            f"llamaSwap.models names {name!r}, which no stream or job requests; its limit has no effect"
            for name in sorted(set(self.llama_swap.models) - requested)
        ]
        return undeclared + uncapped


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ScenarioError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario is a mapping with name, models, streams and jobs")
    try:
        return Scenario.model_validate(raw)
    except ValidationError as err:
        raise ScenarioError(f"{path}: {describe(err)}") from err
