"""Dispatch decision latency with N pending jobs, against a rescore-everything baseline.

Each measured decision is one ``JobFinished`` event on a busy lane that yields one dispatch,
the operator's hot path. A new job is submitted after each decision so N stays constant.
The baseline picks the same winner by rescoring every pending job, run in the same process
so the ratio survives a noisy machine.

    .venv/bin/python bench/dispatch.py [--pending 10000 100000] [--decisions 2000] [--repeat 5] [--teams 5]

With ``--forks K`` it times instead the fork each forecast pass of the operator starts from (``Dispatcher.fork``,
the copy made and dropped), K times at each size; and the decision made while a fork lives, which copies what
it changes of what the fork shares, beside one made with no fork (in turns). ``--queue-timeout S`` gives every
band a queue timeout, so that every waiting job has a deadline for the fork to carry.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import platform
import random
import statistics
import time

from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import JobFinished, JobSubmitted, LaneUpdated, dispatches
from gpulane.core.jobs import Job, ModelCatalog, ModelSpec
from gpulane.core.policy import Policy

MODELS = ["sdxl", "flux", "h3-video", "qwen-7b"]
TIERS = ["free", "pro", "max"]
PRIORITIES = [-100, -100, 0, 0, 0, 100, 5, -3]


def make_job(rng: random.Random, i: int, now: float, members: int, teams: int = 0) -> Job:
    member = rng.randrange(members)
    job = Job(f"job-{i}", rng.choice(MODELS), rng.choice(PRIORITIES), rng.choice(TIERS), f"member-{member}", now)
    # A member's team is fixed (its namespace, as the operator gives it); without --teams a job has no team.
    return dataclasses.replace(job, team=f"team-{member % teams}") if teams else job


def build(
    pending: int, members: int, seed: int, teams: int = 0, policy: Policy | None = None
) -> tuple[Dispatcher, list[float], random.Random]:
    rng = random.Random(seed)
    clock = [0.0]
    d = Dispatcher(policy or Policy(), lambda: clock[0], ModelCatalog([ModelSpec(m) for m in MODELS]))
    d.handle(LaneUpdated("gpu-0", resident="sdxl"))
    for i in range(pending + 1):  # the first one starts running at once
        clock[0] = i * 0.5
        d.handle(JobSubmitted(make_job(rng, i, clock[0], members, teams)))
    return d, clock, rng


def decide(d: Dispatcher, clock: list[float], rng: random.Random, k: int, members: int, teams: int) -> float:
    """One timed decision (ns): the running job finishes and the next starts; then job ``k`` arrives, so that the
    queue keeps its length."""
    clock[0] += 60
    t0 = time.perf_counter_ns()
    [_] = dispatches(d.handle(JobFinished(next(iter(d.running)))))  # one dispatch, the one timed
    spent = time.perf_counter_ns() - t0
    d.handle(JobSubmitted(make_job(rng, k, clock[0], members, teams)))  # it may take the lane from a load
    return spent


def measure(pending: int, members: int, decisions: int, seed: int, teams: int = 0) -> list[float]:
    d, clock, rng = build(pending, members, seed, teams)
    gc.collect()
    gc.freeze()  # setup garbage is not what we measure
    samples = [decide(d, clock, rng, pending + 1 + k, members, teams) / 1000 for k in range(decisions)]
    gc.unfreeze()
    return samples


def measure_rescoring(pending: int, members: int, decisions: int, seed: int, teams: int = 0) -> list[float]:
    """The baseline: score every pending job from scratch at each decision."""
    d, clock, _ = build(pending, members, seed, teams)
    ranking, lane = d.ranking, d.lanes["gpu-0"]
    samples = []
    for _ in range(decisions):
        clock[0] += 60
        t0 = time.perf_counter_ns()
        max(ranking.pending(), key=lambda job: ranking.breakdown(job, lane.affinity(d.models), clock[0]).total)
        samples.append((time.perf_counter_ns() - t0) / 1000)
    return samples


def queue_timeouts(seconds: float) -> Policy:
    """Every band waits at most ``seconds``: each waiting job has a deadline, which the fork carries too."""
    bands = {Policy().band(p) * Policy().band_spacing for p in PRIORITIES}
    return Policy(queueTimeoutSeconds={band: seconds for band in bands})


def measure_forks(
    pending: int, members: int, forks: int, seed: int, teams: int = 0, policy: Policy | None = None
) -> dict[str, list[float]]:
    """Milliseconds to fork the dispatcher and drop the fork again (its deallocation is the loop's too); and of
    a decision while the fork lives, and of one with none."""
    d, clock, rng = build(pending, members, seed, teams, policy)
    samples: dict[str, list[float]] = {"fork": [], "decision_forked": [], "decision": []}
    gc.collect()
    gc.freeze()
    for i in range(forks):
        samples["decision"].append(decide(d, clock, rng, pending + 1 + 2 * i, members, teams) / 1e6)
        t0 = time.perf_counter_ns()
        fork = d.fork(lambda: clock[0])
        samples["fork"].append((time.perf_counter_ns() - t0) / 1e6)
        samples["decision_forked"].append(decide(d, clock, rng, pending + 2 + 2 * i, members, teams) / 1e6)
        t0 = time.perf_counter_ns()
        del fork
        samples["fork"][-1] += (time.perf_counter_ns() - t0) / 1e6
    gc.unfreeze()
    return samples


def summary(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), statistics.quantiles(samples, n=100)[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--members", type=int, default=500)
    parser.add_argument("--teams", type=int, default=0, help="members in this many teams (0: each its own)")
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--baseline-decisions", type=int, default=20, help="0 skips the rescoring baseline")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5, help="independent runs; the median of their medians")
    parser.add_argument("--forks", type=int, default=0, help="time this many forks at each size instead")
    parser.add_argument("--queue-timeout", type=float, help="with --forks: every band has this queue timeout (s)")
    args = parser.parse_args()
    if args.forks:
        policy = None if args.queue_timeout is None else queue_timeouts(args.queue_timeout)
        timeouts = "" if policy is None else f", every job with a queue deadline ({args.queue_timeout:g} s)"
        print(f"python {platform.python_version()} on {platform.machine()}, {args.members} members, 4 models{timeouts}")
        print(f"{'pending':>8} {'fork median ms':>15} {'max ms':>8} {'decision forked ms':>19} {'unforked ms':>12}")
        for n in args.pending:
            times = measure_forks(n, args.members, args.forks, args.seed, args.teams, policy)
            forks, forked, alone = times["fork"], times["decision_forked"], times["decision"]
            print(f"{n:>8} {statistics.median(forks):>15.2f} {max(forks):>8.2f} {statistics.median(forked):>19.3f} "
                  f"{statistics.median(alone):>12.3f}")  # fmt: skip
        return
    teams = f" in {args.teams} teams" if args.teams else ""
    print(f"python {platform.python_version()} on {platform.machine()}, {args.members} members{teams}, 4 models")
    print(f"{'pending':>8} {'median us':>10} {'p99 us':>8} {'rescore median us':>18} {'ratio':>7}")
    for n in args.pending:
        runs = [measure(n, args.members, args.decisions, args.seed + r, args.teams) for r in range(args.repeat)]
        med = statistics.median(summary(run)[0] for run in runs)
        p99 = summary([x for run in runs for x in run])[1]
        if not args.baseline_decisions:  # bench/versus.py: a base commit's core may not run this tree's baseline
            print(f"{n:>8} {med:>10.1f} {p99:>8.1f} {'-':>18} {'-':>7}")
            continue
        base, _ = summary(measure_rescoring(n, args.members, args.baseline_decisions, args.seed, args.teams))
        print(f"{n:>8} {med:>10.1f} {p99:>8.1f} {base:>18.0f} {base / med:>6.0f}x")


if __name__ == "__main__":
    main()
