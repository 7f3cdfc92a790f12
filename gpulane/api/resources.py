"""The gpulane.io/v1alpha1 resources as pydantic models: the source of ``crds/*.yaml``.

The operator validates specs with these same models, so what the apiserver's schema admits and what
the operator accepts cannot drift apart. Rules that need another object (the policy's tiers, whether
a GpuModel exists) are checked by the operator and reported on the job's status.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, ValidationError, model_validator
from pydantic.config import JsonDict

from gpulane.api.admission import AdmissionPolicy
from gpulane.api.pod_templates import IMAGE_MESSAGE, IMAGE_RULE, PodTemplate
from gpulane.api.retention import MAX_TTL_SECONDS, Retention
from gpulane.api.routes import PLAIN_PATH, UPSTREAM, UPSTREAM_PATH, JobMethod, fixed_routes, job_route, routed_for_jobs
from gpulane.api.run_limits import MAX_RUN_SECONDS, RunLimits
from gpulane.api.selectors import LabelSelector
from gpulane.core.policy import CamelModel, Policy
from gpulane.core.validation import describe

GROUP = "gpulane.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# A Kubernetes object name (DNS-1123 subdomain), because a job's model names a GpuModel object.
OBJECT_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"

# Absolute bounds, kept by the apiserver itself even without the webhook; policies bound further.
PRIORITY_LIMIT = 1_000_000
PRIORITY_RULE = (
    f"type(self) == int ? (self >= -{PRIORITY_LIMIT} && self <= {PRIORITY_LIMIT}) : "
    "(self in ['interactive', 'normal', 'batch'] || self.matches('^[+-]?[0-9]{1,6}$'))"
)
PRIORITY_MESSAGE = (
    f"priority must be an integer in [-{PRIORITY_LIMIT}, {PRIORITY_LIMIT}] or one of interactive, normal, batch"
)

# Bounded, so that status objects stay small however long the queue and however many dispatches.
STORY_LIMIT = 20
HISTORY_LIMIT = 50
# Marks a model that the CRDs store as it comes, its fields unwalked: the apiserver coerces, prunes, defaults and
# validates every field of an object on each write of it, and a job's story of 20 dispatch records made each later
# write of the job cost it 3.6 MiB instead of 1.7 (docs/benchmarks.md, "what a job's story costs each write of it").
OPAQUE = "x-gpulane-opaque"

Phase = Literal["Pending", "Dispatching", "Running", "Succeeded", "Failed", "Cancelled"]
TERMINAL_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "Cancelled"})


def immutable(what: str) -> JsonDict:
    """A CEL transition rule: the apiserver refuses any change to the field once it is set."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": f"{what} is immutable"}]}


class Condition(CamelModel):
    """A Kubernetes API condition (metav1.Condition)."""

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(default=None, ge=0)


Conditions = list[Condition]
CONDITIONS_FIELD = Field(
    default=None,
    json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
)
TIME_FORMAT: JsonDict = {"format": "date-time"}


# -- GpuJob -------------------------------------------------------------------------------------


ROUTE_MESSAGE = "method and path must be a route the bridge routes (docs/bridge.md), or /upstream/<model>/<path>"
ROUTE_RULE = (
    f"self.path.startsWith('{UPSTREAM}') ? self.path.matches('{UPSTREAM_PATH}')"
    f" : (self.method + ' ' + self.path) in {fixed_routes()!r}"
)
UPSTREAM_MODEL_MESSAGE = "request.path: an /upstream path names the job's own model: /upstream/<model>/<path>"


def upstream_model_rule(request: str) -> str:
    """CEL: the request at ``request`` (relative to a spec with ``model``) reaches no other model's server."""
    return f"!{request}.path.startsWith('{UPSTREAM}') || {request}.path.startsWith('{UPSTREAM}' + self.model + '/')"


