"""The GpuPolicy in effect. The operator checks a policy as the webhook does (for clusters that run none),
and reports on the policy's ``Accepted`` condition whether it took effect or why the previous one stays."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from gpulane.api.admission import AdmissionPolicy
from gpulane.api.conditions import condition, merge_condition
from gpulane.api.contract import Body
from gpulane.api.resources import GpuPolicySpec, GpuPolicyStatus, InvalidPolicy
from gpulane.api.retention import Retention
from gpulane.api.run_limits import RunLimits
from gpulane.core.policy import Policy
from gpulane.operator.observed import Observed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ports:
    """What the room reads and the effects it asks for; the controller builds it once."""

    clock: Callable[[], float]
    observed: Observed  # written here: the limits, caps, retention and admission rules in effect
    use_policy: Callable[[Policy], None]  # the core ranks by the new policy
    write_status: Callable[[str, Body], Coroutine[Any, Any, None]]  # a policy's status, by name
    spawn: Callable[[Coroutine[Any, Any, Any]], None]


def policy_event(ports: Ports, kind: str | None, body: Body) -> None:
    meta = body["metadata"]
    if kind == "DELETED":
        ports.use_policy(Policy())
        observed = ports.observed
        observed.run_limits, observed.pending_cap, observed.member_pending_cap = RunLimits(), None, None
        observed.retention, observed.admission, observed.policy_generation = Retention(), AdmissionPolicy(), None
        return
    generation = meta.get("generation")
    if generation == ports.observed.policy_generation:
        return
    now = ports.clock()
    try:
        parsed = GpuPolicySpec.checked(body.get("spec") or {})
    except InvalidPolicy as err:
        log.error("GpuPolicy %s refused: %s", meta["name"], err)
        message = f"{err}; the previous policy stays in effect"
        cond = condition("Accepted", False, "InvalidPolicy", message, now, generation)
    else:
        ports.use_policy(parsed.scoring())
        ports.observed.run_limits = parsed.run_limits
        ports.observed.pending_cap = parsed.admission.max_pending_per_namespace
        ports.observed.member_pending_cap = parsed.admission.max_pending_per_member
        ports.observed.admission = parsed.admission
        ports.observed.retention = parsed.ttl_seconds_after_finished
        cond = condition("Accepted", True, "Valid", "the policy is in effect", now, generation)
    ports.observed.policy_generation = generation
    conditions = merge_condition((body.get("status") or {}).get("conditions"), cond)
    fields = {"conditions": conditions, "observedGeneration": generation}
    status = GpuPolicyStatus.model_validate(fields).model_dump(mode="json", by_alias=True, exclude_unset=True)
    ports.spawn(ports.write_status(meta["name"], status))
