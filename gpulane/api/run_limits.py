"""How long a job may hold the GPU: the GpuPolicy's ``runLimits``. The webhook fills in and caps
``spec.maxRunSeconds`` with them; the operator enforces them on every job, including jobs created where
no webhook runs, and fails Running jobs that no executor vouches for."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictInt, model_validator

from gpulane.core.policy import CamelModel, PolicyError

# The longest spec.maxRunSeconds the schema accepts: a week. Longer than any GPU job should run: a typo.
MAX_RUN_SECONDS = 7 * 86400


_CEILINGS_SCHEMA: dict[str, Any] = {
    "additionalProperties": {"type": "integer", "minimum": 1, "maximum": MAX_RUN_SECONDS},
    "maxProperties": 10_000,
}


class RunLimits(CamelModel):
    # The maxRunSeconds of a job that sets none: without one, a batch job could hold a lane forever.
    default_seconds: int = Field(default=3600, ge=1, le=MAX_RUN_SECONDS)
    # No job runs longer, whatever its spec says.
    max_seconds: int = Field(default=86400, ge=1, le=MAX_RUN_SECONDS)
    # A Running job that names no executor Lease (annotation gpulane.io/executor-lease) fails with
    # NoExecutor this long after it started: nobody would report its outcome. 0 turns this off.
    executor_grace_seconds: int = Field(default=300, ge=0, le=MAX_RUN_SECONDS)
    # Lower ceilings for some namespaces and members (``spec.member``, in any namespace): {render-farm: 600}.
    namespace_max_seconds: dict[str, StrictInt] = Field(default_factory=dict, json_schema_extra=_CEILINGS_SCHEMA)
    member_max_seconds: dict[str, StrictInt] = Field(default_factory=dict, json_schema_extra=_CEILINGS_SCHEMA)

    @model_validator(mode="after")
    def _default_within_max(self) -> RunLimits:
        if self.default_seconds > self.max_seconds:
            raise PolicyError(
                f"runLimits.defaultSeconds {self.default_seconds} is above runLimits.maxSeconds {self.max_seconds}"
            )
        for field, ceilings in (("namespaceMaxSeconds", self.namespace_max_seconds),
                                ("memberMaxSeconds", self.member_max_seconds)):  # fmt: skip
            for name, seconds in ceilings.items():
                if not 1 <= seconds <= MAX_RUN_SECONDS:
                    raise PolicyError(f"runLimits.{field}[{name[:63]!r}] must be 1 to {MAX_RUN_SECONDS} seconds, got "
                                      f"{str(seconds)[:40]}")  # fmt: skip
        return self

    def ceiling(self, namespace: str, member: str) -> tuple[int, str]:
        """The longest any job of ``member`` in ``namespace`` runs, and the field that sets it."""
        none = MAX_RUN_SECONDS + 1
        return min(
            (self.max_seconds, "runLimits.maxSeconds"),
            (self.namespace_max_seconds.get(namespace, none), f"runLimits.namespaceMaxSeconds[{namespace}]"),
            (self.member_max_seconds.get(member, none), f"runLimits.memberMaxSeconds[{member}]"),
            key=lambda limit: limit[0],
        )

    def limit(self, max_run_seconds: int | None, namespace: str = "", member: str = "") -> tuple[int, str]:
        """The run time a job gets: its own maxRunSeconds, or the default, never above its ceiling; and the
        field that set it."""
        own = (self.default_seconds, "runLimits.defaultSeconds") if max_run_seconds is None else \
            (max_run_seconds, "maxRunSeconds")  # fmt: skip
        return min(own, self.ceiling(namespace, member), key=lambda limit: limit[0])