class JobRequest(CamelModel):
    """A call that gpulane sends for jobs submitted with kubectl and for a chain's steps: any route the
    bridge routes (``api/routes.py``), with a JSON body (a form route's fields, docs/chains.md)."""

    model_config = CamelModel.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": [{"rule": ROUTE_RULE, "message": ROUTE_MESSAGE}]}
    }

    method: JobMethod = "POST"
    # Segments of plain characters: no "." or ".." (the executor's client would resolve them) and no empty one.
    path: str = Field(pattern=PLAIN_PATH, max_length=256)
    body: dict[str, Any] = Field(default_factory=dict)
    # Where the answer goes: a ConfigMap (at most 900 KiB), or a file on the executor's results volume
    # (a video, say: streamed, no cap beyond the volume's), read back with `gpulane result`.
    output: Literal["configMap", "volume"] = "configMap"

    @model_validator(mode="after")
    def _routed(self) -> JobRequest:
        if not routed_for_jobs(self.method, self.path):
            raise ValueError(f"{self.method} {self.path}: {ROUTE_MESSAGE}")
        return self


class GpuJobSpec(CamelModel):
    model_config = CamelModel.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": [
            {"rule": f"!has(self.request) || ({upstream_model_rule('self.request')})",
             "message": UPSTREAM_MODEL_MESSAGE},
            # The field rule only sees changes of a set value; these also refuse adding or removing it.
            {"rule": "has(self.member) == has(oldSelf.member)", "message": "spec.member is immutable"},
            {"rule": "has(self.tier) == has(oldSelf.tier)", "message": "spec.tier is immutable"},
        ]}
    }  # fmt: skip

    model: str = Field(min_length=1, max_length=253, pattern=OBJECT_NAME, json_schema_extra=immutable("model"))
    # An integer, or an alias (interactive, normal, batch) that the operator resolves.
    priority: StrictInt | str = Field(
        default=0,
        json_schema_extra={
            "x-kubernetes-validations": [
                *immutable("priority")["x-kubernetes-validations"],  # type: ignore[misc]
                {
                    "rule": PRIORITY_RULE,
                    "message": PRIORITY_MESSAGE,
                },
            ]
        },
    )
    # Unset means "free" without the webhook; with it, the caller's tier from the policy's rules.
    tier: str | None = Field(default=None, min_length=1, max_length=63, json_schema_extra=immutable("tier"))
    # Whose fair share the job counts against. The webhook sets it at creation (the caller's user name, or the
    # namespace with admission.defaultMember: namespace); without a webhook, the operator uses the namespace.
    member: str | None = Field(default=None, min_length=1, max_length=253, json_schema_extra=immutable("member"))
    max_run_seconds: int | None = Field(default=None, ge=1, le=MAX_RUN_SECONDS)
    # The submitter's estimate, used for other jobs' start-time estimates instead of the model's average.
    expected_run_seconds: int | None = Field(default=None, ge=0, le=MAX_RUN_SECONDS)
    # How long the caller waits for the job to start: still waiting then, it fails with QueueTimeout. The
    # policy's band default applies too; the smaller one wins.
    queue_timeout_seconds: int | None = Field(
        default=None, ge=1, le=MAX_RUN_SECONDS, json_schema_extra=immutable("queueTimeoutSeconds")
    )
    request: JobRequest | None = None
    # Seconds after the job ended before the operator deletes it (with its result ConfigMap), as on batch/v1
    # Jobs; unset: the GpuPolicy's ttlSecondsAfterFinished for its source.
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=MAX_TTL_SECONDS)

    @model_validator(mode="after")
    def _own_upstream(self) -> GpuJobSpec:
        if self.request is not None:
            job_route(self.request.method, self.request.path, self.model)
        return self


class ScoreTerms(CamelModel):
    priority: int
    tier: int
    affinity: float  # a share of the policy's affinityBonus where a switch costs less than a new pod
    aging: float
    total: float


class DispatchRecord(CamelModel):
    """One dispatch, as lanes remember it and as jobs that waited meanwhile tell it (``gpulane why``)."""

    # Up to HISTORY_LIMIT in a lane's history, carried by every write of the lane: stored unwalked (only the
    # operator writes them, as the admission policies enforce).
    model_config = CamelModel.model_config | {"json_schema_extra": {OPAQUE: True}}

    job: str
    at: str = Field(json_schema_extra=TIME_FORMAT)
    lane: str
    model: str
    load: bool
    member: str | None = None  # absent for a job of another namespace (its name is hidden too)
    priority: int
    tier: str
    score: ScoreTerms
    changed_by: dict[str, str] | None = None  # term -> the job that would have won without it
    # Once its load is done: how long it took, and whether the lane's server switched to the model (no new pod).
    load_seconds: float | None = Field(default=None, ge=0)
    switch: bool | None = None


