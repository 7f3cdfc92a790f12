"""When an active job must end without its executor's word: past its maxRunSeconds, or when the Lease of
its executor expired (the executor died with the job). The tick checks every active job against these."""

from __future__ import annotations

from collections.abc import Mapping

from gpulane.operator.jobs import JobState, JobView


def overdue(view: JobView, now: float, leases: Mapping[tuple[str, str], float]) -> tuple[str, str] | None:
    """``(reason, message)`` if the job must fail now, else None."""
    started, limit = view.started_at, view.max_run
    if view.state == JobState.RUNNING and started is not None and limit is not None and now - started > limit:
        return "DeadlineExceeded", f"ran longer than maxRunSeconds={limit}"
    expiry = None if view.executor_lease is None else leases.get(view.executor_lease)
    if expiry is not None and now > expiry:
        lease = "/".join(view.executor_lease or ())
        return "DataPlaneLost", f"its executor's Lease {lease} expired {now - expiry:.0f}s ago: the executor is gone"
    return None
