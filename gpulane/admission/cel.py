"""The admission rules as CEL, applied by the apiserver itself: a MutatingAdmissionPolicy and two
ValidatingAdmissionPolicies that do what the webhook's ``review.mutate_job``, ``validate_job`` and
``validate_status`` do, wherever CEL can (the chart's ``admission.mode: policy``; docs/admission.md says
what only the webhook does, and who covers it instead).

One source of truth: every field name comes from the pydantic models (``AdmissionPolicy``, ``Rule``,
``Subjects``, ``RunLimits``, ``GpuJobSpec``, ``GpuJobStatus``), the aliases from ``core.priority``, the
request shapes and outcome fields from ``review``, the annotation from ``api.contract``. ``python -m
gpulane.admission.cel --check`` fails when the committed manifests differ from what this module writes, as
the CRDs' drift check does; tests/e2e/test_admission_policies.py sends random callers and GpuPolicies
through both modes and requires the same stored job, or a refusal from both.

The rules take GpuPolicy ``default`` as their parameter; its CRD defaults every field they read. Without
it every GpuJob create is refused (``parameterNotFoundAction: Deny``): caps never silently lapse.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from gpulane.admission.configuration import ADMITTED, AUTHOR_CHANGED, STATUS_CHANGED
from gpulane.admission.review import OUTCOME_FIELDS, OUTCOME_PHASES, QUEUE_FIELDS, REQUEST_FIELDS
from gpulane.admission.rules import SERVICE_ACCOUNT_PREFIX
from gpulane.api import generated
from gpulane.api.admission import AdmissionPolicy, Rule, Subjects
from gpulane.api.chains import CHAIN_LABEL
from gpulane.api.contract import AUTHOR, AUTHOR_GROUPS, FINALIZER, REQUESTED_PRIORITY
from gpulane.api.resources import GROUP, VERSION, GpuJobSpec, GpuJobStatus, GpuPolicySpec
from gpulane.api.run_limits import RunLimits
from gpulane.core.durations import MAX_SECONDS
from gpulane.core.policy import DNS_LABEL, SPACING_FACTOR
from gpulane.core.priority import ALIASES, SATURATION

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "admission-policies.yaml"
CHART_FILE = REPO / "charts" / "gpulane" / "files" / "admission-policies.yaml"
NAME = "gpulane"
POLICY = "default"  # the GpuPolicy every rule reads
# The chart's ServiceAccount of the operator, as `kubectl apply -f deploy/` users get it by default.
DEFAULT_OPERATOR = "system:serviceaccount:gpulane-system:gpulane-operator"
SHORTENED = 64  # review._shortened: a caller's text longer than this is cut, with "..."
SATURATED_DIGITS = len(str(SATURATION)) - 1  # more significant digits than this saturate (priority.py)


def _f(model: type[BaseModel], field: str) -> str:
    """A model field's name as the CRD spells it (KeyError for a field the model does not have)."""
    info = model.model_fields[field]
    return info.alias or field


def _lit(value: Any) -> str:
    """A Python value as a CEL literal: JSON's strings, numbers, lists and maps are CEL's too."""
    return json.dumps(value)


SPEC = "object.spec"
ADMISSION = f"params.spec.{_f(GpuPolicySpec, 'admission')}"
LIMITS = f"params.spec.{_f(GpuPolicySpec, 'run_limits')}"
PRIORITY, MEMBER, TIER, RUN = (f"{SPEC}.{_f(GpuJobSpec, f)}" for f in ("priority", "member", "tier", "max_run_seconds"))
OLD_RUN = f"oldObject.spec.{_f(GpuJobSpec, 'max_run_seconds')}"


def _matches(subjects: str) -> str:
    """rules.Caller.matches: the user, any of its groups, its ServiceAccount or its namespace is named."""
    users, groups, accounts, namespaces = (
        f"{subjects}.{_f(Subjects, f)}" for f in ("users", "groups", "service_accounts", "namespaces")
    )
    return (
        f"(variables.user in {users} || {groups}.exists(g, g in variables.groups)"
        f" || (variables.sa != '' && variables.sa in {accounts})"
        f" || (variables.ns != '' && variables.ns in {namespaces}))"
    )


def _bonus(tier: str) -> str:
    """A tier's bonus; an unknown tier ranks below every known one (rules.grant)."""
    return f"({tier} in variables.tierBonus ? variables.tierBonus[{tier}] : -1)"