def readable_records(items: Any) -> tuple[list[dict[str, Any]], int]:
    """Those of ``items`` (a story's ranAhead, a lane's history) in the shape of a DispatchRecord, and how many are
    not: the CRDs store records unchecked (``OPAQUE``), so whoever reads them checks them."""
    if not isinstance(items, list):
        return [], 0 if items is None else 1
    good = []
    for item in items:
        try:
            DispatchRecord.model_validate(item)
        except ValidationError:
            continue
        good.append(item)
    return good, len(items) - len(good)


class Story(CamelModel):
    """What a job's own story needs once it has run: the dispatches that went ahead while it waited."""

    # Carried by every later write of the job: stored unwalked, list and all (a list's items are walked one by one
    # even when each is opaque), and written by the operator alone.
    model_config = CamelModel.model_config | {"json_schema_extra": {OPAQUE: True}}

    queued_at: str = Field(json_schema_extra=TIME_FORMAT)
    ran_ahead: list[DispatchRecord]  # the latest ones, at most STORY_LIMIT
    ran_ahead_total: int
    load: bool  # it had to wait for its model to load


def _written_once(field: str, *, requeue: bool) -> JsonDict:
    """A status field that, once set, keeps its value: a dispatch happens once, to one lane and pod. With
    ``requeue`` the field may go when a Dispatching job goes back to Pending (its load yielded)."""
    kept = f"(has(self.{field}) && self.{field} == oldSelf.{field})"
    if requeue:
        back = "has(self.phase) && self.phase == 'Pending' && has(oldSelf.phase) && oldSelf.phase == 'Dispatching'"
        kept = f"({kept} || ({back}))"
    return {
        "rule": f"!has(oldSelf.{field}) || {kept}",
        "message": f"status.{field} is written once" + (" (a yielded load's requeue aside)" if requeue else ""),
    }


class GpuJobStatus(CamelModel):
    # Whoever writes: an ended job stays ended (a finished job turned Running would take a lane), and what a
    # dispatch wrote stays.
    model_config = CamelModel.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": [
            {"rule": f"!has(oldSelf.phase) || !(oldSelf.phase in {sorted(TERMINAL_PHASES)}) || "
                     "(has(self.phase) && self.phase == oldSelf.phase)",
             "message": "status.phase is final once Succeeded, Failed or Cancelled"},
            *(_written_once(field, requeue=field != "endpoint") for field in ("lane", "endpoint", "dispatchedAt")),
            _written_once("submittedAt", requeue=False),
        ]}
    }  # fmt: skip

    phase: Phase | None = None
    position: int | None = Field(default=None, ge=1)
    # True when position and estimatedStart are exact; beyond the first jobs of a lane they are rounded.
    position_exact: bool | None = None
    estimated_start: str | None = Field(default=None, json_schema_extra=TIME_FORMAT)
    # When the forecast that gave position and estimatedStart ran: far jobs' rounded ones are rewritten only
    # when their bucket changes, and a long queue's whole forecast runs less often than its head's.
    estimated_at: str | None = Field(default=None, json_schema_extra=TIME_FORMAT)
    # The lane the forecast expects it to start on (its position is this lane's); unset when none is online.
    expected_lane: str | None = None
    score: ScoreTerms | None = None
    waited: str | None = None
    # When the operator first saw the job (to the millisecond): its place in arrival order, across restarts.
    submitted_at: str | None = Field(default=None, json_schema_extra=TIME_FORMAT)
    lane: str | None = None
    pod: str | None = None
    endpoint: str | None = None
    dispatched_at: str | None = Field(default=None, json_schema_extra=TIME_FORMAT)
    started_at: str | None = Field(default=None, json_schema_extra=TIME_FORMAT)
    finished_at: str | None = Field(default=None, json_schema_extra=TIME_FORMAT)
    reason: str | None = None
    message: str | None = None
    # Written by the executor when it reports completion (see docs/job-lifecycle.md).
    result: dict[str, Any] | None = None
    story: Story | None = None
    conditions: Conditions | None = CONDITIONS_FIELD
    observed_generation: int | None = None


