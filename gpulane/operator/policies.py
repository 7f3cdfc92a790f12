"""The GpuPolicy in effect. The operator checks a policy as the webhook does (for clusters that run none),
and reports on the policy's ``Accepted`` condition whether it took effect or why the previous one stays."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from gpulane.api.admission import AdmissionPolicy
from gpulane.api.conditions import condition, merge_condition
from gpulane.api.contract import Body
from gpulane.api.resources import GpuPolicySpec, GpuPolicyStatus, InvalidPolicy
from gpulane.api.retention import Retention
from gpulane.api.run_limits import RunLimits
from gpulane.core.policy import Policy
from gpulane.operator.job_writes import JobWrites
from gpulane.operator.observed import Observed

log = logging.getLogger(__name__)


class Host(Protocol):
    clock: Callable[[], float]
    writes: JobWrites
    observed: Observed

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    def use_policy(self, policy: Policy) -> None: ...


def policy_event(host: Host, kind: str | None, body: Body) -> None:
    meta = body["metadata"]
    if kind == "DELETED":
        host.use_policy(Policy())
        host.observed.run_limits, host.observed.pending_cap, host.observed.member_pending_cap = RunLimits(), None, None
        host.observed.retention, host.observed.admission = Retention(), AdmissionPolicy()
        host.observed.policy_generation = None
        return
    generation = meta.get("generation")
    if generation == host.observed.policy_generation:
        return
    now = host.clock()
    try:
        parsed = GpuPolicySpec.checked(body.get("spec") or {})
    except InvalidPolicy as err:
        log.error("GpuPolicy %s refused: %s", meta["name"], err)
        message = f"{err}; the previous policy stays in effect"
        cond = condition("Accepted", False, "InvalidPolicy", message, now, generation)
    else:
        host.use_policy(parsed.scoring())
        host.observed.run_limits = parsed.run_limits
        host.observed.pending_cap = parsed.admission.max_pending_per_namespace
        host.observed.member_pending_cap = parsed.admission.max_pending_per_member
        host.observed.admission = parsed.admission
        host.observed.retention = parsed.ttl_seconds_after_finished
        cond = condition("Accepted", True, "Valid", "the policy is in effect", now, generation)
    host.observed.policy_generation = generation
    conditions = merge_condition((body.get("status") or {}).get("conditions"), cond)
    fields = {"conditions": conditions, "observedGeneration": generation}
    status = GpuPolicyStatus.model_validate(fields).model_dump(mode="json", by_alias=True, exclude_unset=True)
    host.spawn(host.writes.cluster_status("gpupolicies", meta["name"], status))
