"""The admission webhook's decisions (``gpulane.admission``), as pure functions: rules, mutation, validation
and the webhook configurations, with unit tests of the documented behaviour and property tests that no input
makes the webhook fail with anything but a readable refusal."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpulane.admission.configuration import webhook_configurations
from gpulane.admission.review import (
    REQUEST_FIELDS,
    REQUESTED_PRIORITY,
    Mutation,
    Refused,
    finalizers_on_create,
    mutate_job,
    validate_job,
    validate_policy,
)
from gpulane.admission.rules import AdmissionPolicy, Caller, Grant, grant
from gpulane.api.contract import FINALIZER
from gpulane.api.resources import GpuPolicySpec
from gpulane.api.run_limits import RunLimits
from gpulane.core.policy import Policy, PolicyError
from gpulane.core.priority import SATURATION, resolve_priority

POLICY = Policy()  # tiers free 0, pro 1, max 2; bounds [-1000, 1000]
ALICE = Caller("alice", groups=("system:authenticated",), namespace="team-a")
BRIDGE = "system:serviceaccount:gpulane:bridge"


def admission(**fields: Any) -> AdmissionPolicy:
    return AdmissionPolicy.model_validate(fields)


def rule(name: str, max_priority: int, tier: str | None = None, **subjects: list[str]) -> dict[str, Any]:
    return {"name": name, "maxPriority": max_priority, "tier": tier, **subjects}


def refusal(call: Any, *args: Any) -> str:
    with pytest.raises(Refused) as err:
        call(*args)
    return str(err.value)


# -- grant ---------------------------------------------------------------------------------------


def test_grant_without_a_matching_rule_is_the_default_cap_and_tier() -> None:
    adm = admission(defaultCap=-50, defaultTier="pro", rules=[rule("vip", 900, "max", users=["bob"])])
    assert grant(ALICE, adm, POLICY) == Grant(-50, "default cap", "pro", "default tier", False)


@pytest.mark.parametrize(
    ("subjects", "caller"),
    [
        ({"users": ["alice"]}, Caller("alice")),
        ({"groups": ["researchers"]}, Caller("carol", groups=("system:authenticated", "researchers"))),
        ({"serviceAccounts": ["team-a/runner"]}, Caller("system:serviceaccount:team-a:runner")),
        ({"namespaces": ["team-a"]}, Caller("dave", namespace="team-a")),
    ],
    ids=["user", "group", "service-account", "namespace"],
)
def test_grant_matches_each_kind_of_subject(subjects: dict[str, list[str]], caller: Caller) -> None:
    adm = admission(rules=[rule("r", 300, "pro", **subjects)])
    assert grant(caller, adm, POLICY) == Grant(300, "r", "pro", "r", False)


@pytest.mark.parametrize(
    "caller",
    [
        Caller("alicia"),  # another user
        Caller("carol", groups=("researchers-old",)),  # another group
        Caller("system:serviceaccount:team-b:runner"),  # same name, other namespace
        Caller("team-a/runner"),  # a user named like a ServiceAccount is not one
        Caller("dave", namespace="team-b"),
        Caller("dave", namespace=None),
    ],
)
def test_grant_does_not_match_other_identities(caller: Caller) -> None:
    adm = admission(
        rules=[
            rule(
                "r",
                300,
                "pro",
                users=["alice"],
                groups=["researchers"],
                serviceAccounts=["team-a/runner"],
                namespaces=["team-a"],
            )
        ]
    )
    assert grant(caller, adm, POLICY) == Grant(0, "default cap", "free", "default tier", False)


@pytest.mark.parametrize(
    ("username", "expected"),
    [
        ("system:serviceaccount:team-a:runner", "team-a/runner"),
        ("system:serviceaccount:gpulane:bridge", "gpulane/bridge"),
        ("system:serviceaccount:team-a", None),  # no name
        ("system:serviceaccount:team-a:", None),
        ("alice", None),
        ("system:node:gpu-0", None),
    ],
)
def test_service_account_of_a_username(username: str, expected: str | None) -> None:
    assert Caller(username).service_account == expected


def test_rules_are_additive_highest_cap_and_best_tier_each_name_their_rule() -> None:
    adm = admission(
        rules=[
            rule("everyone", 50, "max", groups=["system:authenticated"]),
            rule("team", 200, "pro", namespaces=["team-a"]),
            rule("alice", 100, users=["alice"]),
            rule("others", 999, "max", users=["bob"]),  # does not match
        ]
    )
    assert grant(ALICE, adm, POLICY) == Grant(200, "team", "max", "everyone", False)


def test_a_lower_rule_never_lowers_the_default_cap_or_tier() -> None:
    adm = admission(defaultCap=100, defaultTier="pro", rules=[rule("low", -50, "free", users=["alice"])])
    assert grant(ALICE, adm, POLICY) == Grant(100, "default cap", "pro", "default tier", False)


def test_rule_order_does_not_matter() -> None:
    rules = [
        rule("a", 10, "max", users=["alice"]),
        rule("b", 500, "free", groups=["system:authenticated"]),
        rule("c", 300, "pro", namespaces=["team-a"]),
        rule("d", 900, "max", users=["bob"]),
    ]
    grants = {grant(ALICE, admission(rules=list(order)), POLICY) for order in itertools.permutations(rules)}
    assert grants == {Grant(500, "b", "max", "a", False)}


TIED_POLICY = Policy(tier_bonus={"free": 0, "gold": 1, "silver": 1})


def test_equal_tier_bonuses_do_not_make_the_tier_depend_on_rule_order() -> None:
    a, b = rule("a", 0, "gold", users=["alice"]), rule("b", 0, "silver", users=["alice"])
    first = grant(ALICE, admission(rules=[a, b]), TIED_POLICY)
    second = grant(ALICE, admission(rules=[b, a]), TIED_POLICY)
    assert (first.tier, first.tier_rule) == (second.tier, second.tier_rule)


def test_equal_caps_do_not_make_the_named_rule_depend_on_rule_order() -> None:
    a, b = rule("a", 100, users=["alice"]), rule("b", 100, users=["alice"])
    assert grant(ALICE, admission(rules=[a, b]), POLICY) == grant(ALICE, admission(rules=[b, a]), POLICY)


@pytest.mark.parametrize(
    ("trusted", "caller", "expected"),
    [
        ({"serviceAccounts": ["gpulane/bridge"]}, Caller(BRIDGE), True),
        ({"serviceAccounts": ["gpulane/bridge"]}, Caller("system:serviceaccount:other:bridge"), False),
        ({"users": ["admin"]}, Caller("admin"), True),
        ({"groups": ["system:masters"]}, Caller("root", groups=("system:masters",)), True),
        ({"namespaces": ["gpulane"]}, Caller("x", namespace="gpulane"), True),
        ({}, Caller("admin", groups=("system:masters",)), False),
    ],
)
def test_trusted_identities(trusted: dict[str, list[str]], caller: Caller, expected: bool) -> None:
    granted = grant(caller, admission(trusted=trusted), POLICY)
    assert granted.trusted is expected
    assert (granted.cap, granted.tier) == (0, "free")  # trust grants no priority


def test_admission_policy_refuses_duplicate_rule_names() -> None:
    with pytest.raises(ValidationError, match=r"admission rule names must be unique; repeated: a, b"):
        admission(
            rules=[rule("b", 1, users=["x"]), rule("a", 1), rule("a", 2), rule("b", 3), rule("c", 1)],
        )


def test_check_against_accepts_caps_on_the_bounds_and_known_tiers() -> None:
    adm = admission(defaultCap=-1000, defaultTier="pro", rules=[rule("top", 1000, "max"), rule("none", 0)])
    adm.check_against(POLICY)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"defaultTier": "gold"}, "admission defaultTier: unknown tier 'gold'; this policy knows free, max, pro"),
        (
            {"rules": [rule("vip", 10, "gold")]},
            "admission rule 'vip': unknown tier 'gold'; this policy knows free, max, pro",
        ),
        ({"defaultCap": -1001}, "admission defaultCap: cap -1001 is outside priorityBounds [-1000, 1000]"),
        ({"rules": [rule("vip", 5000)]}, "admission rule 'vip': cap 5000 is outside priorityBounds [-1000, 1000]"),
    ],
)
def test_check_against_refuses_unknown_tiers_and_caps_out_of_bounds(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError) as err:
        admission(**fields).check_against(POLICY)
    assert str(err.value) == message


def test_check_against_names_the_rule_with_an_unknown_tier() -> None:
    with pytest.raises(PolicyError, match="vip"):
        admission(rules=[rule("ok", 0, "pro"), rule("vip", 10, "gold")]).check_against(POLICY)


# -- mutate_job ----------------------------------------------------------------------------------

ALICE_MAY_100 = admission(rules=[rule("alice", 100, users=["alice"])])
DEFAULT_RUN = {"maxRunSeconds": RunLimits().default_seconds}  # given to every job that sets none


def test_mutate_resolves_an_alias() -> None:
    out = mutate_job({"model": "llama", "priority": "interactive"}, ALICE, ALICE_MAY_100, POLICY)
    assert out == Mutation(spec={"priority": 100, "member": "alice", "tier": "free", **DEFAULT_RUN})


@pytest.mark.parametrize("spec", [{"model": "llama"}, {"model": "llama", "priority": 0}, {"priority": 100}])
def test_mutate_leaves_an_integer_priority_within_the_cap_alone(spec: dict[str, Any]) -> None:
    out = mutate_job(spec, ALICE, ALICE_MAY_100, POLICY)
    assert out == Mutation(spec={"member": "alice", "tier": "free", **DEFAULT_RUN})


def test_mutate_caps_with_a_warning_and_keeps_the_request() -> None:
    out = mutate_job({"model": "llama", "priority": 1000}, ALICE, admission(), POLICY)
    assert out.spec == {"priority": 0, "member": "alice", "tier": "free", **DEFAULT_RUN}
    assert out.warnings == ["priority 1000 capped to 0 for user alice (rule: default cap)"]
    assert out.annotations == {REQUESTED_PRIORITY: "1000"}


def test_mutate_caps_an_alias_to_the_rule_cap_and_names_the_rule() -> None:
    adm = admission(rules=[rule("team", 50, namespaces=["team-a"])])
    out = mutate_job({"priority": "Interactive "}, ALICE, adm, POLICY)
    assert out.spec["priority"] == 50
    assert out.warnings == ["priority 100 capped to 50 for user alice (rule: team)"]
    assert out.annotations == {REQUESTED_PRIORITY: "Interactive "}


def test_mutate_in_reject_mode_refuses_naming_cap_and_rule() -> None:
    adm = admission(mode="reject", rules=[rule("team", 50, namespaces=["team-a"])])
    assert refusal(mutate_job, {"priority": 1000}, ALICE, adm, POLICY) == (
        "priority 1000 is above the cap 50 of user alice (rule: team)"
    )
    assert mutate_job({"priority": 50}, ALICE, adm, POLICY).warnings == []


def test_a_new_job_gets_the_operators_finalizer_beside_its_own_and_only_once() -> None:
    assert finalizers_on_create([]) == [FINALIZER]
    assert finalizers_on_create(["example.com/hold"]) == ["example.com/hold", FINALIZER]
    assert finalizers_on_create(["example.com/hold", FINALIZER]) is None  # the bridge creates its jobs with it


LIMITS = RunLimits(defaultSeconds=600, maxSeconds=7200)


def test_mutate_gives_a_job_without_a_run_limit_the_policys_default() -> None:
    assert mutate_job({"model": "llama"}, ALICE, admission(), POLICY, LIMITS).spec["maxRunSeconds"] == 600
    assert mutate_job({"maxRunSeconds": 60}, ALICE, admission(), POLICY, LIMITS).spec.get("maxRunSeconds") is None


def test_mutate_caps_a_run_limit_above_the_ceiling_or_refuses_it_in_reject_mode() -> None:
    out = mutate_job({"maxRunSeconds": 86400}, ALICE, admission(), POLICY, LIMITS)
    assert out.spec["maxRunSeconds"] == 7200
    assert out.warnings == ["maxRunSeconds 86400 capped to 7200 (the GpuPolicy's runLimits.maxSeconds)"]
    message = refusal(mutate_job, {"maxRunSeconds": 86400}, ALICE, admission(mode="reject"), POLICY, LIMITS)
    assert message == "maxRunSeconds 86400 is above the GpuPolicy's runLimits.maxSeconds 7200"


def test_validate_refuses_a_run_limit_above_the_ceiling_on_create_and_on_a_change() -> None:
    over = "maxRunSeconds 9000 is above the GpuPolicy's runLimits.maxSeconds 7200"
    assert refusal(validate_job, job(maxRunSeconds=9000), None, ALICE, admission(), POLICY, True, LIMITS) == over
    stored = old_job("Running", maxRunSeconds=600)
    assert refusal(validate_job, job(maxRunSeconds=9000), stored, ALICE, admission(), POLICY, True, LIMITS) == over
    validate_job(job(maxRunSeconds=7200), stored, ALICE, admission(), POLICY, True, LIMITS)


def test_a_policy_whose_default_run_limit_is_above_its_ceiling_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"runLimits\.defaultSeconds 7200 is above runLimits\.maxSeconds 600"):
        GpuPolicySpec.model_validate({"runLimits": {"defaultSeconds": 7200, "maxSeconds": 600}})


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"namespaceMaxSeconds": {"farm": 0}}, r"runLimits\.namespaceMaxSeconds\['farm'\] must be 1 to 604800 seconds"),
        ({"memberMaxSeconds": {"ann": 10**9}}, r"runLimits\.memberMaxSeconds\['ann'\] must be 1 to 604800 seconds"),
        ({"memberMaxSeconds": {"ann": True}}, r"runLimits\.memberMaxSeconds\.ann\n  Input should be a valid integer"),
    ],
)
def test_a_policy_with_a_namespaces_or_members_run_ceiling_out_of_range_is_refused(limits, message) -> None:
    with pytest.raises(ValidationError, match=message):
        GpuPolicySpec.model_validate({"runLimits": limits})


def test_with_default_member_namespace_jobs_count_against_their_namespace() -> None:
    """Issue 16, item 16: a namespace's ServiceAccounts share one fair share instead of one each."""
    by_namespace = admission(defaultMember="namespace")
    runner = Caller("system:serviceaccount:team-a:runner-7", namespace="team-a")
    assert mutate_job({}, runner, by_namespace, POLICY).spec["member"] == "team-a"
    assert "may not submit as member 'system:serviceaccount:team-a:runner-7'" in refusal(
        validate_job, job(member=runner.username), None, runner, by_namespace, POLICY, True
    )
    validate_job(job(member="team-a"), None, runner, by_namespace, POLICY, True)


