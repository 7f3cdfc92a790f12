"""The demo's summary, from what the API holds once every job ended: the wait per band, the swaps, how often
each term changed the winner, and what FIFO and strict priority would have done with the same arrivals
(the simulator, fed the run's own arrival times, run times and learned load times)."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpulane.api.contract import REQUESTED_PRIORITY
from gpulane.api.times import parse_time
from gpulane.core.explain import TERM_NAMES
from gpulane.core.policy import Policy
from gpulane.core.sim.engine import simulate
from gpulane.core.sim.report import band_label, human, percentile
from gpulane.core.sim.scenario import ModelDecl, OneJob, Scenario

Body = dict[str, Any]
BANDS = ("interactive", "normal", "batch")
BASELINES = ("fifo", "strict")


@dataclass
class Outcome:
    """Waits (seconds from submission to start) per band, and the swaps, of one policy's run."""

    waits: dict[str, list[float]] = field(default_factory=dict)
    swaps: int = 0

    def cell(self, band: str) -> str:
        waits = self.waits.get(band)
        if not waits:
            return "-"
        return f"{human(percentile(waits, 50))} / {human(max(waits))}"


@dataclass
class Summary:
    jobs: int
    live: Outcome
    simulated: dict[str, Outcome]
    changed_by: Counter[str]
    capped: list[str]  # jobs whose caller asked for more than its key allows: "name (member: asked -> got)"
    dispatches: list[Body]  # the lane's records of this run, in order

    def render(self) -> str:
        columns = {"gpulane (this run)": self.live, **{f"{p} (simulated)": o for p, o in self.simulated.items()}}
        width = max(len(c) for c in columns) + 2
        lines = [f"{self.jobs} jobs ran on {self.dispatches[0]['lane'] if self.dispatches else '-'}.", ""]
        lines.append(f"{'wait p50 / max':<22}" + "".join(f"{c:>{width}}" for c in columns))
        for band in BANDS:
            if any(band in o.waits for o in columns.values()):
                lines.append(f"  {band:<20}" + "".join(f"{o.cell(band):>{width}}" for o in columns.values()))
        lines.append(f"{'model swaps':<22}" + "".join(f"{o.swaps:>{width}}" for o in columns.values()))
        lines.append("")
        terms = ", ".join(f"{name} {self.changed_by[term]}x" for term, name in TERM_NAMES.items())
        lines.append(f"Dispatches whose winner a term changed (beyond band and tier): {terms}.")
        if self.capped:
            lines.append(f"Asked for more priority than its API key allows, and capped: {', '.join(self.capped)}.")
        return "\n".join(lines)


def _band(priority: int, policy: Policy) -> str:
    return band_label(round(priority / policy.band_spacing), policy.band_spacing)


def _when(status: Body, key: str) -> float:
    moment = parse_time(status.get(key))
    if moment is None:
        raise ValueError(f"a finished job has no {key}")
    return moment


def live_outcome(jobs: list[Body], dispatches: list[Body], policy: Policy) -> Outcome:
    out = Outcome()
    for job in jobs:
        status = job["status"]
        if status.get("startedAt"):
            band = _band(int(status["score"]["priority"]), policy)
            out.waits.setdefault(band, []).append(_when(status, "startedAt") - _when(status, "submittedAt"))
    out.swaps = sum(1 for before, after in itertools.pairwise(dispatches) if after["model"] != before["model"])
    return out


def scenario(jobs: list[Body], learned: dict[str, float], policy: Policy) -> Scenario:
    """The run as a simulator scenario: every job at its own submission time, with its measured run time."""
    ran = [j for j in jobs if j["status"].get("startedAt") and j["status"].get("finishedAt")]
    first = min(_when(j["status"], "submittedAt") for j in ran)
    return Scenario(
        name="demo",
        policy=policy,
        models=[ModelDecl(name=name, load_seconds=seconds) for name, seconds in learned.items()],
        jobs=[
            OneJob(
                name=j["metadata"]["name"],
                at=_when(j["status"], "submittedAt") - first,
                member=j["spec"]["member"],
                tier=j["spec"].get("tier") or "free",
                priority=int(j["status"]["score"]["priority"]),
                model=j["spec"]["model"],
                run_seconds=max(0.0, _when(j["status"], "finishedAt") - _when(j["status"], "startedAt")),
            )
            for j in ran
        ],
    )


def simulated(scene: Scenario, policy_name: str) -> Outcome:
    result = simulate(scene, policy_name)
    out = Outcome(swaps=sum(r.swaps for r in result.jobs))
    for record in result.jobs:
        if record.started_at is not None:
            out.waits.setdefault(_band(record.priority, scene.policy), []).append(record.wait)
    return out


def summarize(jobs: list[Body], lane: Body, models: dict[str, Body], policy: Policy) -> Summary:
    names = {j["metadata"]["name"] for j in jobs}
    dispatches = [r for r in (lane.get("status") or {}).get("history") or [] if r["job"].split("/")[-1] in names]
    learned = {name: float((m.get("status") or {}).get("loadSeconds") or 0.0) for name, m in models.items()}
    scene = scenario(jobs, learned, policy)
    changed: Counter[str] = Counter(term for r in dispatches for term in (r.get("changedBy") or {}))
    capped = sorted(
        f"{j['metadata']['name']} ({j['spec']['member']}: {annotations[REQUESTED_PRIORITY]} -> {j['spec']['priority']})"
        for j in jobs
        if REQUESTED_PRIORITY in (annotations := j["metadata"].get("annotations") or {})
    )
    return Summary(
        jobs=len(jobs),
        live=live_outcome(jobs, dispatches, policy),
        simulated={p: simulated(scene, p) for p in ("gpulane", *BASELINES)},
        changed_by=changed,
        capped=capped,
        dispatches=dispatches,
    )
