"""A 174-shot film as a chain and as a burst, against interactive traffic, in the simulator (issue 19).

    .venv/bin/python bench/chains.py [--plot docs/img/chain-eta.png]

Runs ``scenarios/film-chained-vs-interactive.yaml`` and ``scenarios/film-burst-vs-interactive.yaml`` (the
same film and image traffic; the film submitted one shot at a time, or all at once) with gpulane's policy,
and reports the images' waits, the film's completion, and the error of a GpuChain's ETA
(``gpulane/core/chains.py``, ``estimated_completion``: the function the operator writes on the chain's
status) at 10%, 50% and 90% of the film: the ETA as the status would have shown it then, against the
film's real end.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from gpulane.core.chains import ChainRules, StepJob, estimated_completion, plan
from gpulane.core.sim.engine import JobRecord, simulate
from gpulane.core.sim.report import percentile
from gpulane.core.sim.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = {"chain": "film-chained-vs-interactive.yaml", "burst": "film-burst-vs-interactive.yaml"}
SHOT_SECONDS = 240.0  # the film's runSeconds in both scenarios: the model's run time the ETA starts from


def steps_at(film: list[JobRecord], now: float) -> list[StepJob]:
    """The film's shots as a chain's step jobs would have shown them at ``now``."""
    out = []
    for index, shot in enumerate(film):
        if shot.submitted_at is None or shot.submitted_at > now:
            continue
        if shot.finished_at is not None and shot.finished_at <= now:
            phase = "Succeeded"
        elif shot.started_at is not None and shot.started_at <= now:
            phase = "Running"
        else:
            phase = "Pending"
        started = shot.started_at if phase != "Pending" else None
        finished = shot.finished_at if phase == "Succeeded" else None
        out.append(StepJob(index, 0, shot.name, phase, started, finished))
    return out


def eta_errors(film: list[JobRecord]) -> list[tuple[int, float]]:
    """(shots done, ETA minus the real end in seconds) after each shot's end."""
    end = max(s.finished_at or 0.0 for s in film)
    rules = ChainRules(total=len(film))
    out = []
    for done, at in enumerate(sorted(s.finished_at for s in film if s.finished_at is not None)[:-1], start=1):
        steps = steps_at(film, at)
        eta = estimated_completion(rules, plan(rules, steps, at), steps, SHOT_SECONDS, at)
        if eta is not None:
            out.append((done, eta - end))
    return out


def measure(kind: str, policy: str) -> dict[str, Any]:
    result = simulate(load_scenario(REPO / "scenarios" / SCENARIOS[kind]), policy)
    film = [j for j in result.jobs if j.stream == "film"]
    images = [j for j in result.jobs if j.stream == "images" and j.started_at is not None]
    waits = [(j.started_at or 0.0) - (j.submitted_at or 0.0) for j in images]
    errors = dict(eta_errors(film))
    at = {f"{p}%": round(errors[math.ceil(len(film) * p / 100)] / 60, 1) for p in (10, 50, 90)}
    return {
        "images": len(images),
        "image_wait_p50_s": round(percentile(waits, 50), 1),
        "image_wait_p95_s": round(percentile(waits, 95), 1),
        "image_wait_max_s": round(max(waits), 1),
        "film_done_h": round(max(s.finished_at or 0.0 for s in film) / 3600, 2),
        "eta_error_min": at,
        "errors": sorted(errors.items()),
    }


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One panel per policy: lines of equal values (two policies' chains) would hide each other on one.
    policies = list(dict.fromkeys(key.split(", ", 1)[1] for key in results))
    fig, axes = plt.subplots(1, len(policies), figsize=(4 * len(policies), 3.6), sharey=True, squeeze=False)
    for ax, policy in zip(axes[0], policies, strict=True):
        for kind, style in (("chain", "-"), ("burst", "--")):
            done, error = zip(*results[f"{kind}, {policy}"]["errors"], strict=True)
            ax.plot(done, [e / 60 for e in error], style, label=f"film as a {kind}")
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_title(policy)
        ax.set_xlabel("shots done (of 174)")
    axes[0][0].set_ylabel("ETA minus the real end (minutes)")
    axes[0][0].legend()
    fig.suptitle("A film's ETA as it renders, beside image traffic (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", type=Path, default=None, help="write the ETA's error over the film here (PNG)")
    parser.add_argument("--policies", default="gpulane,per-job-aging,fifo", help="the simulator's policies")
    args = parser.parse_args()
    results = {f"{kind}, {policy}": measure(kind, policy) for policy in args.policies.split(",") for kind in SCENARIOS}
    if args.plot:
        plot(results, args.plot)
    print(json.dumps({k: {f: v for f, v in r.items() if f != "errors"} for k, r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