def _shortened(text: str) -> str:
    return f"(size({text}) <= {SHORTENED} ? {text} : {text}.substring(0, {SHORTENED - 3}) + '...')"


RULE_TIER, RULE_NAME, RULE_CAP = (_f(Rule, f) for f in ("tier", "name", "max_priority"))
ALIAS_MAP = _lit(ALIASES)
REST = "variables.saRest"

# What the caller is granted (rules.grant and review.own_member), then the job's priority parsed as
# core.priority.resolve_priority does it (aliases, signed decimal text, saturation), ``valid`` or not.
VARIABLES: list[tuple[str, str]] = [
    ("user", "request.userInfo.username"),
    ("groups", "has(request.userInfo.groups) ? request.userInfo.groups : []"),
    ("ns", "has(request.namespace) ? request.namespace : ''"),
    (
        "saRest",
        f"variables.user.startsWith({_lit(SERVICE_ACCOUNT_PREFIX)})"
        f" ? variables.user.substring({len(SERVICE_ACCOUNT_PREFIX)}) : ''",
    ),
    # rules.Caller.service_account: "ns/name" for system:serviceaccount:ns:name, else none ('').
    (
        "sa",
        f"{REST}.indexOf(':') >= 0 && {REST}.indexOf(':') < size({REST}) - 1"
        f" ? {REST}.substring(0, {REST}.indexOf(':')) + '/' + {REST}.substring({REST}.indexOf(':') + 1) : ''",
    ),
    ("matching", f"{ADMISSION}.{_f(AdmissionPolicy, 'rules')}.filter(r, {_matches('r')})"),
    ("defaultCap", f"{ADMISSION}.{_f(AdmissionPolicy, 'default_cap')}"),
    ("cap", f"(variables.matching.map(r, r.{RULE_CAP}) + [variables.defaultCap]).max()"),
    # Rules are additive and their order never matters: a rule wins only with a strictly higher cap (or
    # tier bonus) than the default and every other, and among equals the first by name.
    (
        "capRule",
        "variables.cap == variables.defaultCap ? 'default cap'"
        f" : variables.matching.filter(r, r.{RULE_CAP} == variables.cap).map(r, r.{RULE_NAME}).min()",
    ),
    ("tierBonus", f"params.spec.{_f(GpuPolicySpec, 'tier_bonus')}"),
    ("defaultTier", f"{ADMISSION}.{_f(AdmissionPolicy, 'default_tier')}"),
    (
        "bestBonus",
        f"(variables.matching.filter(r, has(r.{RULE_TIER})).map(r, {_bonus('r.' + RULE_TIER)})"
        f" + [{_bonus('variables.defaultTier')}]).max()",
    ),
    (
        "tierRule",
        f"{_bonus('variables.defaultTier')} == variables.bestBonus ? 'default tier'"
        f" : variables.matching.filter(r, has(r.{RULE_TIER}) && {_bonus('r.' + RULE_TIER)} == variables.bestBonus)"
        f".map(r, r.{RULE_NAME}).min()",
    ),
    (
        "tier",
        "variables.tierRule == 'default tier' ? variables.defaultTier"
        f" : variables.matching.filter(r, r.{RULE_NAME} == variables.tierRule)[0].{RULE_TIER}",
    ),
    ("trusted", _matches(f"{ADMISSION}.{_f(AdmissionPolicy, 'trusted')}")),
    (
        "ownMember",
        f"{ADMISSION}.{_f(AdmissionPolicy, 'default_member')} == 'namespace' && variables.ns != ''"
        " ? variables.ns : variables.user",
    ),
    ("reject", f"{ADMISSION}.{_f(AdmissionPolicy, 'mode')} == 'reject'"),
    ("raw", PRIORITY),
    ("text", "type(variables.raw) == string ? variables.raw.trim() : ''"),
    ("numeric", "variables.text.matches('^[+-]?[0-9]+$') && size(variables.text.find('[0-9]+')) <= 4000"),
    ("significant", "variables.text.find('[1-9][0-9]*')"),
    (
        "valid",
        f"type(variables.raw) == int || variables.text.lowerAscii() in {ALIAS_MAP} || variables.numeric",
    ),
    (
        "priority",
        f"type(variables.raw) == int"
        f" ? (variables.raw > {SATURATION} ? {SATURATION} : variables.raw < -{SATURATION} ? -{SATURATION}"
        " : variables.raw)"
        f" : variables.text.lowerAscii() in {ALIAS_MAP} ? {ALIAS_MAP}[variables.text.lowerAscii()]"
        " : !variables.numeric ? 0"
        f" : size(variables.significant) > {SATURATED_DIGITS}"
        f" ? (variables.text.startsWith('-') ? -{SATURATION} : {SATURATION}) : int(variables.text)",
    ),
    ("maxSeconds", f"{LIMITS}.{_f(RunLimits, 'max_seconds')}"),
]


