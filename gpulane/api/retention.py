"""How long a finished GpuJob stays: its ``spec.ttlSecondsAfterFinished``, else the GpuPolicy's default for
where it came from. A busy bridge creates thousands of jobs a day; kept forever they fill etcd."""

from __future__ import annotations

from pydantic import Field

from gpulane.core.policy import CamelModel

MAX_TTL_SECONDS = 366 * 86400


class Retention(CamelModel):
    """The GpuPolicy's ``ttlSecondsAfterFinished``: seconds after a job ended before the operator deletes it
    (its result ConfigMap goes with it), per source. Unset (null) keeps such jobs until someone deletes them."""

    # Calls through the bridge: their answer went to the caller already; the job is a record.
    bridge: int | None = Field(default=3600, ge=0, le=MAX_TTL_SECONDS)
    # Jobs created otherwise (kubectl, a pipeline): their result ConfigMap is the answer, read later.
    kubectl: int | None = Field(default=7 * 86400, ge=0, le=MAX_TTL_SECONDS)

    def seconds(self, own: int | None, from_bridge: bool) -> int | None:
        if own is not None:
            return own
        return self.bridge if from_bridge else self.kubectl
