"""A chain: the steps of one piece of work (a film's shots) run as ordinary jobs, a few at a time.

The design note's answer to a long film is a producer that submits one shot at a time and submits the next
when it ends, so that interactive work finds a gap between shots. A chain does that loop for the producer:
``plan`` is its state machine. From the chain's rules and what became of its steps' jobs, it says which
steps to create now and what the chain's status is. ``estimated_completion`` is the ETA. Both are pure:
the operator feeds them the jobs it sees and writes what they return; the simulator measures the same ETA.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

ChainPhase = Literal["Running", "Succeeded", "Failed", "Paused", "Suspended"]
ENDED = frozenset({"Succeeded", "Failed", "Cancelled"})


@dataclass(frozen=True, slots=True)
class ChainRules:
    total: int  # steps
    in_flight: int = 1  # steps queued or running at once
    retries: int = 0  # a failed step is tried again this many times
    exhausted: Literal["Fail", "Pause"] = "Fail"  # then the chain fails, or stops creating steps
    suspend: bool = False  # no new steps while set


@dataclass(frozen=True, slots=True)
class StepJob:
    """One attempt at one step, as its job says."""

    index: int
    attempt: int  # 0 for the first
    name: str
    phase: str | None = None  # None until the operator first writes it
    started_at: float | None = None
    finished_at: float | None = None
    position: int | None = None
    estimated_start: float | None = None
    reason: str | None = None  # its job's, once it ended

    @property
    def ended(self) -> bool:
        return self.phase in ENDED


@dataclass(frozen=True, slots=True)
class ChainPlan:
    create: tuple[tuple[int, int], ...]  # (index, attempt) of the steps to create now
    phase: ChainPhase
    succeeded: frozenset[int]  # the steps that succeeded: kept on the chain, as their jobs may go
    gave_up: frozenset[int]  # the steps that failed with no attempt left: kept on the chain too
    completed: int  # steps that succeeded
    failed: int  # steps that failed with no attempt left
    retried: int  # attempts that failed and were tried again
    current: StepJob | None  # the earliest step not done yet: running, or waiting
    gpu_seconds: float  # the steps' run time so far
    message: str


# Refusals of a job on arrival for a full queue (admission.maxPendingPerNamespace, maxPendingPerMember).
QUEUE_FULL = frozenset({"NamespaceQueueFull", "MemberQueueFull"})


def plan(
    rules: ChainRules, jobs: Iterable[StepJob], now: float, succeeded: Iterable[int] = (), gave_up: Iterable[int] = ()
) -> ChainPlan:
    """What to create now, and the chain's status. Steps are created in order, at most ``in_flight`` at a
    time: a step ends, the next is created. A step that failed (or was cancelled) is created again, as
    its next attempt, while it has attempts left; one refused for its namespace's or member's full queue
    (``QUEUE_FULL``) is not: another attempt now would meet the same queue. ``succeeded`` and
    ``gave_up`` are the steps the chain's status says succeeded, or failed with no attempt left: they are
    never made again, whatever became of their jobs (deleted after their TTL, or by hand), so a chain that
    failed stays failed. Any other step whose job is gone is created again from scratch."""
    jobs = list(jobs)
    latest = _latest(jobs, rules.total)
    gpu = sum(max(0.0, (j.finished_at if j.finished_at is not None else now) - j.started_at)
              for j in jobs if j.started_at is not None and 0 <= j.index < rules.total)  # fmt: skip
    retried = sum(j.attempt for j in latest.values())
    done = {i for i, j in latest.items() if j.phase == "Succeeded"}
    done |= {i for i in succeeded if 0 <= i < rules.total}
    lost = sorted(i for i, j in latest.items() if j.phase in ("Failed", "Cancelled") and i not in done)
    final = {i for i in lost if latest[i].attempt >= rules.retries or latest[i].reason in QUEUE_FULL}
    failed = sorted(final | ({i for i in gave_up if 0 <= i < rules.total} - done))
    again = [(i, latest[i].attempt + 1) for i in lost if i not in final]
    active = [j for j in latest.values() if not j.ended and j.index not in done]
    waiting = sorted(active, key=lambda j: j.index)
    current = waiting[0] if waiting else None
    status = _Status(frozenset(done), frozenset(failed), retried, current, gpu)
    if len(done) == rules.total:
        return status.plan((), "Succeeded", f"all {rules.total} steps succeeded")
    if failed:
        step = failed[0]
        if step not in latest:
            why = f"step {step} failed with no attempt left (its jobs are gone)"
        elif (reason := latest[step].reason) in QUEUE_FULL:
            why = f"step {step} was refused, its queue full ({reason}): {latest[step].name}"
        else:
            why = f"step {step} failed after {latest[step].attempt + 1} attempt(s): {latest[step].name}"
        if rules.exhausted == "Fail":
            return status.plan((), "Failed", why)
        return status.plan((), "Paused", f"{why}; no new step until the chain is changed")
    if rules.suspend:
        return status.plan((), "Suspended", "spec.suspend: no new step; the ones in flight go on")
    unmade = (i for i in range(rules.total) if i not in latest and i not in done)
    room = max(0, rules.in_flight - len(active))
    create = tuple([*again, *((i, 0) for i in unmade)][:room])
    return status.plan(create, "Running", f"{len(done)} of {rules.total} steps done")


def _latest(jobs: Iterable[StepJob], total: int) -> dict[int, StepJob]:
    """Each step's latest attempt, for the steps the spec has (a shrunk total leaves some behind)."""
    latest: dict[int, StepJob] = {}
    for job in jobs:
        if 0 <= job.index < total and (job.index not in latest or job.attempt > latest[job.index].attempt):
            latest[job.index] = job
    return latest


