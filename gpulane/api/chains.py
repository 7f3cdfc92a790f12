"""GpuChain: a film's shots, or any run of steps of one model, submitted one (or ``inFlight``) at a time as
ordinary GpuJobs that the operator creates (docs/chains.md). The state machine and the ETA are in
``gpulane/core/chains.py``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictInt, model_validator

from gpulane.api.resources import (
    CONDITIONS_FIELD,
    OBJECT_NAME,
    PRIORITY_MESSAGE,
    PRIORITY_RULE,
    TIME_FORMAT,
    UPSTREAM_MODEL_MESSAGE,
    Conditions,
    JobRequest,
    immutable,
    upstream_model_rule,
)
from gpulane.api.routes import job_route
from gpulane.api.run_limits import MAX_RUN_SECONDS
from gpulane.core.chains import render
from gpulane.core.policy import CamelModel

MAX_STEPS = 100_000
MAX_LISTED_STEPS = 1_000  # an object stays far below etcd's 1.5 MB: longer chains use count and template

# Labels of a step's job: its chain, its index and its attempt.
CHAIN_LABEL = "gpulane.io/chain"
STEP_LABEL = "gpulane.io/step"
ATTEMPT_LABEL = "gpulane.io/attempt"


class ChainOnFailure(CamelModel):
    retries: int = Field(default=0, ge=0, le=100)  # a failed step is created again this many times
    then: Literal["Fail", "Pause"] = "Fail"  # with none left: the chain fails, or waits for a change


STEPS_MESSAGE = "set exactly one of spec.steps and spec.count"
TEMPLATE_MESSAGE = "spec.template goes with spec.count"


class GpuChainSpec(CamelModel):
    model_config = CamelModel.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": [
            {"rule": "has(self.steps) != has(self.count)", "message": STEPS_MESSAGE},
            {"rule": "!has(self.template) || has(self.count)", "message": TEMPLATE_MESSAGE},
            {"rule": f"!has(self.steps) || self.steps.all(s, {upstream_model_rule('s')})",
             "message": UPSTREAM_MODEL_MESSAGE},
            {"rule": f"!has(self.template) || ({upstream_model_rule('self.template')})",
             "message": UPSTREAM_MODEL_MESSAGE},
        ]}
    }  # fmt: skip

    # What every step's job gets, as a GpuJob's fields of the same names.
    model: str = Field(min_length=1, max_length=253, pattern=OBJECT_NAME, json_schema_extra=immutable("model"))
    priority: StrictInt | str = Field(
        default=0,
        json_schema_extra={"x-kubernetes-validations": [
            *immutable("priority")["x-kubernetes-validations"],  # type: ignore[misc]
            {"rule": PRIORITY_RULE, "message": PRIORITY_MESSAGE},
        ]},
    )  # fmt: skip
    tier: str | None = Field(default=None, min_length=1, max_length=63, json_schema_extra=immutable("tier"))
    member: str | None = Field(default=None, min_length=1, max_length=253, json_schema_extra=immutable("member"))
    max_run_seconds: int | None = Field(default=None, ge=1, le=MAX_RUN_SECONDS)
    expected_run_seconds: int | None = Field(default=None, ge=0, le=MAX_RUN_SECONDS)
    # The steps: each its own request, or ``count`` of them, with an optional request template whose
    # strings may say {index} (from 0), {step} (from 1) and {total}. Without a template the steps are jobs
    # without a request, for an executor of the producer's own.
    steps: list[JobRequest] | None = Field(default=None, min_length=1, max_length=MAX_LISTED_STEPS)
    count: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    template: JobRequest | None = None
    in_flight: int = Field(default=1, ge=1, le=64)  # steps queued or running at once
    on_failure: ChainOnFailure = Field(default_factory=ChainOnFailure)
    suspend: bool = False  # no new steps while true; the ones in flight go on

    @model_validator(mode="after")
    def _steps_or_count(self) -> GpuChainSpec:
        if (self.steps is None) == (self.count is None):
            raise ValueError(STEPS_MESSAGE)
        if self.template is not None and self.count is None:
            raise ValueError(TEMPLATE_MESSAGE)
        for request in [*(self.steps or ()), *([self.template] if self.template else [])]:
            job_route(request.method, request.path, self.model)
        return self

    @property
    def total(self) -> int:
        return len(self.steps) if self.steps is not None else self.count or 0

    def request(self, index: int) -> dict[str, Any] | None:
        """Step ``index``'s request, as a GpuJob's spec.request (None: a step without one)."""
        if self.steps is not None:
            return self.steps[index].model_dump(by_alias=True, exclude_unset=True)
        if self.template is None:
            return None
        rendered = render(self.template.model_dump(by_alias=True, exclude_unset=True), index, self.total)
        assert isinstance(rendered, dict)
        return rendered


class ChainStep(CamelModel):
    """The earliest step not done: its job, and where that job is."""

    index: int = Field(ge=0)
    attempt: int = Field(ge=0)
    job: str
    phase: str | None = None
    position: int | None = None


class GpuChainStatus(CamelModel):
    phase: Literal["Running", "Succeeded", "Failed", "Paused", "Suspended"] | None = None
    progress: str | None = None  # "37/174": steps done of all
    total: int | None = None
    completed: int | None = None
    # The steps that succeeded, as ranges ("0-36,38"): never made again, whatever became of their jobs.
    succeeded_steps: str | None = Field(default=None, max_length=100_000)
    # The steps that failed with no attempt left, likewise: a failed chain stays failed when their jobs go.
    failed_steps: str | None = Field(default=None, max_length=100_000)
    failed: int | None = None
    retried: int | None = None
    current: ChainStep | None = None
    gpu_seconds: float | None = None  # the steps' run time so far
    estimated_completion: str | None = Field(default=None, json_schema_extra=TIME_FORMAT)
    message: str | None = None
    conditions: Conditions | None = CONDITIONS_FIELD
    observed_generation: int | None = None