def test_a_policy_refuses_a_pending_cap_below_one() -> None:
    with pytest.raises(ValidationError, match="maxPendingPerNamespace"):
        GpuPolicySpec.model_validate({"admission": {"maxPendingPerNamespace": 0}})


def test_mutate_sets_member_to_the_username() -> None:
    caller = Caller(BRIDGE, namespace="gpulane")
    assert mutate_job({}, caller, admission(), POLICY).spec["member"] == BRIDGE


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"member": "bob"},
            "user alice may not submit as member 'bob': only identities in the policy's admission.trusted may set "
            "spec.member",
        ),
        (
            {"tier": "max"},
            "user alice may not choose tier 'max': their tier is 'free' (rule: default tier); only identities in the "
            "policy's admission.trusted may set spec.tier",
        ),
        (
            {"member": "x" * 100},
            f"user alice may not submit as member '{'x' * 61}...': only identities in the policy's admission.trusted "
            "may set spec.member",
        ),
    ],
)
def test_mutate_refuses_member_and_tier_chosen_by_an_untrusted_caller(spec: dict[str, Any], message: str) -> None:
    assert refusal(mutate_job, spec, ALICE, admission(), POLICY) == message


def test_mutate_names_the_rule_that_set_the_tier_when_refusing_another() -> None:
    adm = admission(rules=[rule("researchers", 0, "pro", groups=["system:authenticated"])])
    assert "their tier is 'pro' (rule: researchers)" in refusal(mutate_job, {"tier": "max"}, ALICE, adm, POLICY)


