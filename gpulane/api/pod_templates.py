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
# A backend pod runs whatever image a GpuModel names, so it gets nothing of the host's or the cluster's: no
# ServiceAccount (its token would carry that account's rights), no host namespaces, no privileged container.
NO_ACCOUNT = "a backend pod runs with no ServiceAccount and no token (it would carry that account's rights)"
NO_HOST = "a backend pod shares nothing of its node's (network, processes, IPC)"
NO_PRIVILEGE = "a backend pod runs no privileged container (it would own its node)"
# Host paths a model server has no business with: the host's root, its kernel's and runtime's interfaces, the
# kubelet's and the container runtimes' state (their sockets run any container as root).
HOST_PATHS_REFUSED = ("/proc", "/sys", "/dev", "/etc", "/boot", "/root", "/run", "/var/run", "/var/lib/kubelet",
                      "/var/lib/docker", "/var/lib/containerd", "/var/lib/rancher")  # fmt: skip


def refused_host_path(path: str) -> str | None:
    """Why a backend pod may not mount host path ``path``, or None. A path with ``.`` or ``..`` segments or an
    empty one is refused as such: the kubelet would resolve it, a prefix check would not."""
    parts = path.split("/")
    if not path.startswith("/") or any(p in (".", "..") for p in parts) or "//" in path:
        return "a host path is absolute and plain (no '.', '..' or '//')"
    normal = path.rstrip("/") or "/"
    if normal == "/":
        return "the host's whole filesystem"
    under = next((p for p in HOST_PATHS_REFUSED if normal == p or normal.startswith(p + "/")), None)
    return None if under is None else f"{under} is the host's own (its kernel, runtime or kubelet)"


def _host_path_rule() -> tuple[str, str]:
    """refused_host_path as one regular expression per volume (the apiserver's CEL cost budget)."""
    own = "|".join(d.lstrip("/") for d in HOST_PATHS_REFUSED)
    refused = f"^/*$|^/({own})(/.*)?$|(^|/)[.][.]?(/|$)|//|^[^/]"
    rule = f"!has(self.volumes) || self.volumes.all(v, !has(v.hostPath) || !v.hostPath.path.matches('{refused}'))"
    return rule, (
        "spec.template.spec.volumes: a hostPath is absolute and plain, and not the host's own: not /, "
        + ", ".join(HOST_PATHS_REFUSED)
    )


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


class SecurityContext(CamelModel):
    """A container's securityContext; only ``privileged`` is gpulane's concern (refused)."""

    model_config = CamelModel.model_config | {"extra": "allow"}

    privileged: bool | None = None


class TemplateContainer(CamelModel):
    """A container of a pod template: a Kubernetes Container; gpulane reads its name and image."""

    model_config = CamelModel.model_config | {
        "extra": "allow",
        "json_schema_extra": _rules(
            ("!has(self.securityContext) || !has(self.securityContext.privileged) || !self.securityContext.privileged",
             f"securityContext.privileged: {NO_PRIVILEGE}"),
        ),
    }  # fmt: skip

    name: str = Field(min_length=1, max_length=63)
    image: str | None = None
    security_context: SecurityContext | None = None

    @model_validator(mode="after")
    def _not_privileged(self) -> TemplateContainer:
        if self.security_context is not None and self.security_context.privileged:
            raise ValueError(f"container {self.name!r}: securityContext.privileged: {NO_PRIVILEGE}")
        return self


class HostPath(CamelModel):
    model_config = CamelModel.model_config | {"extra": "allow"}

    path: str = Field(max_length=1024)


class TemplateVolume(CamelModel):
    """A volume of a pod template; gpulane reads a hostPath's path (the host's own are refused)."""

    model_config = CamelModel.model_config | {"extra": "allow"}

    name: str
    host_path: HostPath | None = None


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
            ("!has(self.serviceAccountName) && !has(self.serviceAccount)",
             f"spec.template.spec.serviceAccountName: {NO_ACCOUNT}"),
            ("!has(self.automountServiceAccountToken) || !self.automountServiceAccountToken",
             f"spec.template.spec.automountServiceAccountToken: {NO_ACCOUNT}"),
            ("!(has(self.hostNetwork) && self.hostNetwork) && !(has(self.hostPID) && self.hostPID)"
             " && !(has(self.hostIPC) && self.hostIPC)",
             f"spec.template.spec.hostNetwork, hostPID and hostIPC: {NO_HOST}"),
            _host_path_rule(),
        ),
    }  # fmt: skip

    node_name: str | None = None
    node_selector: dict[str, str] | None = None
    # Bounded for the apiserver's CEL cost budget: more than any model server's pod needs.
    containers: list[TemplateContainer] | None = Field(default=None, max_length=16)
    init_containers: list[TemplateContainer] | None = Field(default=None, max_length=16)
    volumes: list[TemplateVolume] | None = Field(default=None, max_length=64)
    service_account_name: str | None = None
    service_account: str | None = None
    automount_service_account_token: bool | None = None
    host_network: bool | None = None
    host_pid: bool | None = Field(default=None, alias="hostPID")
    host_ipc: bool | None = Field(default=None, alias="hostIPC")

    @model_validator(mode="after")
    def _not_pinned(self) -> TemplatePodSpec:
        for field, value in (("nodeName", self.node_name), ("nodeSelector", self.node_selector)):
            if value is not None:
                raise ValueError(f"spec.template.spec.{field} is gpulane's: {PINNED}")
        containers = self.containers or []
        if len(containers) > 1 and not any(c.name == SERVING_CONTAINER for c in containers):
            raise ValueError(f"spec.template.spec.containers: {NAME_THE_SERVER}")
        return self

    @model_validator(mode="after")
    def _nothing_of_the_hosts(self) -> TemplatePodSpec:
        if self.service_account_name is not None or self.service_account is not None:
            raise ValueError(f"spec.template.spec.serviceAccountName: {NO_ACCOUNT}")
        if self.automount_service_account_token:
            raise ValueError(f"spec.template.spec.automountServiceAccountToken: {NO_ACCOUNT}")
        for field, value in (("hostNetwork", self.host_network), ("hostPID", self.host_pid),
                             ("hostIPC", self.host_ipc)):  # fmt: skip
            if value:
                raise ValueError(f"spec.template.spec.{field}: {NO_HOST}")
        for volume in self.volumes or []:
            if volume.host_path is not None and (why := refused_host_path(volume.host_path.path)):
                raise ValueError(f"spec.template.spec.volumes[{volume.name}].hostPath {volume.host_path.path}: {why}")
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