REQUEST = f"{SPEC}.{_f(GpuJobSpec, 'request')}"
# review._check_request: the field each OpenAI path must carry. The body is free-form (dyn).
REQUEST_VARIABLES: list[tuple[str, str]] = [
    (
        "needed",
        f"has({REQUEST}) && {REQUEST}.path in {_lit(REQUEST_FIELDS)} ? {_lit(REQUEST_FIELDS)}[{REQUEST}.path] : ''",
    ),
    ("body", f"has({REQUEST}) && has({REQUEST}.body) ? dyn({REQUEST}.body) : dyn({{}})"),
    ("value", "variables.needed != '' && variables.needed in variables.body ? variables.body[variables.needed] : null"),
]


# A GpuChain's steps, created by the operator, pass as they are: the chain was admitted as its author's. The
# operator's identity is the first variable, which ``manifests`` and the chart set for their operator. Not a
# match condition: each one costs the apiserver an activation of its own, the admission request converted to
# CEL anew (bench/admission_profile.py: match conditions were a tenth of its CPU under GpuJob creates).
OPERATORS = "operators"
CHAIN_STEP: list[tuple[str, str]] = [
    (
        "chainStep",
        f"variables.user in variables.{OPERATORS} && has(object.metadata.labels)"
        f" && {_lit(CHAIN_LABEL)} in object.metadata.labels",
    ),
]


def operators_variable(operators: Sequence[str]) -> dict[str, str]:
    return {"name": OPERATORS, "expression": _lit(list(operators))}


