"""What happens to the dispatcher (events) and what it decides (dispatches)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulane.core.jobs import Job, ModelSpec
from gpulane.core.score import ScoreBreakdown


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    job: Job


@dataclass(frozen=True, slots=True)
class JobCancelled:
    """A pending job leaves the queue. Running jobs are never preempted by the core."""

    job_id: str


@dataclass(frozen=True, slots=True)
class JobFinished:
    job_id: str
    run_seconds: float | None = None  # observed, to learn the model's run time


@dataclass(frozen=True, slots=True)
class JobAdopted:
    """A job found already running on a lane (after a restart): it holds capacity."""

    job: Job
    lane: str
    started_at: float


@dataclass(frozen=True, slots=True)
class QueueServed:
    """A member's queue at ``priority``'s band was last served at ``at``.

    After a restart the shell replays pending jobs, then reports when each (member, band) was
    last served, so that a burst does not suddenly count its whole age (the burst pitfall).
    """

    member: str
    priority: int
    at: float


@dataclass(frozen=True, slots=True)
class UsageRestored:
    """A member's queue at ``priority``'s band had used ``gpu_seconds`` (decayed) as of ``at``.

    After a restart the shell reports each (member, band)'s persisted usage (``Ranking.usage``),
    so that fair share by GPU time does not start over. It sets the usage; replaying it is harmless.
    """

    member: str
    priority: int
    gpu_seconds: float
    at: float


@dataclass(frozen=True, slots=True)
class TeamUsageRestored:
    """A team's (a namespace's) GPU usage at ``priority``'s band, as ``UsageRestored`` is a member's: the upper
    level of fair share's tree survives a restart too."""

    team: str
    priority: int
    gpu_seconds: float
    at: float


@dataclass(frozen=True, slots=True)
class LaneUpdated:
    """A lane appeared, changed or went away; ``resident`` is the model actually loaded on it (serving), and
    ``loaded`` the other models its server holds beside it (None: as the core knows them, or none at all when
    nothing is resident: the lane's pod is gone)."""

    lane: str
    online: bool = True
    resident: str | None = None
    loaded: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class LaneMemory:
    """A lane's GPU memory, for the models of one server that stay loaded together while their memory fits
    (0: one model at a time). A lane first seen here is offline until LaneUpdated says."""

    lane: str
    memory_mib: int


@dataclass(frozen=True, slots=True)
class LaneReserved:
    """A lane is reserved for some teams (``Job.team``: namespaces), or for nobody (None). Their jobs go first on
    it; others borrow it while none of theirs waits, and are never preempted when one arrives."""

    lane: str
    owners: frozenset[str] | None


@dataclass(frozen=True, slots=True)
class LoadLost:
    """The pod a lane was loading its model in is gone (deleted, evicted, crashed) before it was ready.

    No job had started on it: each waits again in its place, once; a job whose load is lost a second
    time stays on the lane for the shell to fail. The lane has no model afterwards.
    """

    lane: str


@dataclass(frozen=True, slots=True)
class ModelLoaded:
    lane: str
    model: str
    load_seconds: float | None = None  # observed, to learn the model's load time (or its switch time)
    in_server: bool = False  # loaded by the lane's running server, not in a new pod: a switch


@dataclass(frozen=True, slots=True)
class ModelUpdated:
    """A model's spec changed (for example its concurrency)."""

    spec: ModelSpec


@dataclass(frozen=True, slots=True)
class ModelRemoved:
    """A model is gone (its GpuModel was deleted). A lane that holds it takes no new job and gives the model
    up once its jobs there end, at once when none run; its jobs in the queue are the shell's to park."""

    model: str


@dataclass(frozen=True, slots=True)
class UnloadAll:
    """Every lane gives its model up once its jobs end, at once when none runs, and takes no new job until
    then (llama-swap's ``/unload``); the next jobs load afresh."""


Event = (
    JobSubmitted
    | JobCancelled
    | JobFinished
    | JobAdopted
    | QueueServed
    | UsageRestored
    | TeamUsageRestored
    | LaneUpdated
    | LaneMemory
    | LaneReserved
    | LoadLost
    | ModelLoaded
    | ModelUpdated
    | ModelRemoved
    | UnloadAll
)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run ``job`` on ``lane``. ``load`` means the lane must load ``model`` first: in a new pod, replacing
    ``replaces`` (and every model its server held), or, ``in_server``, by the lane's running server, which
    first unloads ``evicts`` to make room and keeps its other models. A dispatch to a model the server holds
    already (``load`` false, ``replaces`` None) switches to it at no cost."""

    job: Job
    lane: str
    model: str
    load: bool
    replaces: str | None
    at: float
    score: ScoreBreakdown
    # Terms that changed the winner, each mapped to the job that would have won without it.
    changed_by: dict[str, str] = field(default_factory=dict)
    in_server: bool = False
    evicts: tuple[str, ...] = ()
    band: int = 0  # the centre of the priority band it was ranked in (its metrics' label)


@dataclass(frozen=True, slots=True)
class Unloaded:
    """``lane`` gave ``model`` up after ``idle`` seconds with no job for it (the model's ttl): the lane is empty,
    and the next job loads a model afresh."""

    lane: str
    model: str
    idle: float
    at: float


@dataclass(frozen=True, slots=True)
class Expired:
    """``job`` waited past its queue deadline and left the queue (Failed, reason QueueTimeout).

    ``lane`` is set when the job had been dispatched to a lane that was still loading its model:
    it never started, and its place on the lane is free again.
    """

    job: Job
    at: float
    deadline: float
    lane: str | None = None


@dataclass(frozen=True, slots=True)
class Requeued:
    """``job`` was dispatched to ``lane`` but never started there; it waits again (Pending).

    ``to`` is the newcomer the load yielded to, or None when the load was lost (``LoadLost``).
    """

    job: Job
    lane: str
    at: float
    to: str | None


# Every consequence of an event, in the order it happened: what ``Dispatcher.handle`` returns.
Effect = Dispatch | Expired | Requeued | Unloaded


def dispatches(effects: list[Effect]) -> list[Dispatch]:
    """The dispatches among ``effects``, in order."""
    return [e for e in effects if isinstance(e, Dispatch)]
