"""Who may ask for what, as written in ``GpuPolicy.spec.admission``: priority caps, tiers and trust.

These are the policy's models; ``gpulane.admission.rules`` decides with them (see its module doc for
how rules combine).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gpulane.core.policy import CamelModel, Policy, PolicyError
from gpulane.core.priority import shown


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
    # Whose fair share a job counts against when it names no member: its creator ("user"), or its
    # namespace ("namespace": a namespace admin's ServiceAccounts then share one share, not one each).
    default_member: Literal["user", "namespace"] = "user"
    # At most this many jobs of one namespace wait at once; more are failed on arrival (NamespaceQueueFull)
    # by the operator. Unset: no limit.
    max_pending_per_namespace: int | None = Field(default=None, ge=1)
    # At most this many jobs of one member wait at once in one namespace (MemberQueueFull). The bridge's calls
    # are all jobs of its namespace, one member per key: this cap is each key's, where the namespace's is one
    # for every key together. Unset: no limit.
    max_pending_per_member: int | None = Field(default=None, ge=1)

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
