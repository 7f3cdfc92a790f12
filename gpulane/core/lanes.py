"""A lane's state in the core: the one record of where each job runs, the model it holds, and how its server
switches between the models it holds together."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulane.core.events import Dispatch
from gpulane.core.jobs import Job, ModelCatalog
from gpulane.core.ranking import NO_AFFINITY, Affinity


@dataclass(frozen=True, slots=True)
class Charge:
    """What a dispatch took from the queue: to correct the usage at the end, or to undo it."""

    decision: Dispatch
    seq: int  # the job's arrival sequence, to wait again in its place
    seconds: float  # GPU-seconds charged to its member at dispatch
    served_before: float | None  # its (member, band)'s served clock before the dispatch
    last_arrival: int  # the newest arrival then: only later ones may make its load yield


@dataclass(frozen=True, slots=True)
class Running:
    job: Job
    lane: str
    started_at: float | None  # None while it waits for its model to load
    charge: Charge | None = None  # None for a job adopted after a restart


@dataclass(slots=True)
class Lane:
    """One GPU. ``resident`` is the model loaded or loading, the one serving; ``running`` holds its jobs, in
    dispatch order: the one record of where a job runs. A lane whose pod runs a ``server`` that holds several
    models (llama-server's router mode) keeps the others it holds in ``loaded``, with when each last served."""

    id: str
    online: bool = True
    resident: str | None = None
    running: dict[str, Running] = field(default_factory=dict)
    loading_since: float | None = None  # when the resident model's load began, until it is ready
    evicting: bool = False  # its model is gone: it takes no job, and drops the model once its jobs end
    idle_since: float | None = None  # when its last job ended, its model still loaded (for the model's ttl)
    owners: frozenset[str] | None = None  # the teams it is reserved for: theirs first, others borrow it
    server: str | None = None  # the server its pod runs, for models that share one (None: a pod per model)
    loaded: dict[str, float] = field(default_factory=dict)  # the server's other models -> when last served
    memory_mib: int = 0  # its GPU memory; 0: its server holds one model at a time

    @property
    def ready(self) -> bool:
        return self.resident is not None and self.loading_since is None

    def clear(self) -> None:
        """Its pod is gone, or gives every model up: nothing is loaded."""
        self.resident, self.loading_since, self.evicting, self.idle_since = None, None, False, None
        self.server, self.loaded = None, {}

    def state(self) -> LaneState:
        return LaneState(
            self.id, self.online, self.resident, self.ready, self.owners, frozenset(self.loaded), self.memory_mib
        )

    def copy(self) -> Lane:
        """An independent copy, for a forecast's fork."""
        return Lane(
            self.id, self.online, self.resident, dict(self.running), self.loading_since, self.evicting,
            self.idle_since, self.owners, self.server, dict(self.loaded), self.memory_mib,
        )  # fmt: skip

    def switch(self, model: str, now: float, load: bool, models: ModelCatalog) -> tuple[str, ...]:
        """Its server serves ``model`` next: the model it served stays loaded beside it (one still loading is
        given up), and, for a load, the least recently served give way until the new one fits its memory. The
        models given up are returned."""
        if self.resident is not None and self.ready and self.resident != self.server:  # (the server itself holds none)
            self.loaded[self.resident] = now
        self.loaded.pop(model, None)
        if not load:
            return ()
        room = self.memory_mib
        keep, evicts, used = {}, [], models.get(model).memory_mib
        # Most recently served first (of two served at one instant, the later).
        for other, last in sorted(reversed(self.loaded.items()), key=lambda item: -item[1]):
            need = models.get(other).memory_mib
            if room and used + need <= room:
                keep[other], used = last, used + need
            else:
                evicts.append(other)
        if self.resident is not None and not self.ready:
            evicts.append(self.resident)
        self.loaded = keep
        return tuple(evicts)

    def affinity(self, models: ModelCatalog, excluded: frozenset[str] = frozenset()) -> Affinity:
        """The models whose jobs get affinity here, and their shares: all of it for the models loaded here (no
        switch at all); for the other models of its server, what a switch saves against a new pod."""
        shares: dict[str, float] = {}
        if self.server is not None:
            for spec in models.of_server(self.server):
                if (share := models.switch_share(spec.name)) > 0:
                    shares[spec.name] = share
        for model in (*self.loaded, *([] if self.resident is None else [self.resident])):
            shares[model] = 1.0
        return {model: share for model, share in shares.items() if model not in excluded} if shares else NO_AFFINITY


@dataclass(frozen=True, slots=True)
class LaneState:
    """What a shell reads of a lane: whether it takes jobs, the model it holds, and whether that model is loaded."""

    id: str
    online: bool
    resident: str | None
    ready: bool
    owners: frozenset[str] | None  # the namespaces it is reserved for
    loaded: frozenset[str] = frozenset()  # the other models its server holds beside the resident
    memory_mib: int = 0  # its GPU memory for models held together (0: one at a time)