def test_mutate_allows_an_untrusted_caller_to_state_their_own_member_and_tier() -> None:
    adm = admission(rules=[rule("researchers", 0, "pro", groups=["system:authenticated"])])
    assert mutate_job({"member": "alice", "tier": "pro", **DEFAULT_RUN}, ALICE, adm, POLICY) == Mutation()


def test_mutate_keeps_member_and_tier_chosen_by_a_trusted_caller() -> None:
    adm = admission(trusted={"serviceAccounts": ["gpulane/bridge"]})
    out = mutate_job(
        {"member": "alice", "tier": "max", "priority": 0, "maxRunSeconds": 60}, Caller(BRIDGE), adm, POLICY
    )
    assert out == Mutation()


def test_trust_does_not_lift_the_cap() -> None:
    adm = admission(trusted={"serviceAccounts": ["gpulane/bridge"]})
    out = mutate_job({"member": "alice", "priority": 500}, Caller(BRIDGE), adm, POLICY)
    assert out.spec == {"priority": 0, "tier": "free", **DEFAULT_RUN}


def test_mutate_takes_the_tier_from_the_rules_when_absent() -> None:
    adm = admission(
        defaultTier="free",
        rules=[rule("researchers", 0, "pro", groups=["researchers"]), rule("max", 0, "max", users=["carol"])],
    )
    assert mutate_job({}, Caller("dan", groups=("researchers",)), adm, POLICY).spec["tier"] == "pro"
    assert mutate_job({}, Caller("carol", groups=("researchers",)), adm, POLICY).spec["tier"] == "max"
    assert mutate_job({}, Caller("erin"), adm, POLICY).spec["tier"] == "free"


@pytest.mark.parametrize("raw", ["high", "1e3", "12abc", "", "0x10", "1" * 4001, 1.5, True, None, [1], {"a": 1}])
def test_mutate_refuses_an_unparseable_priority_with_the_parsers_message(raw: object) -> None:
    with pytest.raises(ValueError) as parser:
        resolve_priority(raw)
    assert refusal(mutate_job, {"priority": raw}, ALICE, ALICE_MAY_100, POLICY) == str(parser.value)


def test_mutate_refuses_a_word_naming_it_and_the_aliases() -> None:
    assert refusal(mutate_job, {"priority": "high"}, ALICE, admission(), POLICY) == (
        "priority 'high' is neither an integer nor one of interactive, normal, batch"
    )


def test_mutate_saturates_a_huge_number_string_then_caps_it() -> None:
    huge = "9" * 50
    out = mutate_job({"priority": huge}, ALICE, ALICE_MAY_100, POLICY)
    assert out.spec["priority"] == 100
    assert out.annotations == {REQUESTED_PRIORITY: huge}
    assert out.warnings == [f"priority {SATURATION} capped to 100 for user alice (rule: alice)"]
    adm = admission(mode="reject")
    assert refusal(mutate_job, {"priority": huge}, ALICE, adm, POLICY) == (
        f"priority {SATURATION} is above the cap 0 of user alice (rule: default cap)"
    )
    assert mutate_job({"priority": "-" + huge}, ALICE, adm, POLICY).spec["priority"] == -SATURATION


def test_the_requested_priority_annotation_keeps_a_large_integer_whole() -> None:
    # As the apiserver's MutatingAdmissionPolicy writes it (string(int)): both admission modes agree.
    out = mutate_job({"priority": 10**13}, ALICE, admission(), POLICY)
    assert out.annotations == {REQUESTED_PRIORITY: "10000000000000"}


def test_mutate_truncates_a_long_requested_priority_annotation() -> None:
    out = mutate_job({"priority": "9" * 70}, ALICE, admission(), POLICY)
    assert out.annotations[REQUESTED_PRIORITY] == "9" * 61 + "..."


@pytest.mark.parametrize("spec", [{"priority": 10**4300}, {"member": 10**4300}, {"tier": 10**4300}])
def test_mutate_handles_an_integer_too_long_to_print(spec: dict[str, Any]) -> None:
    try:
        out = mutate_job(spec, ALICE, admission(), POLICY)
    except Refused as err:
        assert len(str(err)) < 2000
    else:
        assert out.spec["priority"] == 0


