"""When an active job must end without its executor's word: past its run limit (its maxRunSeconds, or the
GpuPolicy's default, never above its ceiling), when the Lease of its executor expired (the executor died
with the job), or when it runs with no executor named at all. The tick checks every active job."""

from __future__ import annotations

from gpulane.api.contract import EXECUTOR_LEASE
from gpulane.operator.job_table import JobState, JobView
from gpulane.operator.observed import Observed


def overdue(view: JobView, now: float, observed: Observed) -> tuple[str, str] | None:
    """``(reason, message)`` if the job must fail now, else None."""
    limits = observed.run_limits
    ran = now - view.started_at if view.state == JobState.RUNNING and view.started_at is not None else None
    limit, where = limits.limit(view.max_run, view.namespace, view.job.member)
    if ran is not None and ran > limit:
        said = where if where == "maxRunSeconds" else f"the GpuPolicy's {where}"
        return "DeadlineExceeded", f"ran longer than {limit}s ({said})"
    grace = limits.executor_grace_seconds
    late = ran is not None and grace and ran > grace
    if view.executor_lease is None:
        if late:
            return "NoExecutor", (
                f"Running for {ran:.0f}s and no executor named its Lease ({EXECUTOR_LEASE}): nobody would "
                f"report its outcome (runLimits.executorGraceSeconds={grace})"
            )
        return None
    lease = "/".join(view.executor_lease)
    expiry = observed.leases.get(view.executor_lease)
    if expiry is None:  # a Lease never seen vouches for nothing: after the grace, as if none were named
        if late:
            return "NoExecutor", (
                f"Running for {ran:.0f}s and its executor's Lease {lease} does not exist: nobody would report its "
                f"outcome (runLimits.executorGraceSeconds={grace})"
            )
        return None
    if now > expiry:
        return "DataPlaneLost", f"its executor's Lease {lease} expired {now - expiry:.0f}s ago: the executor is gone"
    return None
