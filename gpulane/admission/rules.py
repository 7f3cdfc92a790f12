"""Who may ask for what: priority caps, tiers and trust, as written in ``GpuPolicy.spec.admission``.

Rules are **additive**, like RBAC: a caller gets the highest cap and the best tier that any rule
matching them grants, and the default cap when none matches. Adding a rule can therefore only widen
what someone may do; nobody loses a grant because a more specific rule also matches them, and the
answer never depends on the order of the rules. ``Grant`` names the rule that decided, so every
capped or refused job can say why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from gpulane.core.policy import CamelModel, Policy, PolicyError
from gpulane.core.priority import shown

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class Subjects(CamelModel):
    """Identities, as the apiserver reports them: user names, groups, ServiceAccounts (``ns/name``), namespaces."""

    users: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)
    service_accounts: list[str] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)


class Rule(Subjects):
    name: str = Field(min_length=1, max_length=63)
    max_priority: int
    # The tier of jobs from these callers; None leaves it to other rules or the default tier.
    tier: str | None = None


class AdmissionPolicy(CamelModel):
    mode: Literal["cap", "reject"] = "cap"
    default_cap: int = 0
    default_tier: str = "free"
    rules: list[Rule] = Field(default_factory=list)
    # May set spec.member and spec.tier themselves (the bridge's ServiceAccount, typically).
    trusted: Subjects = Field(default_factory=Subjects)

    @model_validator(mode="after")
    def _unique_names(self) -> AdmissionPolicy:
        names = [r.name for r in self.rules]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise PolicyError(f"admission rule names must be unique; repeated: {', '.join(duplicates)}")
        return self

    def check_against(self, policy: Policy) -> None:
        """Tiers must exist in the scoring policy, and caps must lie inside its priority bounds."""
        tiers = [("defaultTier", self.default_tier), *((f"rule {r.name!r}", r.tier) for r in self.rules)]
        for what, tier in tiers:
            if tier is None:
                continue
            try:
                policy.bonus_for_tier(tier)
            except PolicyError as err:
                raise PolicyError(f"admission {what}: {err}") from None
        low, high = policy.priority_bounds.min, policy.priority_bounds.max
        caps = [("defaultCap", self.default_cap), *((f"rule {r.name!r}", r.max_priority) for r in self.rules)]
        for what, cap in caps:
            if not low <= cap <= high:
                raise PolicyError(f"admission {what}: cap {shown(cap)} is outside priorityBounds [{low}, {high}]")


@dataclass(frozen=True, slots=True)
class Caller:
    """The identity of an admission request (``request.userInfo``) and the object's namespace."""

    username: str
    groups: tuple[str, ...] = ()
    namespace: str | None = None

    @property
    def service_account(self) -> str | None:
        """``ns/name`` for a ServiceAccount's token, else None."""
        if not self.username.startswith(SERVICE_ACCOUNT_PREFIX):
            return None
        namespace, _, name = self.username[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
        return f"{namespace}/{name}" if name else None

    def matches(self, subjects: Subjects) -> bool:
        return (
            self.username in subjects.users
            or any(g in subjects.groups for g in self.groups)
            or (self.service_account is not None and self.service_account in subjects.service_accounts)
            or (self.namespace is not None and self.namespace in subjects.namespaces)
        )


@dataclass(frozen=True, slots=True)
class Grant:
    cap: int
    cap_rule: str  # the name of the rule that set the cap, or "default cap"
    tier: str
    tier_rule: str
    trusted: bool


def grant(caller: Caller, admission: AdmissionPolicy, policy: Policy) -> Grant:
    """What ``caller`` may do: the best cap and tier over every matching rule (see the module doc)."""
    cap, cap_rule = admission.default_cap, "default cap"
    tier, tier_rule = admission.default_tier, "default tier"
    for rule in sorted(admission.rules, key=lambda r: r.name):  # ties go to the first name: order never matters
        if not caller.matches(rule):
            continue
        if rule.max_priority > cap:
            cap, cap_rule = rule.max_priority, rule.name
        if rule.tier is not None and policy.tier_bonus.get(rule.tier, -1) > policy.tier_bonus.get(tier, -1):
            tier, tier_rule = rule.tier, rule.name
    return Grant(cap, cap_rule, tier, tier_rule, caller.matches(admission.trusted))
