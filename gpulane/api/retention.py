"""How long a finished GpuJob stays: its ``spec.ttlSecondsAfterFinished``, else the GpuPolicy's default for
where it came from. A busy bridge creates thousands of jobs a day; kept forever they fill etcd."""

from __future__ import annotations

from pydantic import Field

from gpulane.core.policy import CamelModel

MAX_TTL_SECONDS = 366 * 86400


# "Keep them": not null, which a merge patch (kubectl apply, helm upgrade) takes as "delete the field", after
# which the apiserver puts the default back; a value survives every kind of write.
KEEP = -1


class Retention(CamelModel):
    """The GpuPolicy's ``ttlSecondsAfterFinished``: seconds after a job ended before the operator deletes it
    (its result ConfigMap goes with it), per source; ``-1`` keeps such jobs until someone deletes them."""

    # Calls through the bridge: their answer went to the caller already; the job is a record.
    bridge: int = Field(default=3600, ge=KEEP, le=MAX_TTL_SECONDS)
    # Jobs created otherwise (kubectl, a pipeline): their result ConfigMap is the answer, read later.
    kubectl: int = Field(default=7 * 86400, ge=KEEP, le=MAX_TTL_SECONDS)

    def seconds(self, own: int | None, from_bridge: bool) -> int | None:
        """Seconds until the job goes, or None when it stays."""
        if own is not None:
            return own
        seconds = self.bridge if from_bridge else self.kubectl
        return None if seconds == KEEP else seconds
