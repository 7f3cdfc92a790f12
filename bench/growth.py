"""How the operator's cost grows: warm dispatch latency and the burst of N jobs, at 1, 10 and 50 lanes
(kwok nodes) and at 1,000, 5,000 and 20,000 jobs, each a fresh run of ``bench/operator.py``.

    .venv/bin/python bench/growth.py [--lanes 1 10 50] [--jobs 1000 5000 20000] [--plot docs/img/operator-growth.png]
    .venv/bin/python bench/growth.py --rounds 2 --jobs 1000 20000 --dispatches 300

Prints one JSON line per run and a markdown table; the plot shows latency (p50, p99), jobs positioned
per second, the operator's peak memory and its API writes per second against lanes and against jobs.

With ``--rounds`` it runs only the latency bench on one lane, the sizes in turn, round after round, so
that the sizes share the machine's moods; it prints each run and, per size, the medians and their ratio to
the first size's. CPU per dispatch includes the whole queue's forecast, which a long queue runs every
20 s or so (5% of the loop): give the window dispatches enough to hold one or more (300 is about 20 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run(*argv: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(HERE / "operator.py"), *argv], capture_output=True, text=True)
    if out.returncode != 0:  # say why: the run's own traceback, not only its exit status
        raise SystemExit(f"bench/operator.py {' '.join(argv)} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    print(json.dumps({"argv": argv, **result}), flush=True)
    return result


def plot(by_lanes: list[dict[str, Any]], by_jobs: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The one-lane run of the lanes' row is a point of the jobs' row too; one lane count alone draws no row.
    sizes = {r["jobs"] for r in by_jobs}
    one_lane = [
        {"jobs": r["scale"]["jobs"], **r} for r in by_lanes if r["lanes"] == 1 and r["scale"]["jobs"] not in sizes
    ]
    rows = [(by_lanes, "lanes")] if len(by_lanes) > 1 else []
    rows.append((sorted([*by_jobs, *one_lane], key=lambda r: r["jobs"]), "jobs"))
    fig, axes = plt.subplots(len(rows), 3, figsize=(13, 3.5 * len(rows)), squeeze=False)
    for row, (runs, key) in enumerate(rows):
        lat = [r["latency"] for r in runs]
        burst = [r["scale"] for r in runs]
        xs = [r[key] for r in runs]
        ax = axes[row][0]
        ax.plot(xs, [x["total_p50_ms"] for x in lat], "o-", label="p50")
        ax.plot(xs, [x["total_p99_ms"] for x in lat], "s--", label="p99")
        ax.plot(xs, [x["operator_cpu_ms_per_dispatch"] for x in lat], "^:", label="operator CPU per dispatch")
        ax.set(xlabel=key, ylabel="warm dispatch (ms)", xscale="log")
        ax.legend()
        ax = axes[row][1]
        ax.plot(xs, [x["jobs_per_second"] for x in burst], "o-", label="positioned jobs/s")
        ax.plot(xs, [x["operator_writes_per_second"] for x in lat], "s--", label="API writes/s while dispatching")
        ax.set(xlabel=key, ylabel="per second", xscale="log")
        ax.legend()
        ax = axes[row][2]
        ax.plot(xs, [x["operator_peak_rss_mib"] for x in burst], "o-", label="after the burst")
        ax.set(xlabel=key, ylabel="operator peak RSS (MiB)", xscale="log")
        ax.legend()
    against = "lanes (top, 5,000 jobs) and against jobs (bottom, 1 lane)" if len(rows) > 1 else "jobs (1 lane)"
    fig.suptitle(f"gpulane operator: cost against {against}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def alternated(args: argparse.Namespace) -> None:
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.jobs}
    for _ in range(args.rounds):
        for n in args.jobs:
            runs[n].append(run("latency", "--pending", str(n), "--jobs", str(args.dispatches)))
    print("| jobs | round | dispatch p50 / p99 (p99 / p50) | operator CPU per dispatch | writes per dispatch |")
    print("|---|---|---|---|---|")
    for n, results in runs.items():
        for i, lat in enumerate(results, 1):
            print(
                f"| {n:,} | {i} | {lat['total_p50_ms']} / {lat['total_p99_ms']} ms "
                f"({lat['total_p99_ms'] / lat['total_p50_ms']:.1f}) | {lat['operator_cpu_ms_per_dispatch']} ms "
                f"| {lat['operator_writes_per_dispatch']} |"
            )
    first = statistics.median(r["operator_cpu_ms_per_dispatch"] for r in runs[args.jobs[0]])
    for n, results in runs.items():
        cpu = statistics.median(r["operator_cpu_ms_per_dispatch"] for r in results)
        print(f"{n:,} jobs: median CPU per dispatch {cpu:.1f} ms, {cpu / first:.2f}x that at {args.jobs[0]:,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 5000, 20000])
    parser.add_argument("--dispatches", type=int, default=100)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--rounds", type=int, help="only the latency bench, the sizes in turn, this many rounds")
    args = parser.parse_args()
    if args.rounds:
        alternated(args)
        return
    d = str(args.dispatches)
    by_lanes = [
        {
            "lanes": n,
            "latency": run("latency", "--lanes", str(n), "--pending", "5000", "--jobs", d),
            "scale": run("scale", "--lanes", str(n), "--jobs", "5000", "--dispatches", d),
        }
        for n in args.lanes
    ]
    one_lane = next((r for r in by_lanes if r["lanes"] == 1), None)
    by_jobs = [
        {"jobs": n, "latency": one_lane["latency"], "scale": one_lane["scale"]}
        if one_lane is not None and n == 5000  # the same run as 1 lane's above
        else {
            "jobs": n,
            "latency": run("latency", "--pending", str(n), "--jobs", d),
            "scale": run("scale", "--jobs", str(n), "--dispatches", d),
        }
        for n in args.jobs
    ]
    print(
        "| lanes | jobs | dispatch p50 / p99 | apiserver trip p50 | operator CPU per dispatch "
        "| writes/s (per dispatch) | positioned jobs/s (apiserver's creates/s) | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in [*by_lanes, *by_jobs]:
        lat, burst = r["latency"], r["scale"]
        print(
            f"| {lat['lanes']} | {burst['jobs']:,} | {lat['total_p50_ms']} / {lat['total_p99_ms']} ms "
            f"| {lat['apiserver_round_trip_p50_ms']} ms | {lat['operator_cpu_ms_per_dispatch']} ms "
            f"| {lat['operator_writes_per_second']} ({lat['operator_writes_per_dispatch']}) "
            f"| {burst['jobs_per_second']} ({round(burst['jobs'] / burst['create_seconds_apiserver'])}) "
            f"| {burst['operator_peak_rss_mib']} MiB |"
        )
    if args.plot:
        plot(by_lanes, by_jobs, args.plot)


if __name__ == "__main__":
    main()