# -- GpuModel -----------------------------------------------------------------------------------


class EnvVar(CamelModel):
    name: str = Field(min_length=1, max_length=256)
    value: str = ""


class Resources(CamelModel):
    requests: dict[str, int | str] | None = None
    limits: dict[str, int | str] | None = None


# A name a call may use for a GpuModel: any model name a client sends, bounded like an object name.
ModelAlias = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^\S(.*\S)?$")]
BodyField = Annotated[str, Field(min_length=1, max_length=128)]
# A call's fields that are gpulane's to write: which model, and (with priorityPassthrough) its priority.
OWN_FIELDS = ("model", "priority")


class ModelFilters(CamelModel):
    """What the bridge changes in a call's JSON body before the server gets it (llama-swap's ``filters``):
    ``stripParams`` removes those fields, then ``setParams`` sets these (an operator's choice wins over the
    caller's). ``model`` and ``priority`` are gpulane's (useModelName, priorityPassthrough): stripping them is
    refused, and the bridge never sets them from ``setParams``."""

    model_config = CamelModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": f"!has(self.stripParams) || !self.stripParams.exists(p, p in {list(OWN_FIELDS)})",
                 "message": "filters.stripParams: model and priority are gpulane's"},
            ]
        }
    }  # fmt: skip

    strip_params: list[BodyField] | None = Field(default=None, max_length=64)
    set_params: dict[str, Any] | None = Field(default=None, json_schema_extra={"maxProperties": 64})

    @model_validator(mode="after")
    def _not_ours(self) -> ModelFilters:
        if taken := sorted(set(self.strip_params or ()) & set(OWN_FIELDS)):
            raise ValueError(f"filters.stripParams: {', '.join(taken)} are gpulane's")
        return self


DottedField = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[^.]+(\.[^.]+)*$")]


class Ticket(CamelModel):
    """A server that answers a call at once with a ticket and goes on working (ComfyUI's ``POST /prompt``):
    gpulane polls until the work is done, the job holds its lane meanwhile, and the final poll's answer is the
    call's. The defaults are ComfyUI's (``server.py``): ``prompt_id`` in the first answer, ``GET
    /history/{prompt_id}`` answering ``{}`` until the prompt's entry appears, whose ``status.status_str`` says
    ``error`` when the work failed. Field paths are dotted; ``{ticket}`` stands for the ticket."""

    path: str = Field(default="/prompt", pattern=PLAIN_PATH, max_length=256)  # the server's path (POST) that answers so
    field: DottedField = "prompt_id"
    poll: str = Field(default="/history/{ticket}", pattern=r"^/[^?#]*\{ticket\}[^?#]*$", max_length=256)
    done_field: DottedField = "{ticket}"  # in the poll's answer: there (and not null) once the work is done
    error_field: DottedField | None = "{ticket}.status.status_str"
    error_values: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=lambda: ["error"], max_length=16)
    interval_seconds: float = Field(default=1.0, ge=0.1, le=60)
    timeout_seconds: int = Field(default=3600, ge=1, le=MAX_RUN_SECONDS)  # the work's own limit, from the ticket


class ModelRouter(CamelModel):
    """This model's pod is a server that holds the GpuModels naming it in their ``server`` and loads and unloads
    them on the operator's word (docs/models.md, servers that hold several models)."""

    protocol: Literal["LlamaServerRouter"]
    # At most this many held at once (llama-server's --models-max), whatever the lane's memory allows.
    max_loaded: int = Field(default=4, ge=1, le=64)


