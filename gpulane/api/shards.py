"""Shards: operators that each own a set of lanes and models, chosen by the label ``gpulane.io/shard``.

A GpuLane and a GpuModel belong to the shard their label names, or to the default shard without one. An
operator started with ``--shard NAME`` watches only its lanes, its backend pods, and the GpuJobs and GpuChains
labelled for it; the default operator watches those without the label. Each shard leads through a Lease of its
own, so shards never wait on each other. A model belongs to exactly one shard, so two shards never dispatch the
same job. Every operator sees every GpuModel, to know where a job belongs: one that arrives in the wrong shard
(nobody labels a job; the bridge, kubectl and the chains create them unlabelled) is handed on by setting its
label to its model's shard (``docs/operations.md``, "Shards").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpulane.api.contract import Body

SHARD_LABEL = "gpulane.io/shard"
HANDED_TO_SHARD = "HandedToShard"  # the reason of a job's Dispatched=False while it goes to its model's shard
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")  # a label value that also fits a Lease's name
LEASE_PREFIX = "gpulane-operator"


def shard_of(body: Body) -> str | None:
    """The shard an object's label names; None for the default shard."""
    return ((body.get("metadata") or {}).get("labels") or {}).get(SHARD_LABEL) or None


def described(shard: str | None) -> str:
    return "the default shard" if shard is None else f"shard {shard}"


@dataclass(frozen=True, slots=True)
class Shard:
    """The shard an operator serves: ``name`` None is the default shard (objects without the label)."""

    name: str | None = None

    def __post_init__(self) -> None:
        if self.name is not None and not _NAME.match(self.name):
            raise ValueError(
                f"shard name {self.name[:60]!r}: lowercase letters, digits and '-', at most 42 characters, "
                "starting and ending with a letter or digit"
            )

    @property
    def selector(self) -> str:
        """The label selector of this shard's objects."""
        return f"!{SHARD_LABEL}" if self.name is None else f"{SHARD_LABEL}={self.name}"

    @property
    def lease(self) -> str:
        """The Lease its replicas elect a leader through."""
        return LEASE_PREFIX if self.name is None else f"{LEASE_PREFIX}-{self.name}"

    def owns(self, body: Body) -> bool:
        return shard_of(body) == self.name

    def labels(self) -> dict[str, str]:
        """The label that puts an object this shard creates (a backend pod, a chain's step) in its watch."""
        return {} if self.name is None else {SHARD_LABEL: self.name}
