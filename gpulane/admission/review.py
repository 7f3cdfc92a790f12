"""The admission decisions, as pure functions: what a GpuJob becomes on create, which changes are refused,
and whether a GpuPolicy may be stored. ``webhook.py`` only translates kopf's arguments to these.

Every refusal is a ``Refused`` with a sentence that names the caller, the value and the rule involved.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpulane.admission.rules import Caller, Grant, grant
from gpulane.api.admission import AdmissionPolicy
from gpulane.api.contract import AUTHOR, AUTHOR_GROUPS, FINALIZER, REQUESTED_PRIORITY
from gpulane.api.resources import GpuJobSpec, GpuPolicySpec, InvalidPolicy
from gpulane.api.run_limits import RunLimits
from gpulane.core.policy import Policy, PolicyError
from gpulane.core.priority import resolve_priority, shown
from gpulane.core.validation import describe

# Fields that decide a job's place in the queue: fixed once the job has been dispatched.
QUEUE_FIELDS = ("model", "priority", "tier", "member")
# What an executor's outcome may write on a Running job's status; every other field is the operator's.
OUTCOME_FIELDS = frozenset({"phase", "finishedAt", "reason", "message", "result"})
OUTCOME_PHASES = ("Succeeded", "Failed")
# What an OpenAI call in spec.request must carry, for the paths whose body gpulane knows. Which routes a
# request may use at all is the CRD's rule (api/routes.py).
REQUEST_FIELDS = {
    "/v1/chat/completions": "messages",
    "/v1/completions": "prompt",
    "/v1/embeddings": "input",
    "/v1/images/generations": "prompt",
    "/v1/audio/speech": "input",
}


class Refused(Exception):
    """An admission request that must be refused; the message is shown to the caller."""


@dataclass
class Mutation:
    spec: dict[str, Any] = field(default_factory=dict)  # spec fields to set
    annotations: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _priority(raw: object) -> int:
    try:
        return resolve_priority(raw)
    except ValueError as err:
        raise Refused(str(err)) from None


def _text(value: object) -> str:
    """A caller's value in a message: short, and never an exception of its own (huge ints)."""
    text = shown(value) if isinstance(value, int) and not isinstance(value, bool) else str(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _requested(raw: object) -> str:
    """The asked priority as the annotation records it: an integer the API can carry (int64) in full, as the
    apiserver's own policy writes it (admission/cel.py); anything else as ``_text`` shows it."""
    if isinstance(raw, int) and not isinstance(raw, bool) and -(2**63) <= raw < 2**63:
        return str(raw)
    return _text(raw)


def _over_cap(priority: int, caller: Caller, granted: Grant) -> str:
    return f"priority {priority} is above the cap {granted.cap} of user {caller.username} (rule: {granted.cap_rule})"


def mutate_job(
    spec: Mapping[str, Any], caller: Caller, admission: AdmissionPolicy, policy: Policy, limits: RunLimits | None = None
) -> Mutation:
    """On create: resolve the priority, cap it, set member and tier from the caller's identity, and give
    the job a run limit within the policy's (``RunLimits()`` when no GpuPolicy sets them)."""
    out = Mutation()
    _limit_run(spec, out, admission, limits or RunLimits())
    granted = grant(caller, admission, policy)
    raw = spec.get("priority", 0)
    priority = _priority(raw)
    if raw != priority:
        out.spec["priority"] = priority
    if priority > granted.cap:
        if admission.mode == "reject":
            raise Refused(_over_cap(priority, caller, granted))
        out.spec["priority"] = granted.cap
        out.annotations[REQUESTED_PRIORITY] = _requested(raw)
        out.warnings.append(
            f"priority {priority} capped to {granted.cap} for user {caller.username} (rule: {granted.cap_rule})"
        )
    if spec.get("member") is None:
        out.spec["member"] = own_member(caller, admission)
    if spec.get("tier") is None:
        out.spec["tier"] = granted.tier
    _check_identity({**spec, **out.spec}, caller, admission, granted)
    return out


def finalizers_on_create(finalizers: Sequence[str]) -> list[str] | None:
    """A new GpuJob's finalizers with the operator's added, or None if it has it already. Born with it, a job
    costs the operator no write to add it when it nears the head of the queue (the bridge creates its jobs so):
    one write fewer per job for an apiserver that holds them all."""
    return None if FINALIZER in finalizers else [*finalizers, FINALIZER]


def own_member(caller: Caller, admission: AdmissionPolicy) -> str:
    """The member a caller's jobs count against (the policy's ``defaultMember``)."""
    if admission.default_member == "namespace" and caller.namespace:
        return caller.namespace
    return caller.username


def _limit_run(spec: Mapping[str, Any], out: Mutation, admission: AdmissionPolicy, limits: RunLimits) -> None:
    run = spec.get("maxRunSeconds")
    if run is None:
        out.spec["maxRunSeconds"] = limits.default_seconds
    elif type(run) is int and run > limits.max_seconds:  # anything else is the schema's to refuse
        if admission.mode == "reject":
            raise Refused(_over_limit(run, limits))
        out.spec["maxRunSeconds"] = limits.max_seconds
        out.warnings.append(
            f"maxRunSeconds {run} capped to {limits.max_seconds} (the GpuPolicy's runLimits.maxSeconds)"
        )


def _over_limit(run: int, limits: RunLimits) -> str:
    return f"maxRunSeconds {run} is above the GpuPolicy's runLimits.maxSeconds {limits.max_seconds}"


def _check_identity(spec: Mapping[str, Any], caller: Caller, admission: AdmissionPolicy, granted: Grant) -> None:
    """Member and tier are the caller's own unless the caller is trusted. Checked by the mutating webhook
    and again by the validating one: a mutation that did not run (or another webhook's, after ours)
    must not let a job in as someone else or in a better tier."""
    if granted.trusted:
        return
    member, tier = spec.get("member"), spec.get("tier")
    if member is not None and member != own_member(caller, admission):
        raise Refused(
            f"user {caller.username} may not submit as member {_text(member)!r}: only identities in the "
            "policy's admission.trusted may set spec.member"
        )
    if tier is not None and tier != granted.tier:
        raise Refused(
            f"user {caller.username} may not choose tier {_text(tier)!r}: their tier is {granted.tier!r} "
            f"(rule: {granted.tier_rule}); only identities in the policy's admission.trusted may set spec.tier"
        )


def validate_job(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    caller: Caller,
    admission: AdmissionPolicy,
    policy: Policy,
    model_known: bool,
    limits: RunLimits | None = None,
) -> None:
    """On create and update: a well-formed spec, a known model and tier, a priority within the cap,
    and no change to the queue fields once dispatched or by callers not trusted to make it."""
    raw_spec = new.get("spec") or {}
    if old is not None and raw_spec == (old.get("spec") or {}):
        # The operator's finalizer patches, labels, annotations: nothing admission decides changed. Checking
        # them would let a policy change (a tier removed) block the removal of a finalizer.
        return
    try:
        spec = GpuJobSpec.model_validate(raw_spec)
    except ValidationError as err:
        raise Refused(describe(err, "spec")) from None
    granted = grant(caller, admission, policy)
    if old is None:
        if not model_known:
            raise Refused(f"no GpuModel named {spec.model!r}; create it first (kubectl get gpumodels)")
        priority = _priority(spec.priority)
        if priority > granted.cap:
            raise Refused(_over_cap(priority, caller, granted))
    if spec.tier is not None:
        try:
            policy.bonus_for_tier(spec.tier)
        except PolicyError as err:
            raise Refused(str(err)) from None
    if spec.request is not None:
        _check_request(spec.request.path, spec.request.body)
    run, limits = spec.max_run_seconds, limits or RunLimits()
    if (
        run is not None
        and run > limits.max_seconds
        and (old is None or run != _mapping(old.get("spec")).get("maxRunSeconds"))
    ):
        raise Refused(_over_limit(run, limits))
    if old is None:
        _check_identity(raw_spec, caller, admission, granted)
    else:
        old_spec = _mapping(old.get("spec"))
        if spec.priority != old_spec.get("priority") and _priority(spec.priority) > granted.cap:
            raise Refused(_over_cap(_priority(spec.priority), caller, granted))
        _check_update(raw_spec, old_spec, _mapping(old.get("status")), caller, granted.trusted)


def _check_request(path: str, body: Mapping[str, Any]) -> None:
    needed = REQUEST_FIELDS.get(path)
    if needed is None:  # routed (the CRD's rule and GpuJobSpec say so); its body is the server's to judge
        return
    value = body.get(needed)
    if value in (None, "", [], {}):
        raise Refused(f"spec.request.body must carry {needed!r} for {path}")
    if needed == "messages" and not (
        isinstance(value, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    ):
        raise Refused("spec.request.body.messages must be a list of objects, each with a 'role'")


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _check_update(
    spec: Mapping[str, Any], old_spec: Mapping[str, Any], old_status: Mapping[str, Any], caller: Caller, trusted: bool
) -> None:
    changed = [f for f in QUEUE_FIELDS if spec.get(f) != old_spec.get(f)]
    if not changed:
        return
    phase = old_status.get("phase")
    if phase not in (None, "Pending"):
        raise Refused(f"spec.{changed[0]} cannot change: the job is {_text(phase)}")
    personal = [f for f in changed if f in ("tier", "member")]
    if personal and not trusted:
        raise Refused(f"user {caller.username} may not change spec.{personal[0]}: only trusted identities may")


def validate_status(new: Mapping[str, Any], old: Mapping[str, Any], caller: Caller, operators: frozenset[str]) -> None:
    """A status write by anyone but the operator must be an executor's outcome (docs/job-lifecycle.md):
    a Running job turned Succeeded or Failed, touching only the outcome's fields. Lane, pod, endpoint and
    the dispatch are the operator's: a forged ``endpoint`` would send the executor's call anywhere."""
    if caller.username in operators:
        return
    before, after = _mapping(old.get("status")), _mapping(new.get("status"))
    if before == after:
        return
    phase = before.get("phase")
    if phase != "Running":
        raise Refused(
            f"user {caller.username} may not write the status of a {_text(phase or 'new')} job: "
            "only the operator does; an executor may only end a Running job"
        )
    if after.get("phase") not in OUTCOME_PHASES:
        raise Refused(
            f"user {caller.username} may not set status.phase {_text(after.get('phase'))!r}: an executor "
            f"ends a Running job with {' or '.join(OUTCOME_PHASES)}"
        )
    keys = before.keys() | after.keys()
    changed = sorted(k for k in keys if k not in OUTCOME_FIELDS and before.get(k) != after.get(k))
    if changed:
        fields = ", ".join(f"status.{k}" for k in changed)
        raise Refused(
            f"user {caller.username} may not change {fields}: only the operator does; an executor writes "
            f"{', '.join(sorted(OUTCOME_FIELDS))}"
        )


def author_annotations(caller: Caller) -> dict[str, str]:
    """What a GpuChain's create records of its author: the identity its steps are judged as (``judge_step``)."""
    return {AUTHOR: caller.username, AUTHOR_GROUPS: json.dumps(list(caller.groups), separators=(",", ":"))}


def author_of(meta: Mapping[str, Any]) -> Caller | None:
    """The author a GpuChain's annotations name, or None for a chain that admission never saw."""
    annotations = _mapping(meta.get("annotations"))
    user = annotations.get(AUTHOR)
    if not isinstance(user, str) or not user:
        return None
    try:
        groups = json.loads(str(annotations.get(AUTHOR_GROUPS) or "[]"))
    except ValueError:
        groups = []
    listed = tuple(str(g) for g in groups) if isinstance(groups, list) else ()
    return Caller(user, listed, meta.get("namespace"))


def check_author(new_meta: Mapping[str, Any], old_meta: Mapping[str, Any]) -> None:
    """A chain's author annotations never change: a user who could rewrite them would be judged as another."""
    new, old = _mapping(new_meta.get("annotations")), _mapping(old_meta.get("annotations"))
    for key in (AUTHOR, AUTHOR_GROUPS):
        if new.get(key) != old.get(key):
            raise Refused(f"metadata.annotations[{key}] cannot change: a chain's steps are judged as its author's")


def judge_step(
    spec: Mapping[str, Any], author: Caller, admission: AdmissionPolicy, policy: Policy
) -> tuple[dict[str, Any], list[str]]:
    """A chain's step as its author may submit it today: the priority capped by the rules in force, and, for an
    author who is not trusted (any more), the author's own tier and member. Returns the step's spec and a
    sentence per change. A chain is admitted once; its steps may come for days, after a rule is gone."""
    out, notes = dict(spec), []
    granted = grant(author, admission, policy)
    try:
        priority = resolve_priority(spec.get("priority", 0))
    except ValueError:
        priority = None  # the schema's to refuse; the core refuses it as the job's
    if priority is not None and priority > granted.cap:
        out["priority"] = granted.cap
        notes.append(f"priority {priority} capped to {granted.cap} for user {author.username} "
                     f"(rule: {granted.cap_rule})")  # fmt: skip
    if not granted.trusted:
        own = own_member(author, admission)
        for field, theirs, rule in (("tier", granted.tier, granted.tier_rule), ("member", own, None)):
            if spec.get(field) not in (None, theirs):
                out[field] = theirs
                why = f" (rule: {rule})" if rule else ""
                notes.append(f"{field} {_text(spec.get(field))!r} is not user {author.username}'s: {theirs!r}{why}")
    return out, notes


def validate_policy(spec: Mapping[str, Any]) -> GpuPolicySpec:
    """A GpuPolicy must satisfy the core's invariant and bounds, and its admission rules must fit them."""
    try:
        return GpuPolicySpec.checked(spec)
    except InvalidPolicy as err:
        raise Refused(str(err)) from None