class GpuModelSpec(CamelModel):
    model_config = CamelModel.model_config | {
        "json_schema_extra": {"x-kubernetes-validations": [
            {"rule": f"has(self.server) || ({IMAGE_RULE})", "message": f"{IMAGE_MESSAGE}, or spec.server names its "
             "server"},
            {"rule": "!(has(self.server) && has(self.router))", "message": "a model is held by a server or is one, "
             "not both"},
            {"rule": "!has(self.preset) || has(self.server)", "message": "spec.preset is the model's part of its "
             "server's preset: it needs spec.server"},
        ]}
    }  # fmt: skip

    # The serving container's image; may be left to spec.template's serving container.
    image: str | None = Field(default=None, min_length=1, max_length=512)
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None
    port: int = Field(default=8000, ge=1, le=65535)
    readiness_path: str = Field(default="/health", pattern=r"^/", max_length=256)
    load_timeout_seconds: int = Field(default=600, ge=1, le=86400)
    max_concurrency: int = Field(default=1, ge=1, le=1024)
    resources: Resources | None = None
    pod_annotations: dict[str, str] | None = None
    # Starting points for estimates until gpulane has observed real loads and runs.
    expected_load_seconds: int | None = Field(default=None, ge=0, le=86400)
    expected_run_seconds: int | None = Field(default=None, ge=0, le=MAX_RUN_SECONDS)
    # After this many seconds with no job for it, a lane stops the model's pod and gives the GPU back
    # (llama-swap's ttl); the next job loads it again. Unset: it stays loaded until another model needs the lane.
    ttl_seconds: int | None = Field(default=None, ge=1, le=604800)
    # How to run any model server: volumes (weights), /dev/shm, env from Secrets, runtimeClassName, probes,
    # a security context... image, command, args, env and port above are a shorthand for its serving
    # container, and win over it (docs/models.md).
    template: PodTemplate | None = None
    # What the bridge does with the calls (docs/models.md#what-the-bridge-sends): other names a call may
    # use, the name the server expects in the body, and the caller's priority in the body's "priority".
    aliases: list[ModelAlias] | None = Field(default=None, max_length=32)
    use_model_name: str | None = Field(default=None, min_length=1, max_length=253)
    priority_passthrough: Literal["LowerFirst", "HigherFirst"] | None = None
    filters: ModelFilters | None = None
    # The server answers with a ticket and works on (ComfyUI): `ticket: {}` for ComfyUI's protocol.
    ticket: Ticket | None = None
    # Only the GpuLanes whose labels match may serve it (docs/models.md, laneSelector); unset: any lane.
    lane_selector: LabelSelector | None = None
    # Servers that hold several models (issue 36): this model's pod is one (router), or the GpuModel named in
    # server holds it, loading it with its section of the server's preset (llama-server's flags, without dashes).
    router: ModelRouter | None = None
    server: str | None = Field(default=None, min_length=1, max_length=253)
    preset: dict[str, str] | None = Field(default=None, max_length=64)
    # What it takes of a lane's GPU memory (spec.memoryMib) while loaded, to stay loaded beside others.
    memory_mib: int | None = Field(default=None, ge=0, le=10_000_000)
    # A starting point for its switch: a load by its running server, no new pod (then learned).
    expected_switch_seconds: int | None = Field(default=None, ge=0, le=86400)

    @model_validator(mode="after")
    def _an_image(self) -> GpuModelSpec:
        serving = self.template.spec.serving() if self.template else None
        if self.server is None and self.image is None and not (serving and serving.image):
            raise ValueError(IMAGE_MESSAGE)
        if self.server is not None and self.router is not None:
            raise ValueError("a model is held by a server or is one, not both")
        if self.preset is not None and self.server is None:
            raise ValueError("spec.preset is the model's part of its server's preset: it needs spec.server")
        return self


class GpuModelStatus(CamelModel):
    load_seconds: float | None = None
    run_seconds: float | None = None
    switch_seconds: float | None = None  # a load by the lane's running server (spec.server), learned apart
    loads: int | None = None
    runs: int | None = None
    switches: int | None = None
    lanes: list[str] | None = None  # the GpuLanes its laneSelector matches now (only with a laneSelector)
    conditions: Conditions | None = CONDITIONS_FIELD
    observed_generation: int | None = None


# -- GpuLane ------------------------------------------------------------------------------------


