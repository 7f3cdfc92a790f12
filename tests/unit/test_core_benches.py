"""The core's benchmarks run, at toy sizes: ``make bench`` broke once when the core's API moved under
``bench/dispatch.py``'s baseline, and nothing noticed until its figures were wanted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


@pytest.mark.parametrize("teams", ["0", "3"])
def test_the_dispatch_bench_times_decisions_and_the_rescoring_baseline(teams):
    *_, row = bench("bench/dispatch.py", "--pending", "300", "--decisions", "30", "--repeat", "1",
                    "--baseline-decisions", "2", "--teams", teams)  # fmt: skip
    pending, median, p99, baseline, ratio = row.split()
    assert pending == "300" and 0 < float(median) <= float(p99) and float(baseline) > 0 and ratio.endswith("x")


def test_the_simulator_bench_times_both_rankings():
    *_, row = bench("bench/simulator.py", "--repeat", "1")
    assert row.startswith("gpulane ") and "fifo " in row and "ratio" in row


def test_the_dispatch_bench_times_the_forecasts_fork():
    *_, row = bench("bench/dispatch.py", "--pending", "300", "--forks", "3")
    pending, median, most = row.split()
    assert pending == "300" and 0 < float(median) <= float(most)
