"""The web page at scale, in Debian's Chromium: first paint with N jobs pending, and how long after the operator's
write a dispatch shows on the page, in the same run as the warm dispatches that make those writes.

    .venv/bin/python bench/ui.py [--pending 5000] [--dispatches 20]

One kwok lane with a warm model and N jobs queued for it (the bench's operator, as bench/operator.py latency),
``gpulane ui`` logged in to with a key that sees the bench's namespace in full. For each view (lanes, queue):

- first paint: from the navigation's start to the first view drawn (the page's ``gpulane-first-view`` mark), a
  fresh page each round;
- update: the bench completes the running job (the executor's write) and notes, through its watch, the wall time
  of the next job's Running write; the page notes (a MutationObserver) the wall time at which that job's name
  shows among the running jobs. Both clocks are this machine's.

The warm dispatch itself (completion written -> next Running seen) is reported beside, from the same rounds: the
page's delay over it is the figure that does not move with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness import PhaseWatch, bench_world, cpu_seconds, create_jobs, peak_rss_mib

from gpulane.core.sim.report import percentile
from tests.e2e.browser import RECORD_SHOWN, chromium, log_in, shown_at
from tests.e2e.operator_support import UiProcess
from tests.e2e.support import wait_until

KEY = "sk-bench-ui-admin"


def run(args: argparse.Namespace) -> dict[str, Any]:
    with bench_world() as bench:
        world, namespace = bench.world, bench.namespace
        world.lane()
        model = world.model("chat", ready_delay="0s")
        names = [f"j{i:05d}" for i in range(args.pending + 1)]
        watcher = PhaseWatch(bench.api, namespace)
        create_jobs(world, [world.job_doc(n, model, member=f"m{i % 7}") for i, n in enumerate(names)])
        phases: dict[str, str] = {}
        while len(phases) < len(names):
            _at, name, obj = watcher.until(lambda n, p, o: p is not None, timeout=600)
            phases[name] = obj["status"]["phase"]
        running = {n for n, p in phases.items() if p == "Running"}
        keys = bench.work / "keys.yaml"
        keys.write_text(f"keys:\n- {{name: bench, key: {KEY}, member: bench, admin: true}}\n")
        ui = UiProcess(bench.cluster, bench.work, namespace, keys).start()
        pid = ui.proc.pid if ui.proc else 0
        out: dict[str, Any] = {"pending": args.pending, "machine": f"{platform.machine()}, {platform.node()}"}
        try:
            with chromium() as browser:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                log_in(page, ui.url, KEY)
                for view in ("lanes", "queue"):
                    paints = []
                    for _ in range(args.paints):
                        fresh = browser.new_page(viewport={"width": 1280, "height": 900})
                        fresh.context.add_cookies(page.context.cookies())
                        fresh.goto(f"{ui.url}/#{view}")
                        fresh.wait_for_selector("#view[data-updated]")  # a selector: the page's CSP forbids eval
                        paints.append(fresh.evaluate("performance.getEntriesByName('gpulane-first-view')[0].startTime"))
                        fresh.close()
                    page.goto(f"{ui.url}/#{view}")
                    page.wait_for_selector("#live.on")
                    page.evaluate(RECORD_SHOWN)
                    delays, dispatches = [], []
                    cpu = cpu_seconds(pid)
                    for _ in range(args.dispatches):
                        finished = min(running)
                        t0 = time.monotonic()
                        world.complete(finished)
                        running.discard(finished)
                        at, name, _obj = watcher.until(lambda n, p, o: p == "Running" and n not in running, timeout=60)
                        written = time.time() - (time.monotonic() - at)  # the watch's monotonic time, on the wall
                        dispatches.append(at - t0)
                        running.add(name)
                        shown = wait_until(
                            lambda n=name: shown_at(page, f"{namespace}/{n}"),
                            timeout=30,
                            interval=0.01,
                            what="the page to show the dispatch",
                        )
                        delays.append(max(0.0, shown - written))
                    out[view] = {
                        "first_paint_ms_median": round(statistics.median(paints), 1),
                        "first_paint_ms_max": round(max(paints), 1),
                        "update_ms_p50": round(statistics.median(delays) * 1000, 1),
                        "update_ms_p99": round(percentile(delays, 99) * 1000, 1),
                        "update_ms_max": round(max(delays) * 1000, 1),
                        "warm_dispatch_ms_p50": round(statistics.median(dispatches) * 1000, 1),
                        "update_over_dispatch_p50": round(statistics.median(delays) / statistics.median(dispatches), 2),
                        "ui_cpu_ms_per_update": round((cpu_seconds(pid) - cpu) / args.dispatches * 1000, 1),
                    }
            out["ui_peak_rss_mib"] = peak_rss_mib(pid)
        finally:
            watcher.stop()
            ui.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pending", type=int, default=5000)
    parser.add_argument("--dispatches", type=int, default=20)
    parser.add_argument("--paints", type=int, default=5)
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=1))
    print(f"log: {Path(sys.argv[0]).name} --pending {args.pending} --dispatches {args.dispatches}", file=sys.stderr)


if __name__ == "__main__":
    main()