class ReservedFor(CamelModel):
    """Who a lane is kept for: their jobs go first on it; others borrow it while none of theirs waits."""

    namespaces: list[str] = Field(min_length=1, max_length=64)


class GpuLaneSpec(CamelModel):
    node_name: str | None = Field(default=None, min_length=1, max_length=253)
    node_selector: dict[str, str] | None = None
    resource: str = Field(default="nvidia.com/gpu", min_length=1, max_length=253)
    count: int = Field(default=1, ge=1, le=64)
    tolerations: list[dict[str, Any]] | None = None
    # The container runtime of its node's GPUs (nvidia on k3s and the GPU Operator): every backend pod of the
    # lane runs with it, unless the model's template names its own.
    runtime_class_name: str | None = Field(default=None, min_length=1, max_length=253)
    # Kept for these namespaces' jobs (docs/policy.md, reserved lanes); unset: every job is alike here.
    reserved_for: ReservedFor | None = None
    # Its GPU memory: models of one server whose spec.memoryMib sum fits stay loaded together; unset: one at a time.
    memory_mib: int | None = Field(default=None, ge=1, le=10_000_000)


class ServedClock(CamelModel):
    member: str
    band: int
    at: str = Field(json_schema_extra=TIME_FORMAT)


class UsageEntry(CamelModel):
    """A (member, band)'s decayed GPU usage as of ``at``: fair share by GPU time survives a restart."""

    member: str
    band: int
    gpu_seconds: float = Field(ge=0)
    at: str = Field(json_schema_extra=TIME_FORMAT)


class TeamUsageEntry(CamelModel):
    """A team's decayed GPU usage in a band as of ``at``: the upper level of fair share. ``namespace`` names the
    team: a namespace, or a team of the GpuPolicy's ``fairShareTeams``."""

    namespace: str
    band: int
    gpu_seconds: float = Field(ge=0)
    at: str = Field(json_schema_extra=TIME_FORMAT)


class GpuLaneStatus(CamelModel):
    resident_model: str | None = None  # the model serving (a server's: the one it switched to last)
    loaded: list[str] | None = None  # the other models its server holds, ready to switch to
    pod: str | None = None
    ready: bool | None = None
    running: list[str] | None = None
    queue_depth: dict[str, int] | None = None
    last_served: list[ServedClock] | None = None
    usage: list[UsageEntry] | None = None
    team_usage: list[TeamUsageEntry] | None = None
    history: list[DispatchRecord] | None = None  # the lane's latest dispatches, at most HISTORY_LIMIT
    conditions: Conditions | None = CONDITIONS_FIELD
    observed_generation: int | None = None


# -- GpuPolicy ----------------------------------------------------------------------------------


class InvalidPolicy(ValueError):
    """A GpuPolicy spec that cannot take effect; the message says which field and why, for a person."""


class GpuPolicySpec(Policy):
    """The scoring policy's fields, plus who may ask for what (enforced by the admission webhook).

    Validating one checks everything a policy must satisfy: the core's invariant and bounds (``Policy``'s
    own validators), and admission rules that fit them.
    """

    admission: AdmissionPolicy = Field(default_factory=AdmissionPolicy)
    run_limits: RunLimits = Field(default_factory=RunLimits)
    ttl_seconds_after_finished: Retention = Field(default_factory=Retention)

    @classmethod
    def checked(cls, spec: Any) -> GpuPolicySpec:
        """The webhook's and the operator's one check of a policy (the operator's covers clusters with no webhook)."""
        try:
            return cls.model_validate(spec)
        except ValidationError as err:
            raise InvalidPolicy(describe(err, "spec")) from None

    @model_validator(mode="after")
    def _admission_fits(self) -> GpuPolicySpec:
        self.admission.check_against(self.scoring())
        return self

    def scoring(self) -> Policy:
        """The core's policy: every field but ``admission``, ``runLimits`` and ``ttlSecondsAfterFinished``."""
        exclude = {"admission", "run_limits", "ttl_seconds_after_finished"}
        return Policy.model_validate(self.model_dump(by_alias=True, exclude=exclude))


class GpuPolicyStatus(CamelModel):
    conditions: Conditions | None = CONDITIONS_FIELD
    observed_generation: int | None = None
