"""The core's benchmarks run, at toy sizes: ``make bench`` broke once when the core's API moved under
``bench/dispatch.py``'s baseline, and nothing noticed until its figures were wanted."""

from __future__ import annotations

import json
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
    pending, median, most, forked, alone = row.split()
    assert pending == "300" and 0 < float(median) <= float(most) and float(forked) > 0 and float(alone) > 0


def test_the_gc_report_sets_the_dispatches_beside_the_apiservers_cycles(tmp_path):
    """bench/gctrace.py reads Go's gctrace lines after the log's last start: a cycle from 10.0 to 14.5 s after it."""
    log = tmp_path / "kube-apiserver.log"
    log.write_text(
        "=== 2026-12-06T10:59:50+00:00 starting: kube-apiserver (an earlier start: its cycles are not this one's)\n"
        "gc 9 @19.000s 3%: 0.1+900+0.05 ms clock, 0.2+1/2/0+0.1 ms cpu, 10->12->6 MB, 12 MB goal, 2 P\n"
        "=== 2026-12-06T11:00:00+00:00 starting: kube-apiserver\n"
        "I1206 11:00:01 some other line\n"
        "gc 1 @10.000s 12%: 0.25+4499.7+0.05 ms clock, 0.5+492/867/0+0.16 ms cpu, 1313->1544->1660 MB, "
        "1543 MB goal, 5 MB stacks, 0 MB globals, 2 P\n"
    )
    start = 1796554800.0  # 2026-12-06T11:00:00Z
    timeline = tmp_path / "timeline.txt"  # start (s), dispatch (ms), trip after it (ms)
    timeline.write_text(f"{start + 8:.3f} 30.0 12.0\n{start + 11:.3f} 200.0 90.0\n{start + 16:.3f} 31.0 11.0\n")
    report = json.loads("\n".join(bench("bench/gctrace.py", str(timeline), "--log", str(log), "--slowest", "1")))
    assert report["gc_cycles_in_window"] == 1 and report["live_heap_mb_after_gc"] == 1660
    assert report["share_of_dispatches_overlapping_gc"] == round(1 / 3, 3)
    assert report["slowest"] == [{"ms": 200.0, "trip_ms": 90.0, "during_gc": True}]
    assert report["overlapping_gc"] == {"p50_ms": 200.0, "p99_ms": 200.0, "p99_over_p50": 1.0}
    assert report["clear_of_gc"] == {"p50_ms": 30.5, "p99_ms": 31.0, "p99_over_p50": 1.02}  # 30.99 / 30.5


def test_the_apiserver_write_bench_strips_every_cel_rule_and_nothing_else(monkeypatch):
    """bench/apiserver_writes.py sets the GpuJob CRD beside itself without its CEL rules, in a group of its own."""
    import yaml

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    writes = __import__("apiserver_writes")
    crd = yaml.safe_load((ROOT / "crds/gpulane.io_gpujobs.yaml").read_text())
    bare = writes.in_group(crd, "nocel.bench.gpulane.io", rules=False)
    assert bare["metadata"]["name"] == "gpujobcopies.nocel.bench.gpulane.io"
    assert bare["spec"]["group"] == "nocel.bench.gpulane.io"
    # Nobody's `kubectl get gpujob` (or gj, or the gpulane category) finds the copy while the bench runs.
    assert bare["spec"]["names"] == {"kind": "GpuJobCopy", "listKind": "GpuJobCopyList", "plural": "gpujobcopies",
                                     "singular": "gpujobcopy"}  # fmt: skip
    assert "x-kubernetes-validations" not in json.dumps(bare)
    kept = writes.in_group(crd, "this.bench.gpulane.io")
    assert kept["spec"]["versions"] == crd["spec"]["versions"] and crd["spec"]["names"]["plural"] == "gpujobs"

    def paths(node, at=""):  # every key path of the schema, rules left out
        if isinstance(node, dict):
            for key, value in node.items():
                if key != "x-kubernetes-validations":
                    yield f"{at}/{key}"
                    yield from paths(value, f"{at}/{key}")

    assert set(paths(bare["spec"]["versions"])) == set(paths(crd["spec"]["versions"]))
    assert writes.allocated_bytes("# HELP x\ngo_memstats_alloc_bytes_total 1.5e+09\n") == 1.5e9
    with pytest.raises(ValueError, match="go_memstats_alloc_bytes_total"):
        writes.allocated_bytes("process_cpu_seconds_total 3\n")
