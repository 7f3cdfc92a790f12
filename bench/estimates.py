"""Accuracy of estimated start times, over the shipped scenarios (gpulane's policy).

    .venv/bin/python bench/estimates.py [--plot docs/img/estimate-accuracy.png]

Each job that had to wait gets the estimate ``forecast()`` gave right after its submission (what
``gpulane queue`` would have shown), compared with when it really started. Run times are drawn from
each stream's spread; the dispatcher knows only the averages it has learned. Estimates assume that
nothing else arrives, so later arrivals that outrank a job make it start later than said: that is the
negative bias on the batch band.
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

from gpulane.core.priority import band_of
from gpulane.core.sim.accuracy import Estimate, estimates, summary
from gpulane.core.sim.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]
BANDS = {1: "interactive", 0: "normal", -1: "batch"}


def by_band(found: list[Estimate]) -> dict[str, list[Estimate]]:
    out: dict[str, list[Estimate]] = {}
    for e in found:
        out.setdefault(BANDS.get(band_of(e.priority, 100), str(e.priority)), []).append(e)
    return out


def plot(results: dict[str, dict[str, list[Estimate]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5), sharey=True)
    for ax, (scenario, bands) in zip(axes.flat, sorted(results.items()), strict=False):
        for band, found in sorted(bands.items()):
            errors = sorted(abs(e.error) / 60 for e in found)
            ax.plot(errors, [(i + 1) / len(errors) for i in range(len(errors))], label=f"{band} ({len(errors)})")
        ax.set_xscale("symlog", linthresh=1)
        ax.set_title(scenario, fontsize=10)
        ax.set_xlabel("|estimated - actual start| (min)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("share of waiting jobs")
    fig.suptitle("Estimated start at submission vs actual start (gpulane, shipped scenarios)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plot", help="write a CDF of the errors per scenario and band")
    args = parser.parse_args()
    results: dict[str, dict[str, list[Estimate]]] = {}
    table: dict[str, dict[str, dict[str, float | int]]] = {}
    for path in sorted(glob.glob(str(REPO / "scenarios" / "*.yaml"))):
        scenario = load_scenario(path)
        results[scenario.name] = by_band(estimates(scenario))
        table[scenario.name] = {band: summary(found) for band, found in sorted(results[scenario.name].items())}
    print(json.dumps(table, indent=1))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