# -- validate_job --------------------------------------------------------------------------------


def job(**spec: Any) -> dict[str, Any]:
    return {"spec": {"model": "llama", "priority": 0, "tier": "free", "member": "alice", **spec}}


def old_job(phase: str | None, **spec: Any) -> dict[str, Any]:
    obj = job(**spec)
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def validate(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None = None,
    caller: Caller = ALICE,
    adm: AdmissionPolicy | None = None,
    model_known: bool = True,
) -> None:
    validate_job(new, old, caller, adm or admission(), POLICY, model_known)


def test_validate_accepts_a_good_job_on_create_and_update() -> None:
    validate(job(maxRunSeconds=60, expectedRunSeconds=30))
    validate(job(), old_job("Running"))


@pytest.mark.parametrize(
    ("new", "message"),
    [
        (job(model="Llama_3"), "spec.model: String should match pattern"),
        ({"spec": {"priority": 0}}, "spec.model: Field required"),
        ({}, "spec.model: Field required"),
        (job(maxRunSeconds=0), "spec.maxRunSeconds: Input should be greater than or equal to 1"),
        (job(expectedRunSeconds="soon"), "spec.expectedRunSeconds: Input should be a valid integer"),
        (job(colour="red"), "spec.colour: Extra inputs are not permitted"),
        (job(priority=1.5), "spec.priority"),
        (job(tier=""), "spec.tier: String should have at least 1 character"),
        (job(request={"path": "/v1/../chat", "body": {}}), "spec.request.path: String should match pattern"),
        (job(request={"path": "/v1//chat", "body": {}}), "spec.request.path: String should match pattern"),
        (job(request={"path": "/v2/chat", "body": {}}), "spec.request: POST /v2/chat: method and path must be a route"),
        (job(request={"method": "GET", "path": "/v1/chat/completions"}), "GET /v1/chat/completions: method and path"),
        (job(request={"path": "/upstream/other/prompt"}), "/upstream/other/prompt reaches another model's server"),
        (job(request={"path": "/upstream/llama"}), "POST /upstream/llama: method and path must be a route"),
        (job(request={"body": {}}), "spec.request.path: Field required"),
        ({"spec": "llama"}, "spec: Input should be a valid dictionary"),
    ],
)
def test_validate_refuses_a_malformed_spec_naming_the_field(new: dict[str, Any], message: str) -> None:
    assert message in refusal(validate, new)


def test_validate_lists_every_malformed_field() -> None:
    message = refusal(validate, job(model="", maxRunSeconds=10**9))
    assert message.startswith("spec.model: ")
    assert "; spec.maxRunSeconds: Input should be less than or equal to 604800" in message


def test_validate_refuses_an_unknown_model_on_create_only() -> None:
    assert refusal(validate, job(), None, ALICE, None, False) == (
        "no GpuModel named 'llama'; create it first (kubectl get gpumodels)"
    )
    validate(job(), old_job("Pending"), model_known=False)


def test_an_update_that_leaves_the_spec_alone_passes_whatever_the_policy_now_says() -> None:
    """The operator's finalizer patch on a job whose tier the policy has since removed (issue 16, item 7)."""
    stored = old_job("Running", tier="gold", priority=900)
    patched = {**stored, "metadata": {"finalizers": []}}
    validate(patched, stored)  # gold is no tier of POLICY, and 900 is over alice's cap: neither matters here
    assert "unknown tier 'gold'" in refusal(validate, {**patched, "spec": {**stored["spec"], "priority": 5}}, stored)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"member": "bob"}, "user alice may not submit as member 'bob'"),
        ({"tier": "max"}, "user alice may not choose tier 'max': their tier is 'free'"),
    ],
)
def test_validate_refuses_another_member_or_tier_on_create_as_the_mutation_does(
    spec: dict[str, Any], message: str
) -> None:
    """The validating webhook does not rely on the mutating one having run (issue 16, item 9)."""
    assert message in refusal(validate, job(**spec))
    assert message in refusal(mutate_job, job(**spec)["spec"], ALICE, admission(), POLICY)
    trusted = admission(trusted={"users": ["alice"]})
    validate(job(**spec), None, ALICE, trusted)


def test_validate_lets_a_create_without_member_and_tier_through() -> None:
    validate({"spec": {"model": "llama", "priority": 0}})


@pytest.mark.parametrize("priority", [1, "interactive", "5000", 2**63])
def test_validate_refuses_an_over_cap_priority_on_create(priority: object) -> None:
    message = refusal(validate, job(priority=priority))
    assert message == f"priority {resolve_priority(priority)} is above the cap 0 of user alice (rule: default cap)"


@pytest.mark.parametrize("priority", [1000, "interactive", "+1000", -1000])
def test_validate_accepts_a_priority_up_to_the_cap_on_create(priority: object) -> None:
    validate(job(priority=priority), None, ALICE, admission(rules=[rule("a", 1000, users=["alice"])]))
    assert "above the cap 999 " in refusal(
        validate, job(priority=1000), None, ALICE, admission(rules=[rule("a", 999, users=["alice"])])
    )


def test_validate_refuses_an_unparseable_priority_on_create() -> None:
    assert refusal(validate, job(priority="urgent")) == (
        "priority 'urgent' is neither an integer nor one of interactive, normal, batch"
    )


def test_validate_refuses_an_unknown_tier() -> None:
    assert refusal(validate, job(tier="gold")) == "unknown tier 'gold'; this policy knows free, max, pro"
    assert refusal(validate, job(tier="gold"), old_job("Pending", tier="gold", priority=-1)) == (
        "unknown tier 'gold'; this policy knows free, max, pro"
    )


GOOD_BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/embeddings": {"input": ["a", "b"]},
    "/v1/images/generations": {"prompt": "a cat"},
    "/v1/audio/speech": {"input": "hello", "voice": "x"},
}


@pytest.mark.parametrize(("path", "body"), GOOD_BODIES.items())
def test_validate_accepts_each_supported_request(path: str, body: dict[str, Any]) -> None:
    validate(job(request={"path": path, "body": body}))