@dataclass(frozen=True, slots=True)
class _Status:
    succeeded: frozenset[int]
    gave_up: frozenset[int]
    retried: int
    current: StepJob | None
    gpu_seconds: float

    def plan(self, create: tuple[tuple[int, int], ...], phase: ChainPhase, message: str) -> ChainPlan:
        return ChainPlan(create, phase, self.succeeded, self.gave_up, len(self.succeeded), len(self.gave_up),
                         self.retried, self.current, self.gpu_seconds, message)  # fmt: skip


def estimated_completion(
    rules: ChainRules, decided: ChainPlan, jobs: Iterable[StepJob], step_seconds: float, now: float
) -> float | None:
    """When the last step should end, given ``plan``'s verdict on the same jobs; None for a chain that is
    over or stopped.

    Once steps have ended, the chain's own pace says it best: the time from its first step's start to its
    latest end, over the steps that ended, includes the gaps in which other work went ahead. The pace is
    taken from the jobs still there. Before that, the current step's forecast start (or now) plus every
    step at the model's learned run time, ``in_flight`` at a time."""
    if decided.phase != "Running":
        return None
    jobs = list(jobs)
    latest = _latest(jobs, rules.total)
    done = [j for j in latest.values() if j.phase == "Succeeded"]
    remaining = rules.total - decided.completed
    started = [j.started_at for j in jobs if j.started_at is not None]  # a retried step's first try too
    ends = [j.finished_at for j in done if j.finished_at is not None]
    if done and started and ends:
        pace = max(0.0, max(ends) - min(started)) / len(done)
        return max(now, max(ends) + remaining * pace)
    current = decided.current
    first = now if current is None else current.estimated_start or current.started_at or now
    return max(now, first) + math.ceil(remaining / max(1, rules.in_flight)) * step_seconds


def step_name(chain: str, index: int, attempt: int) -> str:
    """The job of a step's attempt: the chain's name, the step, and the attempt after the first."""
    suffix = f"-{index}" if attempt == 0 else f"-{index}-r{attempt}"
    return chain[: 253 - len(suffix)] + suffix


def format_steps(indices: Iterable[int]) -> str:
    """Step indices as ranges, ``0-36,38``: a long chain's succeeded steps in a few characters."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive indices
    for i in sorted(set(indices)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_steps(text: str | None, total: int) -> frozenset[int]:
    """``format_steps``' ranges back into indices below ``total``; a malformed part is skipped."""
    found: set[int] = set()
    for part in (text or "").split(","):
        first, dash, last = part.strip().partition("-")
        if first.isdigit() and (not dash or last.isdigit()):
            found.update(range(int(first), min(int(last or first), total - 1) + 1))
    return frozenset(found)


def render(template: object, index: int, total: int) -> object:
    """A step's request from the chain's template: in every string of it, ``{index}`` becomes the step's
    index (from 0), ``{step}`` its number (from 1) and ``{total}`` the chain's steps. Nothing else in a
    string changes, so JSON or prompts with braces pass as they are."""
    if isinstance(template, str):
        return template.replace("{index}", str(index)).replace("{step}", str(index + 1)).replace("{total}", str(total))
    if isinstance(template, list):
        return [render(item, index, total) for item in template]
    if isinstance(template, dict):
        return {key: render(value, index, total) for key, value in template.items()}
    return template