def _variables(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [operators_variable([DEFAULT_OPERATOR]), *({"name": n, "expression": e} for n, e in pairs)]


def _maybe(field: str, value: str, condition: str) -> str:
    """An optional field of an apply configuration: set to ``value`` when ``condition`` holds, else left out."""
    return f"?{field}: ({condition}) ? optional.of({value}) : optional.none()"


# The caller's groups as a JSON list of strings, as review.author_annotations writes them.
QUOTED = r"""'"' + g.replace('\\', '\\\\').replace('"', '\\"') + '"'"""
GROUPS_JSON = f"'[' + variables.groups.map(g, {QUOTED}).join(',') + ']'"


def job_defaults() -> dict[str, Any]:
    """review.mutate_job: a run limit within the policy's, the priority resolved and capped (the asked value
    kept in an annotation), member and tier from the caller; and a job's finalizer (review.finalizers_on_create).
    What would be refused is left for the validating policy to refuse (a mutating policy cannot). One apply
    configuration carries every change: each mutation would be a server-side apply merge of its own."""
    requested = f"type(variables.raw) == string ? {_shortened('variables.raw')} : string(variables.raw)"
    capped = "variables.valid && !variables.reject && variables.priority > variables.cap"
    run, priority, member, tier = (_f(GpuJobSpec, f) for f in ("max_run_seconds", "priority", "member", "tier"))
    default_run = f"{LIMITS}.{_f(RunLimits, 'default_seconds')}"
    # A chain's author, whatever it wrote there (review.author_annotations): its steps are judged as theirs.
    chain = "request.resource.resource == 'gpuchains'"
    entries = ", ".join([
        f"?{_lit(REQUESTED_PRIORITY)}: ({capped}) ? optional.of(string({requested})) : optional.none()",
        f"?{_lit(AUTHOR)}: ({chain}) ? optional.of(variables.user) : optional.none()",
        f"?{_lit(AUTHOR_GROUPS)}: ({chain}) ? optional.of({GROUPS_JSON}) : optional.none()",
    ])  # fmt: skip
    annotations = _maybe("annotations", f"{{{entries}}}", f"({capped}) || ({chain})")
    # review.finalizers_on_create: a job is born with the operator's finalizer, its own kept (the whole list is
    # given, so that the merge keeps them whether the apiserver merges the list as a set or replaces it).
    own = "(has(object.metadata.finalizers) ? object.metadata.finalizers : [])"
    finalizers = _maybe("finalizers", f"{own} + [{_lit(FINALIZER)}]", f"!({chain}) && !({_lit(FINALIZER)} in {own})")
    fields = [
        _maybe(
            run,
            f"!has({RUN}) ? {default_run} : variables.maxSeconds",
            f"!has({RUN}) || (!variables.reject && {RUN} > variables.maxSeconds)",
        ),
        _maybe(
            priority,
            f"({capped}) ? variables.cap : variables.priority",
            f"({capped}) || (variables.valid && type(variables.raw) != int)",
        ),
        _maybe(member, "variables.ownMember", f"!has({MEMBER})"),
        _maybe(tier, "variables.tier", f"!has({TIER})"),
    ]
    changes = (
        f"Object{{metadata: Object.metadata{{{annotations}, {finalizers}}}, spec: Object.spec{{{', '.join(fields)}}}}}"
    )
    expression = f"variables.chainStep ? Object{{}} : {changes}"
    return {
        "failurePolicy": "Fail",
        "reinvocationPolicy": "Never",
        "paramKind": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy"},
        "matchConstraints": _match(["CREATE"], *ADMITTED),
        "variables": _variables(VARIABLES + CHAIN_STEP),
        "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}],
    }


def _match(operations: list[str], *resources: str) -> dict[str, Any]:
    return {
        "resourceRules": [
            {"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": operations, "resources": list(resources)}
        ]
    }


def _changed(field: str, new: str = SPEC, old: str = "oldObject.spec") -> str:
    return f"(has({new}.{field}) != has({old}.{field}) || (has({new}.{field}) && {new}.{field} != {old}.{field}))"


def _rule(expression: str, message: str) -> dict[str, str]:
    return {"expression": expression, "messageExpression": message, "reason": "Forbidden"}


# What the webhook's match condition spec-changed leaves alone (configuration.SPEC_CHANGED: an UPDATE that keeps
# the spec, the operator's finalizer patches), and a chain's steps: every rule holds for them.
SKIP: list[tuple[str, str]] = [
    ("skip", "variables.chainStep || (request.operation == 'UPDATE' && object.spec == oldObject.spec)"),
]


def _folded(rules: list[dict[str, str]]) -> dict[str, str]:
    """The rules as one validation, unless ``variables.skip``, that names the first one broken, as the webhook
    does. Each validation is a CEL program of its own, whose evaluation the apiserver pays for on every create
    (bench/admission_profile.py); a message is evaluated only when its rule is broken."""
    message = rules[-1]["messageExpression"]
    for rule in reversed(rules[:-1]):
        message = f"!({rule['expression']}) ? ({rule['messageExpression']}) : {message}"
    checks = " && ".join(f"({rule['expression']})" for rule in rules)
    return {"expression": f"variables.skip || ({checks})", "messageExpression": message, "reason": "Forbidden"}


def job_rules() -> dict[str, Any]:
    """review.validate_job, on the object as mutated: what the webhook refuses, CEL refuses, with the same
    sentences (the model's existence excepted: the operator parks a job whose model is missing)."""
    create = "request.operation == 'CREATE'"
    old_phase = "has(oldObject.status) && has(oldObject.status.phase) ? oldObject.status.phase : ''"
    queue_changed = " || ".join(_changed(_f(GpuJobSpec, f)) for f in QUEUE_FIELDS)
    personal_changed = " || ".join(_changed(_f(GpuJobSpec, f)) for f in ("tier", "member"))
    over_cap = (
        "'priority ' + string(variables.priority) + ' is above the cap ' + string(variables.cap) + ' of user '"
        " + variables.user + ' (rule: ' + variables.capRule + ')'"
    )
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "paramKind": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPolicy"},
        "matchConstraints": _match(["CREATE", "UPDATE"], *ADMITTED),
        "variables": _variables(VARIABLES + REQUEST_VARIABLES + CHAIN_STEP + SKIP),
        "validations": [
            _rule(
                "variables.valid",
                f"'priority ' + {_shortened('string(variables.raw)')} + ' is neither an integer nor one of "
                f"{', '.join(ALIASES)}'",
            ),
            _rule(
                f"!variables.valid || variables.priority <= variables.cap"
                f" || (!({create}) && {PRIORITY} == oldObject.spec.{_f(GpuJobSpec, 'priority')})",
                over_cap,
            ),
            _rule(
                f"!has({TIER}) || {TIER} in variables.tierBonus",
                f"'unknown tier ' + {_shortened(TIER)} + '; this policy knows '"
                " + variables.tierBonus.map(t, t).join(', ')",
            ),
            _rule(
                "variables.needed == '' || (variables.needed in variables.body && !(type(variables.value) == null_type"
                " || (type(variables.value) == string && variables.value == '')"
                " || ((type(variables.value) == list || type(variables.value) == map) && size(variables.value) == 0)))",
                f"'spec.request.body must carry ' + variables.needed + ' for ' + {REQUEST}.path",
            ),
            _rule(
                "variables.needed != 'messages' || !(variables.needed in variables.body)"
                " || type(variables.value) != list"
                " || variables.value.all(m, type(m) == map && 'role' in m && type(m['role']) == string)",
                "'spec.request.body.messages must be a list of objects, each with a \\'role\\''",
            ),
            _rule(
                f"!has({RUN}) || {RUN} <= variables.maxSeconds"
                f" || (!({create}) && has({OLD_RUN}) && {RUN} == {OLD_RUN})",
                f"'maxRunSeconds ' + string({RUN}) + ' is above the GpuPolicy\\'s runLimits.maxSeconds '"
                " + string(variables.maxSeconds)",
            ),
            _rule(
                f"!({create}) || variables.trusted || !has({MEMBER}) || {MEMBER} == variables.ownMember",
                f"'user ' + variables.user + ' may not submit as member ' + {_shortened(MEMBER)}"
                " + ': only identities in the policy\\'s admission.trusted may set spec.member'",
            ),
            _rule(
                f"!({create}) || variables.trusted || !has({TIER}) || {TIER} == variables.tier",
                f"'user ' + variables.user + ' may not choose tier ' + {_shortened(TIER)} + ': their tier is '"
                " + variables.tier + ' (rule: ' + variables.tierRule + '); only identities in the policy\\'s"
                " admission.trusted may set spec.tier'",
            ),
            _rule(
                f"{create} || !({queue_changed}) || ({old_phase}) in ['', 'Pending']",
                f"'the job is ' + ({old_phase}) + ': spec.model, priority, tier and member cannot change'",
            ),
            _rule(
                f"{create} || variables.trusted || !({personal_changed})",
                "'user ' + variables.user + ' may not change spec.tier or spec.member: only trusted identities may'",
            ),
        ],
    }
    folded = _folded(spec["validations"])
    # Not skipped with an unchanged spec: an update of the annotations alone must not name another author.
    author = f"request.operation != 'UPDATE' || request.resource.resource != 'gpuchains' || !({AUTHOR_CHANGED})"
    refused = (f"'metadata.annotations[{AUTHOR}] and [{AUTHOR_GROUPS}] cannot change: a chain\\'s steps are "
               "judged as its author\\'s'")  # fmt: skip
    spec["validations"] = [{
        "expression": f"({author}) && ({folded['expression']})",
        "messageExpression": f"!({author}) ? ({refused}) : ({folded['messageExpression']})",
        "reason": "Forbidden",
    }]  # fmt: skip
    return spec