@pytest.mark.parametrize(
    "request_",
    [
        {"path": "/sdapi/v1/txt2img", "body": {"prompt": "a cat"}},
        {"path": "/v/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}},
        {"path": "/v1/audio/transcriptions", "body": {"file": {"dataBase64": "AAAA"}}},
        {"path": "/v1/rerank", "body": {"query": "q", "documents": ["a"]}},
        {"method": "GET", "path": "/sdapi/v1/loras"},
        {"path": "/upstream/llama/prompt", "body": {"prompt": {"9": {"class_type": "SaveImage"}}}},
        {"method": "GET", "path": "/upstream/llama/history/abc"},
    ],
)
def test_validate_takes_every_route_the_bridge_routes(request_: dict[str, Any]) -> None:
    validate(job(request=request_), caller=ALICE)


@pytest.mark.parametrize(("path", "needed"), REQUEST_FIELDS.items())
@pytest.mark.parametrize("empty", [None, "", [], {}, "absent"])
def test_validate_refuses_a_request_without_its_required_field(path: str, needed: str, empty: object) -> None:
    body = {"model": "llama"} if empty == "absent" else {needed: empty}
    assert refusal(validate, job(request={"path": path, "body": body})) == (
        f"spec.request.body must carry {needed!r} for {path}"
    )


@pytest.mark.parametrize(
    "messages", ["hi", ["hi"], [{"content": "hi"}], [{"role": 1}], [{"role": "user"}, None], {"role": "user"}]
)
def test_validate_refuses_chat_messages_that_are_not_objects_with_a_role(messages: object) -> None:
    request = {"path": "/v1/chat/completions", "body": {"messages": messages}}
    assert refusal(validate, job(request=request)) == (
        "spec.request.body.messages must be a list of objects, each with a 'role'"
    )


@pytest.mark.parametrize(
    ("field", "value"), [("model", "mistral"), ("priority", -5), ("tier", "pro"), ("member", "bob")]
)
@pytest.mark.parametrize("phase", ["Dispatching", "Running", "Succeeded", "Failed", "Cancelled"])
def test_validate_refuses_queue_field_changes_once_dispatched(field: str, value: object, phase: str) -> None:
    trusted = admission(trusted={"users": ["alice"]})  # not even trusted callers
    assert refusal(validate, job(**{field: value}), old_job(phase), ALICE, trusted) == (
        f"spec.{field} cannot change: the job is {phase}"
    )


def test_validate_allows_other_changes_once_dispatched() -> None:
    validate(job(maxRunSeconds=600), old_job("Running", maxRunSeconds=60))
    validate(job(), old_job("Running"), model_known=False)


@pytest.mark.parametrize(("field", "value"), [("tier", "pro"), ("member", "bob"), ("member", None)])
@pytest.mark.parametrize("phase", ["Pending", None])
def test_validate_refuses_tier_and_member_changes_by_untrusted_callers_while_pending(
    field: str, value: object, phase: str | None
) -> None:
    assert refusal(validate, job(**{field: value}), old_job(phase)) == (
        f"user alice may not change spec.{field}: only trusted identities may"
    )


@pytest.mark.parametrize(("field", "value"), [("tier", "pro"), ("member", "bob")])
def test_validate_allows_trusted_callers_to_change_tier_and_member_while_pending(field: str, value: object) -> None:
    adm = admission(trusted={"serviceAccounts": ["gpulane/bridge"]})
    validate(job(**{field: value}), old_job("Pending"), Caller(BRIDGE), adm)


def test_validate_allows_an_untrusted_caller_to_change_model_and_lower_priority_while_pending() -> None:
    validate(job(model="mistral", priority=-100), old_job("Pending"))


def test_validate_refuses_raising_priority_above_the_cap_while_pending() -> None:
    assert "above the cap 0" in refusal(validate, job(priority=1000), old_job("Pending"))


@pytest.mark.parametrize("phase", [10**2000, 10**4300], ids=["2001-digits", "4301-digits"])
def test_validate_shortens_an_unprintable_phase(phase: int) -> None:
    assert len(refusal(validate, job(model="m"), {"spec": {}, "status": {"phase": phase}})) < 2000


@pytest.mark.parametrize("old", [{"spec": [1]}, {"spec": {"model": "n"}, "status": ["Running"]}])
def test_validate_handles_an_old_object_of_the_wrong_shape(old: dict[str, Any]) -> None:
    try:
        validate(job(model="m"), old)
    except Refused as err:
        assert str(err)


# -- validate_policy -----------------------------------------------------------------------------


def test_validate_policy_accepts_a_valid_policy() -> None:
    validate_policy({})
    validate_policy(
        {
            "tierBonus": {"free": 0, "gold": 5},
            "affinityBonus": 20,
            "bandSpacing": 100,
            "priorityBounds": {"min": -500, "max": 500},
            "admission": {
                "mode": "reject",
                "defaultCap": -100,
                "defaultTier": "free",
                "rules": [rule("vip", 500, "gold", users=["alice"]), rule("low", -500, None, groups=["g"])],
                "trusted": {"serviceAccounts": ["gpulane/bridge"]},
            },
        }
    )


def test_validate_policy_states_the_band_invariant_with_its_numbers() -> None:
    message = refusal(validate_policy, {"bandSpacing": 20})
    assert message.startswith("bandSpacing 20 is too small")
    assert "2 + 10 = 12" in message
    assert "at least 4x that (48)" in message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"admission": {"rules": [rule("vip", 5000, users=["alice"])]}},
            "admission rule 'vip': cap 5000 is outside priorityBounds [-1000, 1000]",
        ),
        (
            {"priorityBounds": {"min": -100, "max": 100}, "admission": {"defaultCap": 200}},
            "admission defaultCap: cap 200 is outside priorityBounds [-100, 100]",
        ),
        (
            {"admission": {"rules": [rule("vip", 10, "gold")]}},
            "admission rule 'vip': unknown tier 'gold'; this policy knows free, max, pro",
        ),
        (
            {"admission": {"defaultTier": "gold"}},
            "admission defaultTier: unknown tier 'gold'; this policy knows free, max, pro",
        ),
        (
            {"admission": {"rules": [rule("vip", 1), rule("vip", 2)]}},
            "spec.admission: admission rule names must be unique; repeated: vip",
        ),
        (
            {"priorityBounds": {"min": 5, "max": 1}},
            "spec.priorityBounds: priorityBounds.min (5) is greater than priorityBounds.max (1)",
        ),
        ({"tierBonus": {"free": -1}}, "tier bonuses must be >= 0, got free: -1"),
        ({"tierBonus": {}}, "tierBonus must name at least one tier"),
        ({"admission": {"mode": "drop"}}, "spec.admission.mode: Input should be 'cap' or 'reject'"),
    ],
)
def test_validate_policy_refuses_with_a_readable_message(spec: dict[str, Any], message: str) -> None:
    assert refusal(validate_policy, spec) == message


@pytest.mark.parametrize(
    ("spec", "field"),
    [({"bandSpacing": "x"}, "bandSpacing"), ({"admission": {"rules": [{"name": "r"}]}}, "maxPriority")],
)
def test_validate_policy_names_a_mistyped_field(spec: dict[str, Any], field: str) -> None:
    assert field in refusal(validate_policy, spec)


@pytest.mark.parametrize(
    "spec",
    [
        {"tierBonus": {"free": 10**1000}},
        {"priorityBounds": {"min": 10**2000}},
        {"admission": {"defaultCap": 10**2000}},
        {"tierBonus": {"free": 10**4300}},
    ],
)
def test_validate_policy_shortens_huge_numbers(spec: dict[str, Any]) -> None:
    message = refusal(validate_policy, spec)
    assert len(message) < 2000
    assert "set_int_max_str_digits" not in message


