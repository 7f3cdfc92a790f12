"""Simulator speed: a 12-hour scenario of about 1,000 jobs, gpulane against the FIFO baseline.

Both policies run the same event loop in the same process; the ratio shows what gpulane's
ranking costs over the cheapest possible one.

    .venv/bin/python bench/simulator.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from gpulane.core.sim.engine import simulate
from gpulane.core.sim.scenario import load_scenario

SCENARIO = Path(__file__).with_name("twelve-hours.yaml")


def timed(policy: str, repeat: int) -> tuple[float, int, float]:
    scenario = load_scenario(SCENARIO)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = simulate(scenario, policy)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(result.jobs), result.end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    fifo, _, _ = timed("fifo", args.repeat)
    ours, jobs, end = timed("gpulane", args.repeat)
    print(f"{jobs} jobs over {end / 3600:.1f} simulated hours (median of {args.repeat} runs)")
    print(f"gpulane {ours * 1000:.0f} ms, fifo {fifo * 1000:.0f} ms, ratio {ours / fifo:.2f}")


if __name__ == "__main__":
    main()
