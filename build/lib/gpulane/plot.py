"""Plots of simulation results: waits per stream and a GPU timeline, one row per policy."""

from __future__ import annotations

from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure  # the object API draws to files without a display or pyplot state
from matplotlib.patches import Rectangle

from gpulane.core.sim.engine import SimResult


def plot_results(title: str, results: dict[str, SimResult], path: str | Path) -> None:
    streams = sorted({j.stream or j.name for r in results.values() for j in r.jobs})
    colours = {s: colormaps["tab10"](i % 10) for i, s in enumerate(streams)}
    rows = len(results)
    fig = Figure(figsize=(15, 2.8 * rows + 0.8))
    axes = fig.subplots(rows, 2, squeeze=False, gridspec_kw={"width_ratios": [1, 2.4]})
    for row, (policy, result) in enumerate(results.items()):
        waits_ax, timeline_ax = axes[row]
        data = [
            [j.wait / 60 for j in result.jobs if (j.stream or j.name) == s and j.started_at is not None]
            for s in streams
        ]
        box = waits_ax.boxplot(data, orientation="horizontal", patch_artist=True, whis=(0, 95), showfliers=False)
        for patch, stream in zip(box["boxes"], streams, strict=True):
            patch.set_facecolor(colours[stream])
        waits_ax.set_yticks(range(1, len(streams) + 1), streams)
        waits_ax.set_xscale("symlog", linthresh=1)
        waits_ax.set_xlim(left=0)
        waits_ax.set_xlabel("wait, minutes (box: p25-p75, whiskers: min-p95)")
        rejected = sum(1 for j in result.jobs if j.rejected)
        dropped = sum(1 for j in result.jobs if j.dropped)
        fate = f"{dropped} of them dropped" if dropped else "all retried"
        refusals = f" ({rejected} refused with 429, {fate})" if rejected else ""
        waits_ax.set_title(f"{policy}: waits{refusals}", loc="left", fontsize=10)

        lanes = {lane: i for i, lane in enumerate(result.lanes)}
        for job in result.jobs:
            if job.started_at is None or job.lane is None:
                continue
            y = lanes[job.lane]
            if job.cold_start and job.dispatched_at is not None and job.started_at > job.dispatched_at:
                timeline_ax.broken_barh(
                    [(job.dispatched_at / 3600, (job.started_at - job.dispatched_at) / 3600)],
                    (y - 0.4, 0.8),
                    facecolors="black",
                )
            timeline_ax.broken_barh(
                [(job.started_at / 3600, job.run_seconds / 3600)],
                (y - 0.4, 0.8),
                facecolors=colours[job.stream or job.name],
            )
        timeline_ax.set_yticks(list(lanes.values()), list(lanes))
        timeline_ax.set_xlabel("hours (black: model loads)")
        timeline_ax.set_title(f"{policy}: GPU timeline", loc="left", fontsize=10)
    handles = [Rectangle((0, 0), 1, 1, color=colours[s]) for s in streams]
    fig.legend(handles, streams, loc="upper right", ncol=min(len(streams), 6), fontsize=9)
    fig.suptitle(title, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=90)