# -- webhook_configurations ----------------------------------------------------------------------

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def hooks(configs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {hook["name"]: hook for config in configs for hook in config["webhooks"]}


def test_webhook_configurations_with_a_url() -> None:
    mutating, validating = webhook_configurations(url="https://127.0.0.1:9443/", ca_pem=PEM)
    assert (mutating["kind"], validating["kind"]) == ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    assert mutating["metadata"] == validating["metadata"] == {"name": "gpulane"}
    by_name = hooks([mutating, validating])
    assert {name: hook["clientConfig"]["url"] for name, hook in by_name.items()} == {
        "gpujob-defaults.gpulane.io": "https://127.0.0.1:9443/gpujob-defaults",
        "gpujob-validate.gpulane.io": "https://127.0.0.1:9443/gpujob-validate",
        "gpuchain-defaults.gpulane.io": "https://127.0.0.1:9443/gpuchain-defaults",
        "gpuchain-validate.gpulane.io": "https://127.0.0.1:9443/gpuchain-validate",
        "gpupolicy-validate.gpulane.io": "https://127.0.0.1:9443/gpupolicy-validate",
    }
    assert [h["name"] for h in mutating["webhooks"]] == ["gpujob-defaults.gpulane.io", "gpuchain-defaults.gpulane.io"]
    for hook in by_name.values():
        assert "service" not in hook["clientConfig"]
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == PEM


def test_webhook_configurations_with_a_service() -> None:
    configs = webhook_configurations(service=("gpulane", "gpulane-webhook", 443), name="gpulane-test")
    assert [c["metadata"]["name"] for c in configs] == ["gpulane-test", "gpulane-test"]
    by_name = hooks(configs)
    assert {name: hook["clientConfig"] for name, hook in by_name.items()} == {
        f"{path}.gpulane.io": {
            "service": {"namespace": "gpulane", "name": "gpulane-webhook", "port": 443, "path": f"/{path}"}
        }
        for path in (
            "gpujob-defaults",
            "gpujob-validate",
            "gpuchain-defaults",
            "gpuchain-validate",
            "gpupolicy-validate",
        )
    }


def test_webhook_configurations_rules_and_failure_policy() -> None:
    by_name = hooks(webhook_configurations(url="https://h:1"))
    assert {name: hook["failurePolicy"] for name, hook in by_name.items()} == dict.fromkeys(by_name, "Fail")
    assert {name: hook["sideEffects"] for name, hook in by_name.items()} == dict.fromkeys(by_name, "None")
    rules = {name: hook["rules"] for name, hook in by_name.items()}
    assert rules["gpujob-defaults.gpulane.io"] == [
        {
            "apiGroups": ["gpulane.io"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE"],
            "resources": ["gpujobs"],
            "scope": "Namespaced",
        }
    ]
    assert rules["gpujob-validate.gpulane.io"][0]["operations"] == ["CREATE", "UPDATE"]
    conditions = {name: hook.get("matchConditions") for name, hook in by_name.items()}
    assert conditions["gpujob-validate.gpulane.io"] == [
        {"name": "spec-changed", "expression": "request.operation != 'UPDATE' || object.spec != oldObject.spec"}
    ]
    assert rules["gpupolicy-validate.gpulane.io"][0]["resources"] == ["gpupolicies"]
    assert rules["gpupolicy-validate.gpulane.io"][0]["scope"] == "Cluster"
    assert rules["gpuchain-defaults.gpulane.io"][0]["resources"] == ["gpuchains"]
    assert rules["gpuchain-validate.gpulane.io"][0]["operations"] == ["CREATE", "UPDATE"]


def test_the_operators_chain_steps_skip_the_job_hooks_and_no_one_elses() -> None:
    """A GpuChain's steps pass as the operator made them from the admitted chain; the condition names the
    operator's identity, so a label written by anyone else is no way around the caps."""
    by_name = hooks(webhook_configurations(url="https://h:1", operators=["system:serviceaccount:gs:op"]))
    step = {"name": "not-a-chain-step", "expression": "!(request.userInfo.username in [\"system:serviceaccount:gs:op\"]"
            " && has(object.metadata.labels) && 'gpulane.io/chain' in object.metadata.labels)"}  # fmt: skip
    assert by_name["gpujob-defaults.gpulane.io"]["matchConditions"] == [step]
    assert by_name["gpujob-validate.gpulane.io"]["matchConditions"][-1] == step
    assert step not in by_name["gpuchain-defaults.gpulane.io"].get("matchConditions", [])
    assert "matchConditions" not in hooks(webhook_configurations(url="https://h:1"))["gpujob-defaults.gpulane.io"]


def test_namespace_selector_only_on_the_gpujob_hooks() -> None:
    by_name = hooks(webhook_configurations(url="https://h:1", namespace_selector={"gpulane.io/jobs": "on"}))
    selectors = {name: hook.get("namespaceSelector") for name, hook in by_name.items()}
    assert selectors == {
        "gpujob-defaults.gpulane.io": {"matchLabels": {"gpulane.io/jobs": "on"}},
        "gpujob-validate.gpulane.io": {"matchLabels": {"gpulane.io/jobs": "on"}},
        "gpuchain-defaults.gpulane.io": {"matchLabels": {"gpulane.io/jobs": "on"}},
        "gpuchain-validate.gpulane.io": {"matchLabels": {"gpulane.io/jobs": "on"}},
        "gpupolicy-validate.gpulane.io": None,
    }
    assert all("namespaceSelector" not in h for h in hooks(webhook_configurations(url="https://h:1")).values())


def test_webhook_configurations_without_ca_have_no_ca_bundle() -> None:
    assert all("caBundle" not in h["clientConfig"] for h in hooks(webhook_configurations(url="https://h:1")).values())


def test_webhook_configurations_need_a_url_or_a_service() -> None:
    with pytest.raises(ValueError, match="give the webhook's url or its service"):
        webhook_configurations(ca_pem=PEM)


# -- properties ----------------------------------------------------------------------------------

# Beyond int64 and SATURATION, but short enough to print: ints of more than 4300 digits are the known bug above.
HUGE = st.integers(min_value=18, max_value=120).flatmap(
    lambda n: st.sampled_from([10**n, 10**n - 1, -(10**n), 2**63, -(2**63) - 1])
)
# Unbounded st.integers() sometimes draws ints of thousands of digits, which hit the known bugs above every run.
INTS = st.integers(min_value=-(2**128), max_value=2**128) | st.integers(min_value=-2000, max_value=2000) | HUGE
TEXT = st.text(max_size=24)
SCALARS = st.none() | st.booleans() | INTS | st.floats() | TEXT
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)

USERS = ["alice", "bob", "carol", BRIDGE, "system:serviceaccount:team-a:runner", "system:serviceaccount:x"]
GROUPS = ["system:authenticated", "researchers", "system:masters"]
NAMESPACES = ["team-a", "team-b", "gpulane"]
TIERS = ["free", "pro", "max", "gold"]
MODELS = ["llama", "m", "mistral-7b"]

PRIORITIES = (
    st.sampled_from(["interactive", "normal", "batch", " Batch ", "INTERACTIVE", "", "high", "1e3", "+5", "-0"])
    | st.integers(min_value=1, max_value=60).map(lambda n: "9" * n)
    | st.integers(min_value=1, max_value=60).map(lambda n: "-" + "9" * n)
    | INTS.map(str)
    | INTS
    | JSON
)
REQUESTS = (
    st.fixed_dictionaries(
        {"path": st.sampled_from([*REQUEST_FIELDS, "/v1/models", "/v2/x", "chat"]) | TEXT},
        optional={
            "body": st.dictionaries(
                st.sampled_from(["messages", "prompt", "input", "model"]) | TEXT,
                JSON
                | st.lists(
                    st.fixed_dictionaries({}, optional={"role": JSON | st.just("user"), "content": JSON}),
                    max_size=3,
                ),
                max_size=3,
            )
            | JSON
        },
    )
    | JSON
)
REAL_SPECS = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(MODELS) | JSON,
        "priority": PRIORITIES,
        "tier": st.sampled_from(TIERS) | JSON,
        "member": st.sampled_from(USERS) | JSON,
        "request": REQUESTS,
        "maxRunSeconds": st.integers(min_value=-5, max_value=10**6) | JSON,
    },
)
SPECS = (
    REAL_SPECS
    | st.dictionaries(TEXT, JSON, max_size=5)
    | st.builds(lambda real, extra: {**extra, **real}, REAL_SPECS, st.dictionaries(TEXT, JSON, min_size=1, max_size=3))
)
# Well-formed specs, so that acceptance is exercised too, and small changes of them.
WELL_FORMED = st.fixed_dictionaries(
    {"model": st.sampled_from(MODELS)},
    optional={
        "priority": st.sampled_from([-1000, -100, 0, 1, 50, 100, 500, 1000, "interactive", "normal", "batch", "7"]),
        "tier": st.sampled_from(TIERS),
        "member": st.sampled_from(USERS),
        "maxRunSeconds": st.integers(min_value=1, max_value=3600),
        "request": st.sampled_from([{"path": path, "body": body} for path, body in GOOD_BODIES.items()]),
    },
)
CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(MODELS),
        "priority": st.sampled_from([0, 100, 1000, "interactive"]),
        "tier": st.sampled_from(TIERS),
        "member": st.sampled_from(USERS),
    },
)
PHASES = st.sampled_from([None, "Pending", "Dispatching", "Running", "Succeeded", "Failed", "Cancelled"]) | JSON
STATUSES = st.none() | st.fixed_dictionaries({}, optional={"phase": PHASES})


