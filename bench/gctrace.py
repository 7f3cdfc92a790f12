"""Were the slow dispatches the apiserver's garbage collections? Sets a latency run's dispatches beside the GC
cycles the apiserver logged.

    GODEBUG=gctrace=1 .venv/bin/python hack/gpulane_cluster.py up   # the components log each GC cycle
    .venv/bin/python bench/operator.py latency --pending 100000 --timeline /tmp/timeline.txt
    .venv/bin/python bench/gctrace.py /tmp/timeline.txt [--log ~/.local/state/gpulane/cluster/logs/kube-apiserver.log]

A Go GC cycle marks the heap concurrently, with a quarter of the cores and assists from the allocating requests:
for as long as it lasts the apiserver answers slower. The report gives the share of the timed window the
apiserver spent in a cycle, and the share of all dispatches, and of the slowest, that overlapped one. If the
slowest overlap far more often than the window's share, the tail is the collector's. The dispatches clear of a
cycle, and those that overlapped one, each get their p50 and p99: the operator's dispatch apart from the
collector's moments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import statistics
from pathlib import Path

from gpulane.core.sim.report import percentile  # the one percentile definition (type 7)

LOG = Path.home() / ".local/state/gpulane/cluster/logs/kube-apiserver.log"
START = re.compile(r"^=== (\S+) starting: ")
# gc 12 @34.567s 3%: 0.1+450+0.07 ms clock, ... 347->412->207 MB, 408 MB goal, ...
CYCLE = re.compile(r"^gc \d+ @([\d.]+)s \d+%: ([\d.]+)\+([\d.]+)\+([\d.]+) ms clock,.* (\d+)->(\d+)->(\d+) MB")


def cycles(log: Path) -> list[tuple[float, float, int]]:
    """The GC cycles of the apiserver's last start: (wall-clock start, end, live heap after in MB)."""
    started, out = None, []
    for line in log.read_text(errors="replace").splitlines():
        if m := START.match(line):
            started, out = datetime.datetime.fromisoformat(m[1]).timestamp(), []
        elif started is not None and (m := CYCLE.match(line)):
            at = started + float(m[1])
            out.append((at, at + sum(map(float, m.group(2, 3, 4))) / 1000, int(m[7])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline", type=Path, help="bench/operator.py latency --timeline's file")
    parser.add_argument("--log", type=Path, default=LOG, help="the apiserver's log, written with GODEBUG=gctrace=1")
    parser.add_argument("--slowest", type=int, default=5, help="how many of the slowest dispatches to set apart")
    args = parser.parse_args()
    rows = [tuple(map(float, line.split())) for line in args.timeline.read_text().splitlines() if line.strip()]
    gcs = cycles(args.log)
    if not gcs:
        raise SystemExit(f"no GC cycle in {args.log}: start the cluster with GODEBUG=gctrace=1")
    window = (rows[0][0], rows[-1][0] + rows[-1][1] / 1000)
    inside = [(a, b, mb) for a, b, mb in gcs if b > window[0] and a < window[1]]
    in_gc = sum(min(b, window[1]) - max(a, window[0]) for a, b, _ in inside)

    def overlaps(row: tuple[float, ...]) -> bool:
        # The dispatch, and the trip timed after it (nan: none was, --trip-every).
        begin, end = row[0], row[0] + (row[1] + (0.0 if math.isnan(row[2]) else row[2])) / 1000
        return any(a < end and b > begin for a, b, _ in inside)

    slowest = sorted(rows, key=lambda r: r[1])[-args.slowest :]
    report = {
        "dispatches": len(rows),
        "window_seconds": round(window[1] - window[0], 1),
        "gc_cycles_in_window": len(inside),
        "gc_cycle_ms_median": round(statistics.median((b - a) * 1000 for a, b, _ in inside), 1) if inside else None,
        "live_heap_mb_after_gc": inside[-1][2] if inside else None,
        "share_of_window_in_gc": round(in_gc / (window[1] - window[0]), 3),
        "share_of_dispatches_overlapping_gc": round(sum(map(overlaps, rows)) / len(rows), 3),
        "slowest": [
            {"ms": r[1], "trip_ms": None if math.isnan(r[2]) else r[2], "during_gc": overlaps(r)}
            for r in reversed(slowest)
        ],
        "overlapping_gc": _spread([r[1] for r in rows if overlaps(r)]),
        "clear_of_gc": _spread([r[1] for r in rows if not overlaps(r)]),
    }
    print(json.dumps(report, indent=1))


def _spread(ms: list[float]) -> dict[str, float] | None:
    """The p50 and p99 of some dispatches' times (ms), and the one over the other: the brief's 4x, asked of them."""
    if not ms:
        return None
    p50, p99 = statistics.median(ms), percentile(ms, 99)
    return {"p50_ms": round(p50, 1), "p99_ms": round(p99, 1), "p99_over_p50": round(p99 / p50, 2)}


if __name__ == "__main__":
    main()
