"""A GpuModel's ``spec.template``: a pod template for any model server, and what in it is gpulane's.

gpulane builds each backend pod from it, adding what makes it the lane's (gpulane/operator/pods.py); the
apiserver checks the pod it builds when the GpuModel is applied (a server-side dry run, reported on the
model's Accepted condition). docs/models.md says how the template and the shorthand fields combine.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator
from pydantic.config import JsonDict

from gpulane.api.contract import COMPONENT_LABEL, LANE_LABEL, MANAGED_BY, MODEL_LABEL
from gpulane.core.policy import CamelModel

SERVING_CONTAINER = "backend"
# What makes a pod a lane's backend is gpulane's: a template may not set it (docs/models.md).
OWNED_LABELS = (MANAGED_BY, COMPONENT_LABEL, LANE_LABEL, MODEL_LABEL)
OWNED_ANNOTATIONS = (LANE_LABEL, MODEL_LABEL)
PINNED = "the backend pod runs on its lane's node: set the GpuLane's nodeName or nodeSelector"
NOT_THE_TEMPLATES = "the name, namespace and owner of a backend pod are gpulane's"
NAME_THE_SERVER = f"name the serving container {SERVING_CONTAINER!r} (a template with one container serves with it)"


def _rules(*rules: tuple[str, str]) -> JsonDict:
    """CEL rules the apiserver checks when the GpuModel is applied."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


def _owned_keys(field: str, owned: tuple[str, ...]) -> tuple[str, str]:
    return (
        f"!has(self.{field}) || !self.{field}.exists(k, k in {list(owned)})",
        f"spec.template.metadata.{field}: {', '.join(owned)} are gpulane's (it finds its backend pods by them)",
    )


class TemplateMetadata(CamelModel):
    """A pod template's metadata: labels and annotations. The rest is declared only to be refused."""

    model_config = CamelModel.model_config | {
        "json_schema_extra": _rules(
            (
                "!has(self.name) && !has(self.generateName) && !has(self.namespace) && !has(self.ownerReferences)",
                f"spec.template.metadata: {NOT_THE_TEMPLATES}",
            ),
            _owned_keys("labels", OWNED_LABELS),
            _owned_keys("annotations", OWNED_ANNOTATIONS),
        )
    }

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    owner_references: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _nothing_of_gpulanes(self) -> TemplateMetadata:
        if any(v is not None for v in (self.name, self.generate_name, self.namespace, self.owner_references)):
            raise ValueError(f"spec.template.metadata: {NOT_THE_TEMPLATES}")
        for key, owned in (("labels", OWNED_LABELS), ("annotations", OWNED_ANNOTATIONS)):
            taken = sorted(set(getattr(self, key) or {}) & set(owned))
            if taken:
                raise ValueError(f"spec.template.metadata.{key}: {', '.join(taken)} are gpulane's")
        return self


class TemplateContainer(CamelModel):
    """A container of a pod template: a Kubernetes Container; gpulane reads its name and image."""

    model_config = CamelModel.model_config | {"extra": "allow"}

    name: str = Field(min_length=1, max_length=63)
    image: str | None = None


class TemplatePodSpec(CamelModel):
    """A pod template's spec: a Kubernetes PodSpec (every field kept), without what pins it to a node."""

    model_config = CamelModel.model_config | {
        "extra": "allow",
        "json_schema_extra": _rules(
            ("!has(self.nodeName)", f"spec.template.spec.nodeName is gpulane's: {PINNED}"),
            ("!has(self.nodeSelector)", f"spec.template.spec.nodeSelector is gpulane's: {PINNED}"),
            (
                "!has(self.containers) || size(self.containers) <= 1"
                f" || self.containers.exists(c, c.name == '{SERVING_CONTAINER}')",
                f"spec.template.spec.containers: {NAME_THE_SERVER}",
            ),
        ),
    }

    node_name: str | None = None
    node_selector: dict[str, str] | None = None
    containers: list[TemplateContainer] | None = None

    @model_validator(mode="after")
    def _not_pinned(self) -> TemplatePodSpec:
        for field, value in (("nodeName", self.node_name), ("nodeSelector", self.node_selector)):
            if value is not None:
                raise ValueError(f"spec.template.spec.{field} is gpulane's: {PINNED}")
        containers = self.containers or []
        if len(containers) > 1 and not any(c.name == SERVING_CONTAINER for c in containers):
            raise ValueError(f"spec.template.spec.containers: {NAME_THE_SERVER}")
        return self

    def serving(self) -> TemplateContainer | None:
        """The serving container: the one named ``backend``, or the only one."""
        containers = self.containers or []
        named = [c for c in containers if c.name == SERVING_CONTAINER]
        return named[0] if named else (containers[0] if len(containers) == 1 else None)


class PodTemplate(CamelModel):
    """A pod template (PodTemplateSpec): metadata with labels and annotations, and a PodSpec."""

    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: TemplatePodSpec = Field(default_factory=TemplatePodSpec)


IMAGE_RULE = (
    "has(self.image) || (has(self.template) && has(self.template.spec.containers)"
    " && (size(self.template.spec.containers) == 1 ? has(self.template.spec.containers[0].image)"
    f" : self.template.spec.containers.exists(c, c.name == '{SERVING_CONTAINER}' && has(c.image))))"
)
IMAGE_MESSAGE = "spec.image is required unless spec.template's serving container names an image"