@st.composite
def job_reviews(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A new object, and None (create) or an old object: arbitrary, or the new one before a few changes."""
    spec = draw(st.sampled_from([WELL_FORMED, WELL_FORMED, SPECS, JSON]).flatmap(lambda strategy: strategy))
    new = {"spec": spec} if draw(st.sampled_from(["spec", "spec", "spec", "empty"])) == "spec" else {}
    kind = draw(st.sampled_from(["create", "arbitrary", "changed"]))
    if kind == "create":
        return new, None
    old_spec = draw(SPECS) if kind == "arbitrary" or not isinstance(spec, dict) else {**spec, **draw(CHANGES)}
    old: dict[str, Any] = {"spec": old_spec}
    status = draw(STATUSES)
    if status is not None or draw(st.booleans()):
        old["status"] = status
    return new, old


CALLERS = st.builds(
    Caller,
    username=st.sampled_from(USERS) | st.text(max_size=40),
    groups=st.lists(st.sampled_from(GROUPS) | TEXT, max_size=3).map(tuple),
    namespace=st.none() | st.sampled_from(NAMESPACES) | TEXT,
)
POLICIES = [
    Policy(),
    Policy.model_validate(
        {"tierBonus": {"free": 0, "gold": 5, "pro": 5}, "affinityBonus": 5, "priorityBounds": {"min": -500, "max": 500}}
    ),
]


@st.composite
def setups(draw: st.DrawFn) -> tuple[AdmissionPolicy, Policy]:
    """A policy and an admission policy that ``check_against`` accepts."""
    policy = draw(st.sampled_from(POLICIES))
    tiers = sorted(policy.tier_bonus)
    caps = st.integers(min_value=policy.priority_bounds.min, max_value=policy.priority_bounds.max)

    def subjects(**extra: Any) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries(
            extra,
            optional={
                "users": st.lists(st.sampled_from(USERS), max_size=2),
                "groups": st.lists(st.sampled_from(GROUPS), max_size=2),
                "serviceAccounts": st.lists(st.sampled_from(["gpulane/bridge", "team-a/runner", "x/"]), max_size=2),
                "namespaces": st.lists(st.sampled_from(NAMESPACES), max_size=2),
            },
        )

    rules = draw(st.lists(subjects(maxPriority=caps, tier=st.none() | st.sampled_from(tiers)), max_size=4))
    adm = AdmissionPolicy.model_validate(
        {
            "mode": draw(st.sampled_from(["cap", "reject"])),
            "defaultCap": draw(caps),
            "defaultTier": draw(st.sampled_from(tiers)),
            "rules": [{"name": f"rule-{i}", **r} for i, r in enumerate(rules)],
            "trusted": draw(subjects()),
        }
    )
    adm.check_against(policy)
    return adm, policy


LINE_BREAKS = frozenset(c for c in map(chr, range(0x3000)) if len(f"a{c}b".splitlines()) == 2)


def strings(value: object) -> list[str]:
    """Every string inside ``value`` (keys included), and a caller's identity."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Caller):
        return [value.username, *value.groups, value.namespace or ""]
    if isinstance(value, Mapping):
        return [s for k, v in value.items() for s in (*strings(k), *strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in strings(v)]
    return []


def assert_readable(message: str, *inputs: object) -> None:
    """A sentence for a person: not empty, not huge, no Python internals, one line unless the input had more."""
    assert message.strip(), "empty message"
    assert len(message) < 2000, f"message of {len(message)} characters"
    for internal in ("Traceback", "<object", " object at 0x", "NoneType(", "pydantic_core"):
        assert internal not in message
    if not any(LINE_BREAKS.intersection(s) for value in inputs for s in strings(value)):
        assert len(message.splitlines()) == 1, f"multi-line message {message!r}"


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(spec=WELL_FORMED | SPECS, caller=CALLERS, setup=setups())
def test_mutate_job_returns_a_capped_job_or_refuses_readably(
    spec: dict[str, Any], caller: Caller, setup: tuple[AdmissionPolicy, Policy]
) -> None:
    adm, policy = setup
    granted = grant(caller, adm, policy)
    try:
        out = mutate_job(spec, caller, adm, policy)
    except Refused as err:
        event("refused")
        assert_readable(str(err), spec, caller)
        return
    event("capped" if out.warnings else "admitted")
    merged = {**spec, **out.spec}
    run = merged["maxRunSeconds"]  # always set: the default when absent
    run_warnings = [w for w in out.warnings if w.startswith("maxRunSeconds ")]
    if type(run) is int:
        assert run <= RunLimits().max_seconds
        assert len(run_warnings) == (spec.get("maxRunSeconds") not in (None, run))  # lowered, not defaulted
    out.warnings = [w for w in out.warnings if w not in run_warnings]
    priority = merged.get("priority", 0)
    assert type(priority) is int
    assert -SATURATION <= priority <= granted.cap
    if priority != resolve_priority(spec.get("priority", 0)):  # lowered: only by the cap, and only in cap mode
        assert adm.mode == "cap"
        assert priority == granted.cap
        assert len(out.warnings) == 1
        assert out.annotations.keys() == {REQUESTED_PRIORITY}
        assert len(out.annotations[REQUESTED_PRIORITY]) <= 64
        assert_readable(out.warnings[0], spec, caller)
    else:
        assert out.warnings == []
        assert out.annotations == {}
    if not granted.trusted:
        assert (merged["member"], merged["tier"]) == (caller.username, granted.tier)


@PROPERTY
@given(
    review=job_reviews(),
    caller=CALLERS,
    setup=setups(),
    model_known=st.booleans(),
)
def test_validate_job_accepts_or_refuses_readably(
    review: tuple[dict[str, Any], dict[str, Any] | None],
    caller: Caller,
    setup: tuple[AdmissionPolicy, Policy],
    model_known: bool,
) -> None:
    adm, policy = setup
    new, old = review
    try:
        validate_job(new, old, caller, adm, policy, model_known)
    except Refused as err:
        event("refused on " + ("create" if old is None else "update"))
        assert_readable(str(err), new, old, caller)
        return
    if old is not None and (new.get("spec") or {}) == (old.get("spec") or {}):
        event("accepted on update: spec unchanged")  # finalizers, labels: admission has nothing to decide
        return
    event("accepted on " + ("create" if old is None else "update"))
    spec = new["spec"]  # accepted: a well-formed spec
    assert isinstance(spec, dict)
    assert isinstance(spec["model"], str)
    if old is None:
        granted = grant(caller, adm, policy)
        assert model_known
        assert resolve_priority(spec.get("priority", 0)) <= granted.cap
        if not granted.trusted:  # the caller's own member and tier, or none (the mutation did not run)
            assert spec.get("member") in (None, caller.username)
            assert spec.get("tier") in (None, granted.tier)
    if spec.get("tier") is not None:
        assert spec["tier"] in policy.tier_bonus
    if old is not None:
        old_spec = old.get("spec") or {}
        changed = {f for f in ("model", "priority", "tier", "member") if spec.get(f) != old_spec.get(f)}
        if changed:  # only while the job waits, and tier and member only by trusted callers
            assert (old.get("status") or {}).get("phase") in (None, "Pending")
            assert grant(caller, adm, policy).trusted or not changed & {"tier", "member"}


@PROPERTY
@given(spec=WELL_FORMED | SPECS, caller=CALLERS, setup=setups())
def test_a_mutated_job_is_never_refused_for_its_priority(
    spec: dict[str, Any], caller: Caller, setup: tuple[AdmissionPolicy, Policy]
) -> None:
    adm, policy = setup
    try:
        out = mutate_job({**spec, "model": "llama"}, caller, adm, policy)
    except Refused:
        return
    try:
        validate_job({"spec": {**spec, "model": "llama", **out.spec}}, None, caller, adm, policy, True)
        event("accepted")
    except Refused as err:
        event("refused for something else")
        assert "is above the cap" not in str(err)


POLICY_SPECS = st.dictionaries(TEXT, JSON, max_size=4) | st.fixed_dictionaries(
    {},
    optional={
        "tierBonus": st.dictionaries(st.sampled_from(TIERS) | TEXT, INTS | JSON, max_size=3) | JSON,
        "affinityBonus": INTS | JSON,
        "agingDivisorSeconds": st.floats() | INTS | JSON,
        "bandSpacing": INTS | JSON,
        "priorityBounds": st.fixed_dictionaries({}, optional={"min": INTS | JSON, "max": INTS | JSON}) | JSON,
        "admission": st.fixed_dictionaries(
            {},
            optional={
                "mode": st.sampled_from(["cap", "reject"]) | JSON,
                "defaultCap": INTS | JSON,
                "defaultTier": st.sampled_from(TIERS) | JSON,
                "rules": st.lists(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "name": st.sampled_from(["a", "b", ""]) | JSON,
                            "maxPriority": INTS | JSON,
                            "tier": st.sampled_from(TIERS) | JSON,
                            "users": st.lists(st.sampled_from(USERS)) | JSON,
                        },
                    ),
                    max_size=3,
                )
                | JSON,
                "trusted": st.fixed_dictionaries({}, optional={"users": st.lists(TEXT, max_size=2)}) | JSON,
            },
        )
        | JSON,
    },
)


