"""Who may ask for what: priority caps, tiers and trust, as written in ``GpuPolicy.spec.admission``.

Rules are **additive**, like RBAC: a caller gets the highest cap and the best tier that any rule
matching them grants, and the default cap when none matches. Adding a rule can therefore only widen
what someone may do; nobody loses a grant because a more specific rule also matches them, and the
answer never depends on the order of the rules. ``Grant`` names the rule that decided, so every
capped or refused job can say why.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulane.api.admission import AdmissionPolicy, Subjects
from gpulane.core.policy import Policy

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


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
