"""What the core knows about a job and a model: plain values, no Kubernetes types."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    model: str
    priority: int = 0
    tier: str = "free"
    member: str = "anonymous"
    submitted_at: float = 0.0
    # Overrides the model's learned run time in forecasts when the submitter knows better.
    expected_run_seconds: float | None = None
    # How long its caller waits for it to start; the policy's band default may be smaller.
    queue_timeout_seconds: float | None = None
    # The team its member belongs to under fair share (the operator: the job's namespace); None: a team of one.
    team: str | None = None
    # Who fair share counts its usage for: its member inside its team (``team/member``; a user's jobs in two
    # namespaces are two members, as in Slurm's associations), or the member alone without a team. Derived once
    # (the ranking reads it at every step) and interned, so that a member's jobs share one string.
    account: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        account = self.member if self.team is None else sys.intern(f"{self.team}/{self.member}")
        object.__setattr__(self, "account", account)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    max_concurrency: int = 1
    load_seconds: float = 60.0
    run_seconds: float = 60.0
    # A lane idle this long with the model loaded gives it up (llama-swap's ttl); None keeps it loaded.
    ttl_seconds: float | None = None
    # The only lanes that may serve it (its GpuModel's laneSelector); None: any lane.
    lanes: frozenset[str] | None = None
    # The server that can hold it beside the other models of the same server and switch between them without a
    # new pod (llama-server's router mode); None: a pod of its own, replaced on every swap.
    server: str | None = None
    # The GPU memory it takes when loaded, for models that stay loaded together on a lane that states its own.
    memory_mib: int = 0
    # Loading it into a running server (a switch, no new pod); None: as long as ``load_seconds``.
    switch_seconds: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_concurrency, bool) or not isinstance(self.max_concurrency, int):
            raise ValueError(f"model {self.name!r}: maxConcurrency must be an integer, got {self.max_concurrency!r}")
        if self.max_concurrency < 1:
            raise ValueError(f"model {self.name!r}: maxConcurrency must be >= 1, got {self.max_concurrency}")
        if self.memory_mib < 0:
            raise ValueError(f"model {self.name!r}: memory must be >= 0 MiB, got {self.memory_mib}")
        switch = self.load_seconds if self.switch_seconds is None else self.switch_seconds
        for what, value in (("load", self.load_seconds), ("run", self.run_seconds), ("switch", switch)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"model {self.name!r}: {what} seconds must be a finite number >= 0, got {value}")
        if self.ttl_seconds is not None and not (math.isfinite(self.ttl_seconds) and self.ttl_seconds > 0):
            raise ValueError(f"model {self.name!r}: ttl seconds must be a finite number > 0, got {self.ttl_seconds}")


class ModelCatalog:
    """Model specs plus learned load and run times (an exponential moving average)."""

    SMOOTHING = 0.2

    def __init__(self, specs: Iterable[ModelSpec] = (), default: ModelSpec | None = None) -> None:
        self._specs = {s.name: s for s in specs}
        self._default = default or ModelSpec("*")
        self._pinned = {s.name: s.lanes for s in self._specs.values() if s.lanes is not None}

    def get(self, name: str) -> ModelSpec:
        spec = self._specs.get(name)
        return spec if spec is not None else replace(self._default, name=name)

    def update(self, spec: ModelSpec) -> None:
        self._specs[spec.name] = spec
        if spec.lanes is None:
            self._pinned.pop(spec.name, None)
        else:
            self._pinned[spec.name] = spec.lanes

    def excluded_on(self, lane: str) -> frozenset[str]:
        """The models that ``lane`` may not serve: those pinned to other lanes."""
        return frozenset(name for name, lanes in self._pinned.items() if lane not in lanes)

    def concurrency(self, name: str | None) -> int:
        return 1 if name is None else self.get(name).max_concurrency

    def observe_load(self, name: str, seconds: float) -> None:
        spec = self.get(name)
        self._specs[name] = replace(spec, load_seconds=self._blend(spec.load_seconds, seconds))

    def observe_switch(self, name: str, seconds: float) -> None:
        """A load by the lane's running server. The first one is taken as it is: a new pod's load time (or the
        default's minute) says little of it."""
        spec = self.get(name)
        learned = max(0.0, seconds) if spec.switch_seconds is None else self._blend(spec.switch_seconds, seconds)
        self._specs[name] = replace(spec, switch_seconds=learned)

    def switch_share(self, name: str) -> float:
        """What a switch into a running server saves against a new pod, as a share of the new pod's cost."""
        spec = self.get(name)
        if spec.switch_seconds is None or spec.load_seconds <= 0:
            return 0.0
        return max(0.0, 1.0 - spec.switch_seconds / spec.load_seconds)

    def of_server(self, server: str) -> list[ModelSpec]:
        return [spec for spec in self._specs.values() if spec.server == server]

    def observe_run(self, name: str, seconds: float) -> None:
        spec = self.get(name)
        self._specs[name] = replace(spec, run_seconds=self._blend(spec.run_seconds, seconds))

    def expected_run(self, job: Job) -> float:
        if job.expected_run_seconds is not None:
            return job.expected_run_seconds
        return self.get(job.model).run_seconds

    def copy(self) -> ModelCatalog:
        return ModelCatalog(self._specs.values(), self._default)

    def _blend(self, old: float, observed: float) -> float:
        return old + self.SMOOTHING * (max(0.0, observed) - old)