@PROPERTY
@given(spec=POLICY_SPECS)
def test_validate_policy_accepts_or_refuses_readably(spec: dict[str, Any]) -> None:
    try:
        validate_policy(spec)
    except Refused as err:
        event("refused")
        assert_readable(str(err), spec)
        return
    event("accepted")
    parsed = GpuPolicySpec.model_validate(spec)  # accepted: a policy the webhook's state will take
    parsed.admission.check_against(parsed.scoring())


@PROPERTY
@given(caller=CALLERS, setup=setups(), data=st.data())
def test_grant_is_the_best_over_matching_rules_in_any_order(
    caller: Caller, setup: tuple[AdmissionPolicy, Policy], data: st.DataObject
) -> None:
    adm, policy = setup
    granted = grant(caller, adm, policy)
    matching = [r for r in adm.rules if caller.matches(r)]
    assert granted.cap == max([adm.default_cap, *(r.max_priority for r in matching)])
    tiers = [adm.default_tier, *(r.tier for r in matching if r.tier is not None)]
    assert policy.tier_bonus[granted.tier] == max(policy.tier_bonus[t] for t in tiers)
    assert granted.trusted == caller.matches(adm.trusted)
    shuffled = adm.model_copy(update={"rules": data.draw(st.permutations(adm.rules))})
    again = grant(caller, shuffled, policy)
    assert (again.cap, policy.tier_bonus[again.tier], again.trusted) == (
        granted.cap,
        policy.tier_bonus[granted.tier],
        granted.trusted,
    )