def status_outcomes() -> dict[str, Any]:
    """review.validate_status: anyone but the operator (a match condition the binding's user adds) may only
    end a Running job, touching only the outcome's fields. The status fields are GpuJobStatus's."""
    fields = [_f(GpuJobStatus, f) for f in GpuJobStatus.model_fields]
    kept = [f for f in fields if f not in OUTCOME_FIELDS]
    new, old = "object.status", "oldObject.status"
    changed = " + ".join(f"({_changed(f, new, old)} ? ['status.{f}'] : [])" for f in kept)
    old_phase = f"has({old}) && has({old}.phase) ? {old}.phase : 'new'"
    return {
        "failurePolicy": "Fail",
        "matchConstraints": _match(["UPDATE"], "gpujobs/status"),
        "matchConditions": [STATUS_CHANGED],
        "validations": [
            _rule(
                f"has({old}) && has({old}.phase) && {old}.phase == 'Running'",
                f"'user ' + request.userInfo.username + ' may not write the status of a ' + ({old_phase})"
                " + ' job: only the operator does; an executor may only end a Running job'",
            ),
            _rule(
                f"has({new}) && has({new}.phase) && {new}.phase in {_lit(list(OUTCOME_PHASES))}",
                f"'user ' + request.userInfo.username + ' may not set status.phase '"
                f" + (has({new}) && has({new}.phase) ? {new}.phase : 'none')"
                f" + ': an executor ends a Running job with {' or '.join(OUTCOME_PHASES)}'",
            ),
            _rule(
                f"!has({new}) || !has({old}) || size({changed}) == 0",
                f"'user ' + request.userInfo.username + ' may not change ' + ({changed}).join(', ')"
                f" + ': only the operator does; an executor writes {', '.join(sorted(OUTCOME_FIELDS))}'",
            ),
        ],
    }


