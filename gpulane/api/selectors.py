"""Kubernetes label selectors (``matchLabels`` and ``matchExpressions``), as the API documents them, for the
objects gpulane selects itself: a GpuModel's ``laneSelector`` picks the GpuLanes that may serve it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_validator

from gpulane.core.policy import CamelModel

LabelName = str  # validated by the apiserver on the selected objects; here only compared


class SelectorRequirement(CamelModel):
    key: LabelName = Field(min_length=1, max_length=317)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> SelectorRequirement:
        needs = self.operator in ("In", "NotIn")
        if needs and not self.values:
            raise ValueError(f"{self.operator} needs values (key {self.key!r})")
        if not needs and self.values:
            raise ValueError(f"{self.operator} takes no values (key {self.key!r})")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "In":
                return value is not None and value in (self.values or [])
            case "NotIn":
                return value is None or value not in (self.values or [])
            case "Exists":
                return value is not None
            case _:
                return value is None


class LabelSelector(CamelModel):
    """Every ``matchLabels`` pair and every ``matchExpressions`` requirement must hold; an empty one matches all."""

    match_labels: dict[str, str] | None = Field(default=None, max_length=64)
    match_expressions: list[SelectorRequirement] | None = Field(default=None, max_length=64)

    def matches(self, labels: Mapping[str, str]) -> bool:
        pairs = all(labels.get(k) == v for k, v in (self.match_labels or {}).items())
        return pairs and all(r.matches(labels) for r in self.match_expressions or [])
