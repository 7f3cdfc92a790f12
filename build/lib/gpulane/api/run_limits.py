"""How long a job may hold the GPU: the GpuPolicy's ``runLimits``. The webhook fills in and caps
``spec.maxRunSeconds`` with them; the operator enforces them on every job, including jobs created where
no webhook runs, and fails Running jobs that no executor vouches for."""

from __future__ import annotations

from pydantic import Field, model_validator

from gpulane.core.policy import CamelModel, PolicyError

# The longest spec.maxRunSeconds the schema accepts: a week. Longer than any GPU job should run: a typo.
MAX_RUN_SECONDS = 7 * 86400


class RunLimits(CamelModel):
    # The maxRunSeconds of a job that sets none: without one, a batch job could hold a lane forever.
    default_seconds: int = Field(default=3600, ge=1, le=MAX_RUN_SECONDS)
    # No job runs longer, whatever its spec says.
    max_seconds: int = Field(default=86400, ge=1, le=MAX_RUN_SECONDS)
    # A Running job that names no executor Lease (annotation gpulane.io/executor-lease) fails with
    # NoExecutor this long after it started: nobody would report its outcome. 0 turns this off.
    executor_grace_seconds: int = Field(default=300, ge=0, le=MAX_RUN_SECONDS)

    @model_validator(mode="after")
    def _default_within_max(self) -> RunLimits:
        if self.default_seconds > self.max_seconds:
            raise PolicyError(
                f"runLimits.defaultSeconds {self.default_seconds} is above runLimits.maxSeconds {self.max_seconds}"
            )
        return self

    def limit(self, max_run_seconds: int | None) -> int:
        """The run time a job gets: its own maxRunSeconds, or the default, and never above the ceiling."""
        return min(self.default_seconds if max_run_seconds is None else max_run_seconds, self.max_seconds)