def policy_rules() -> dict[str, Any]:
    """review.validate_policy, which is GpuPolicySpec's validators: the band invariant (core.policy) and
    admission rules that fit the scoring policy (AdmissionPolicy.check_against, its unique names), so the
    rules above never read a policy the webhook would have refused."""
    spec = "object.spec"
    bonus, admission = f"{spec}.{_f(GpuPolicySpec, 'tier_bonus')}", f"{spec}.{_f(GpuPolicySpec, 'admission')}"
    spacing, affinity = f"{spec}.{_f(GpuPolicySpec, 'band_spacing')}", f"{spec}.{_f(GpuPolicySpec, 'affinity_bonus')}"
    bounds = f"{spec}.{_f(GpuPolicySpec, 'priority_bounds')}"
    rules = f"{admission}.{_f(AdmissionPolicy, 'rules')}"
    limits = f"{spec}.{_f(GpuPolicySpec, 'run_limits')}"
    timeouts = f"{spec}.{_f(GpuPolicySpec, 'queue_timeout_seconds')}"
    teams, mode = (f"{spec}.{_f(GpuPolicySpec, f)}" for f in ("fair_share_teams", "fair_share"))
    largest = f"{bonus}.map(t, {bonus}[t]).max()"
    offsets = f"({largest} + {affinity})"
    default_tier, default_cap = (f"{admission}.{_f(AdmissionPolicy, f)}" for f in ("default_tier", "default_cap"))
    caps = f"([{default_cap}] + {rules}.map(r, r.{RULE_CAP}))"
    return {
        "failurePolicy": "Fail",
        "matchConstraints": _match(["CREATE", "UPDATE"], "gpupolicies"),
        "validations": [
            _rule(f"size({bonus}) > 0", "'tierBonus must name at least one tier'"),
            _rule(f"{bonus}.all(t, {bonus}[t] >= 0)", "'tier bonuses must be >= 0'"),
            _rule(
                f"size({bonus}) == 0 || ({spacing} >= {SPACING_FACTOR} * {offsets} && {spacing} > {offsets})",
                f"'bandSpacing ' + string({spacing}) + ' is too small: the largest tier bonus plus the affinity "
                f"bonus is ' + string({offsets}) + ', and the spacing must be at least {SPACING_FACTOR}x that so "
                "that tier and affinity never lift a job over a higher band'",
            ),
            _rule(
                f"{timeouts}.all(b, int(b) % {spacing} == 0 && {timeouts}[b] > 0.0 && {timeouts}[b] <= {MAX_SECONDS})",
                f"'queueTimeoutSeconds: every key is a band (a multiple of bandSpacing ' + string({spacing})"
                " + ') and every value more than 0 seconds and at most 10 years'",
            ),
            _rule(f"{bounds}.min <= {bounds}.max", "'priorityBounds.min is greater than priorityBounds.max'"),
            _rule(
                f"{default_tier} in {bonus} && {rules}.all(r, !has(r.{RULE_TIER}) || r.{RULE_TIER} in {bonus})",
                f"'admission: every tier (defaultTier and each rule\\'s) must be one of tierBonus: '"
                f" + {bonus}.map(t, t).join(', ')",
            ),
            _rule(
                f"{caps}.all(c, {bounds}.min <= c && c <= {bounds}.max)",
                f"'admission: every cap (defaultCap and each rule\\'s maxPriority) must lie inside priorityBounds ['"
                f" + string({bounds}.min) + ', ' + string({bounds}.max) + ']'",
            ),
            _rule(
                f"{rules}.all(r, size({rules}.filter(s, s.{RULE_NAME} == r.{RULE_NAME})) == 1)",
                "'admission rule names must be unique'",
            ),
            _rule(
                f"{limits}.{_f(RunLimits, 'default_seconds')} <= {limits}.{_f(RunLimits, 'max_seconds')}",
                "'runLimits.defaultSeconds is above runLimits.maxSeconds'",
            ),
            _rule(
                f"!has({teams}) || {teams}.all(t, t.matches({_lit(DNS_LABEL)}))",
                "'fairShareTeams: every team name is a namespace\\'s name (a DNS label)'",
            ),
            _rule(
                f"!has({teams}) || size({teams}) == 0 || !has({mode}) || {mode} == 'usage'",
                "'fairShareTeams group GPU usage: they need fairShare: usage'",
            ),
        ],
    }


def not_by(operators: Sequence[str]) -> dict[str, str]:
    """The status policy's match condition that leaves the operator's own writes alone."""
    return {"name": "not-the-operator", "expression": f"!(request.userInfo.username in {_lit(list(operators))})"}


def specs() -> dict[str, dict[str, Any]]:
    """The three policies' specs, by the name the chart gives each (``<fullname>-<key>``)."""
    return {
        "job-defaults": job_defaults(),
        "job-rules": job_rules(),
        "status-outcomes": status_outcomes(),
        "policy-rules": policy_rules(),
    }


def manifests(
    name: str = NAME, operators: Sequence[str] = (DEFAULT_OPERATOR,), namespace_selector: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The policies and their bindings, to ``kubectl apply`` without the chart."""
    match = {"namespaceSelector": {"matchLabels": dict(namespace_selector)}} if namespace_selector else None
    param = {"name": POLICY, "parameterNotFoundAction": "Deny"}
    out: list[dict[str, Any]] = []
    for key, spec in specs().items():
        kind = "MutatingAdmissionPolicy" if key == "job-defaults" else "ValidatingAdmissionPolicy"
        if key == "status-outcomes":
            spec = {**spec, "matchConditions": [*spec["matchConditions"], not_by(operators)]}
        if key in ("job-defaults", "job-rules"):
            mine = operators_variable(operators)
            spec = {**spec, "variables": [mine if v["name"] == OPERATORS else v for v in spec["variables"]]}
        binding: dict[str, Any] = {"policyName": f"{name}-{key}"}
        if "paramKind" in spec:
            binding["paramRef"] = param
        if kind == "ValidatingAdmissionPolicy":
            binding["validationActions"] = ["Deny"]
        if match and key != "policy-rules":  # GpuPolicies are cluster-scoped
            binding["matchResources"] = match
        meta = {"name": f"{name}-{key}"}
        api = "admissionregistration.k8s.io/v1"
        out += [
            {"apiVersion": api, "kind": kind, "metadata": meta, "spec": spec},
            {"apiVersion": api, "kind": f"{kind}Binding", "metadata": meta, "spec": binding},
        ]
    return out


HEADER = "# Generated by `python -m gpulane.admission.cel` from gpulane/admission; do not edit.\n"


def rendered() -> dict[Path, str]:
    deploy = HEADER + (
        "# gpulane's admission in the apiserver (docs/admission.md): kubectl apply -f deploy/admission-policies.yaml\n"
        f"# The operator is taken to be {DEFAULT_OPERATOR}; for another, print them anew:\n"
        "# gpulane admission-policies --operator-user system:serviceaccount:NS:NAME\n"
    )
    deploy += yaml.safe_dump_all(manifests(), sort_keys=False, width=120)
    chart = HEADER + yaml.safe_dump(specs(), sort_keys=False, width=120)
    return {DEPLOY: deploy, CHART_FILE: chart}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=NAME, help="prefix of the policies' and bindings' names")
    parser.add_argument(
        "--operator-user",
        action="append",
        dest="operators",
        help=f"the operator's username, whose status writes are its own (default {DEFAULT_OPERATOR})",
    )
    parser.add_argument(
        "--namespace-selector", action="append", default=[], metavar="KEY=VALUE", help="only GpuJobs in these"
    )


def run(args: argparse.Namespace) -> int:
    selector = dict(item.split("=", 1) for item in args.namespace_selector)
    docs = manifests(args.name, args.operators or [DEFAULT_OPERATOR], selector or None)
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, width=120))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write (or --check) the generated admission policies")
    parser.add_argument("--check", action="store_true", help="fail when a committed file differs")
    args = parser.parse_args(argv)
    remedy = "run `python -m gpulane.admission.cel` (make crds)"
    return generated.sync(rendered(), check=args.check, remedy=remedy)


if __name__ == "__main__":
    sys.exit(main())
