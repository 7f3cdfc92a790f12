"""The operator on the local cluster: warm dispatch latency, 5,000 jobs created at once, and model swaps
on the real node beside kwok's.

    .venv/bin/python bench/operator.py latency [--jobs 200]
    .venv/bin/python bench/operator.py scale [--jobs 5000] [--shards N | --shards-versus N]
    .venv/bin/python bench/operator.py swap [--rounds 3 --swaps 5]

Both start the local control plane if none runs (hack/gpulane_cluster.py), apply crds/, and run
``gpulane operator`` as its own process, exactly as the end-to-end tests do.

latency: one lane with a warm pod and a queue of jobs for its model. The bench acts as the executor:
it writes a Running job's completion and times, through a watch, the next job turning Running. The
apiserver's share is measured side by side: the same write-then-watch round trip on an object nobody
reacts to (a no-op status patch of a finished job). A dispatch needs two such trips (the completion
reaching the operator, the Running write reaching the watcher), so ``total - 2 x round trip`` is the
operator's own part; the same trip once the operator has stopped (``apiserver_idle_round_trip_*``) is the
apiserver's tail with nothing else writing. The timing starts once every job shows its phase, the operator has
forecast the whole queue since (the first such forecast after a burst rewrites the far positions that moved), and it
has gone quiet (15 s without an API write but its Lease's, under 5% of a core, the apiserver under 20% of one and
the machine under half of one: no garbage collection of a burst's aftermath, whose cycles came every 10 s), or after
600 s; the report says which (``settled_after_seconds``, ``quiet_before_timing``). It also gives the three slowest
dispatches with the trip timed right after each, the p99 of each dispatch less twice that trip
(``operator_part_p99_ms``), and how many dispatches the operator's own histogram put past 25, 50 and 100 ms
(``operator_internal_over_ms``): whether a tail is the apiserver's or the operator's; and how long the read of
/metrics before the timing took (``operator_scrape_ms``: a scrape is served on the operator's loop). With
``--trip-every N`` the trip is timed after every Nth dispatch only, and dispatches follow one another without
it between them. ``--profile FILE`` samples the operator with py-spy while timed; ``--profile-format
speedscope`` keeps the samples in order, so a run of consecutive samples in one call is one hold of the loop.

swap: a job for the other model than the one loaded, applied -> Running, on a lane on the real node gpu-0
(the operator deletes the pod, waits until it is gone, creates the next one, and the kubelet's readiness
probe finds `gpulane fake-backend` loaded) and on a kwok lane (kwok sets the pod's status), alternated
round by round on the same machine; the ratio is the real node's cost over kwok's.

scale: a busy lane, then N jobs created from 16 threads. It reports the time until every job shows a
queue position, the creation time alone (the apiserver), the operator's API writes (its own counter)
and its peak memory (VmHWM). With --shards N, N operators (the default shard and --shard s1...) each get their
lanes and a model of their own, and the jobs are spread over the models; --shards-versus N runs one shard and
N shards alternately in the same run and reports N's figures over one's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import (
    REPO,
    PhaseWatch,
    PodWatch,
    bench_world,
    cpu_seconds,
    create_jobs,
    machine,
    machine_ticks,
    peak_rss_mib,
    pids_named,
    wait_quiet,
)

from gpulane.api.shards import SHARD_LABEL
from gpulane.core.sim.report import percentile  # the one percentile definition (type 7)
from tests.e2e.operator_support import GROUP, OPERATOR_NAMESPACE, VERSION, OperatorProcess
from tests.e2e.support import wait_until


def shards_of(bench: Any, args: argparse.Namespace, stack: contextlib.ExitStack, stem: str) -> list[Any]:
    """``args.shards`` operators (the bench's, the default shard, and ``--shard s1``...), each with
    ``args.lanes`` lanes and a model of its own (docs/operations.md, "Shards"); returns (operator, model, labels)
    of each."""
    out = []
    for k in range(args.shards):
        labels = {SHARD_LABEL: f"s{k}"} if k else {}
        operator = bench.operator
        if k:
            operator = OperatorProcess(bench.cluster, bench.work, *args.operator_args, "--shard", f"s{k}").start()
            stack.callback(operator.stop)
        model = bench.world.model(f"{stem}{k}", ready_delay="0s", labels=labels)
        for i in range(args.lanes):
            bench.world.lane(f"s{k}-lane{i}", labels=labels)
        out.append((operator, model, labels))
    return out


def over_bounds(samples: dict[str, float], histogram: str, bounds_ms: tuple[str, ...]) -> dict[str, int]:
    """How many observations of ``histogram`` (its samples as ``name{labels}`` -> value) exceeded each bound, in ms
    (each a bucket's upper bound)."""
    count = samples.get(f"{histogram}_count", 0.0)
    return {ms: round(count - samples.get(f'{histogram}_bucket{{le="{int(ms) / 1000}"}}', 0.0)) for ms in bounds_ms}


def latency(args: argparse.Namespace) -> dict[str, Any]:
    with bench_world(*args.operator_args, crds=args.crds) as bench, contextlib.ExitStack() as stack:
        api, world, namespace = bench.api, bench.world, bench.namespace
        shards = shards_of(bench, args, stack, "warm")
        operators = [operator for operator, _, _ in shards]
        watcher = PhaseWatch(api, namespace)
        total = max(args.pending, args.jobs) + args.lanes * args.shards
        names = [f"j{i:05d}" for i in range(total)]
        docs = []
        for i, n in enumerate(names):  # created in their shard (as the bridge does): this times dispatches
            _, model, labels = shards[i % args.shards]
            doc = world.job_doc(n, model, member=f"m{i % 7}")
            doc["metadata"]["labels"] = labels
            docs.append(doc)
        create_jobs(world, docs)
        # Every job queued, as the watch tells (listing 100,000 jobs a second would time the listing instead).
        phases: dict[str, str] = {}
        deadline = time.monotonic() + 1800
        while len(phases) < len(names):
            _at, name, obj = watcher.until(lambda n, p, o: p is not None, timeout=max(1.0, deadline - time.monotonic()))
            phases[name] = obj["status"]["phase"]
        running = {name for name, phase in phases.items() if phase == "Running"}
        # A lane's first job may turn Running after the last job showed its first phase (a pod slower than the
        # creations). A lane that never runs one is held by something else: say so rather than time nothing.
        while len(running) < args.lanes * args.shards:
            try:
                running.add(watcher.until(lambda n, p, o: p == "Running", timeout=300)[1])
            except queue.Empty:
                raise SystemExit(
                    f"{len(running)} of the bench's {args.lanes * args.shards} lanes run a job after 300 s: is an "
                    "interrupted run's queue still on the cluster (`kubectl get gpujobs -A`)?"
                ) from None
        # Quiet for longer than a GC cycle's period, after a forecast of the whole queue has caught up with it.
        settling, settling_writes, quiet = wait_quiet(operators, quiet=15.0, whole_forecasts=1)
        scraped = time.monotonic()
        before = [operator.metrics() for operator in operators]
        scrape = (time.monotonic() - scraped) / len(operators)  # the operator's loop is held up to as long
        pids = [operator.proc.pid for operator in operators if operator.proc is not None]
        cpu = sum(map(cpu_seconds, pids))
        if args.profile:  # py-spy samples the (first) operator for the timed window only, then writes on SIGINT
            spy = subprocess.Popen([args.py_spy, "record", "--pid", str(pids[0]), "--format", args.profile_format,
                                    "--rate", "200", "--nonblocking", "-o", args.profile],
                                   stdout=subprocess.DEVNULL)  # fmt: skip
            time.sleep(1.0)  # py-spy attaches before the first dispatch
            cpu = sum(map(cpu_seconds, pids))
        started = time.monotonic()
        totals: list[float] = []
        trips: list[float | None] = []  # each --trip-every'th dispatch's trip; None for the others
        others: list[int] = []  # other jobs' writes the watch delivered while each dispatch was awaited
        walls: list[float] = []  # each dispatch's start on the wall clock, to set beside the apiserver's log
        done: set[str] = set()
        for i in range(args.jobs):
            finished = min(running)
            t0, seen = time.monotonic(), watcher.seen
            walls.append(time.time())
            world.complete(finished)
            running.discard(finished)
            done.add(finished)
            at, name, _obj = watcher.until(
                lambda n, p, o: p == "Running" and n not in done and n not in running, timeout=60
            )
            totals.append(at - t0)
            others.append(watcher.seen - seen - 2)  # not the completion's event, nor the Running one
            running.add(name)
            if i % args.trip_every:
                trips.append(None)
                continue
            # The apiserver alone: the same write-then-watch trip on a finished job.
            t1 = time.monotonic()
            patch = {"status": {"message": f"bench {t1}"}}
            world.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "gpujobs", finished, patch)
            at2, _n, _o = watcher.until(
                lambda n, p, o, r=finished, m=patch["status"]["message"]: (
                    n == r and (o.get("status") or {}).get("message") == m
                )
            )
            trips.append(at2 - t1)
        elapsed = time.monotonic() - started
        cpu = sum(map(cpu_seconds, pids)) - cpu
        if args.profile:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        after: dict[str, float] = {}
        lifetime: dict[str, float] = {}  # since each operator started: the burst that built the queue too
        for operator, was in zip(operators, before, strict=True):  # the shards' counters, summed
            for k, v in operator.metrics().items():
                after[k] = after.get(k, 0.0) + v - was.get(k, 0.0)
                lifetime[k] = lifetime.get(k, 0.0) + v
        peak_rss = max(peak_rss_mib(pid) for pid in pids)
        if args.timeline:  # each dispatch: its start (wall clock, s), its time and the trip after it (ms)
            rows = zip(walls, totals, trips, strict=True)
            Path(args.timeline).write_text(
                "".join(f"{w:.3f} {t * 1000:.1f} {'nan' if r is None else f'{r * 1000:.1f}'}\n" for w, t, r in rows)
            )
        # The apiserver's trip once nothing else writes: the operators stopped, the same patch on finished jobs.
        for operator in operators:
            operator.stop()
        idle: list[float] = []
        for i in range(args.idle_trips):
            name, t1 = sorted(done)[i % len(done)], time.monotonic()
            message = f"idle {t1}"
            world.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "gpujobs", name, {"status": {"message": message}}
            )
            at2, _n, _o = watcher.until(
                lambda n, p, o, r=name, m=message: n == r and (o.get("status") or {}).get("message") == m
            )
            idle.append(at2 - t1)
        watcher.stop()
        internal_n, internal_s = (
            after["gpulane_dispatch_latency_seconds_count"],
            after["gpulane_dispatch_latency_seconds_sum"],
        )
        writes = sum(v for k, v in after.items() if k.startswith("gpulane_api_writes_total{"))
        # Each dispatch less twice the trip timed right after it: a tail the apiserver's slow moments leave unexplained.
        parts = [total - 2 * trip for total, trip in zip(totals, trips, strict=True) if trip is not None]
        timed_trips = [trip for trip in trips if trip is not None]
        # How often the operator's loop woke its 50 ms probe late by more than each bound, while timed; and how many
        # dispatches the operator itself took longer than each (its own histogram): a slow one the operator held,
        # beside a slow total it did not.
        lag = "gpulane_event_loop_lag_seconds"
        lag_n = after.get(f"{lag}_count", 0.0)
        lag_over = over_bounds(after, lag, ("10", "25", "50", "100"))
        own_over = over_bounds(after, "gpulane_dispatch_latency_seconds", ("25", "50", "100"))
        # The status passes' forecasts while timed: how many, and how often one held the loop past each bound.
        holds = over_bounds(after, "gpulane_forecast_hold_seconds", ("10", "25", "50", "100"))
        passes = {scope: round(after.get(f'gpulane_forecast_seconds_count{{scope="{scope}"}}', 0.0))
                  for scope in ("queue", "heads")}  # fmt: skip
        # Python's full collections in the operators, while timed and since they started: each holds the loop, and
        # a dispatch behind it waits.
        young = 'gpulane_gc_pause_seconds_{}{{generation="{}"}}'
        full = 'gpulane_gc_pause_seconds_{}{{generation="2"}}'
        full_gc = {when: {"count": round(counts.get(full.format("count"), 0.0)),
                          "seconds": round(counts.get(full.format("sum"), 0.0), 3)}
                   for when, counts in (("timed", after), ("since_start", lifetime))}  # fmt: skip
        # The young ones while timed: one walks what survived since the last, and holds the loop as long.
        young_gc = {}
        for gen in ("0", "1"):
            count = after.get(young.format("count", gen), 0.0)
            bucket = 'gpulane_gc_pause_seconds_bucket{{generation="{}",le="{}"}}'
            young_gc[gen] = {
                "count": round(count),
                "seconds": round(after.get(young.format("sum", gen), 0.0), 3),
                "over_ms": {ms: round(count - after.get(bucket.format(gen, ms / 1000), 0.0)) for ms in (10, 25)},
            }
        return {
            "shards": args.shards,
            "lanes": args.lanes * args.shards,
            "pending": total,
            "dispatches": len(totals),
            "settled_after_seconds": round(settling, 1),
            "writes_while_settling": settling_writes,
            "quiet_before_timing": quiet,
            "total_p50_ms": round(statistics.median(totals) * 1000, 1),
            "total_p99_ms": round(percentile(totals, 99) * 1000, 1),
            "apiserver_round_trips": len(timed_trips),
            "apiserver_round_trip_p50_ms": round(statistics.median(timed_trips) * 1000, 1),
            "apiserver_round_trip_p99_ms": round(percentile(timed_trips, 99) * 1000, 1),
            "apiserver_idle_round_trip_p50_ms": round(statistics.median(idle) * 1000, 1) if idle else None,
            "apiserver_idle_round_trip_p99_ms": round(percentile(idle, 99) * 1000, 1) if idle else None,
            "operator_part_p50_ms": round((statistics.median(totals) - 2 * statistics.median(timed_trips)) * 1000, 1),
            "operator_part_p99_ms": round(percentile(parts, 99) * 1000, 1),
            "operator_internal_mean_ms": round(internal_s / internal_n * 1000, 1) if internal_n else None,
            "operator_internal_over_ms": own_over,
            "operator_full_collections": full_gc,
            "operator_young_collections": young_gc,
            "operator_gc_freezes": round(lifetime.get("gpulane_gc_freezes_total", 0.0)),
            "operator_writes_per_second": round(writes / elapsed, 1),
            "operator_writes_per_dispatch": round(writes / len(totals), 1),
            "operator_writes_per_dispatch_by_kind": {
                k.partition('kind="')[2].rstrip('"}'): round(after[k] / len(totals), 2)
                for k in sorted(after)
                if k.startswith("gpulane_api_writes_total{") and after[k] > 0
            },
            "operator_cpu_ms_per_dispatch": round(cpu / len(totals) * 1000, 1),
            # Where the tail comes from: the slowest dispatches, the apiserver's trip right after each, and how
            # many other jobs' writes (the operator's position rewrites) reached the watch meanwhile.
            "slowest": [
                {
                    "ms": round(totals[i] * 1000, 1),
                    "trip_ms": None if (trip := trips[i]) is None else round(trip * 1000, 1),
                    "other_writes": others[i],
                    "at": round(walls[i], 3),
                }
                for i in sorted(range(len(totals)), key=totals.__getitem__)[-3:][::-1]
            ],
            "other_writes_per_dispatch_p50": statistics.median(others),
            "loop_lag_samples": round(lag_n),
            "loop_lag_samples_over_ms": lag_over,
            "forecasts": passes,
            "forecast_holds_over_ms": holds,
            "operator_peak_rss_mib": peak_rss,
            "operator_scrape_ms": round(scrape * 1000, 1),
        }


def swap(args: argparse.Namespace) -> dict[str, Any]:
    with bench_world(*args.operator_args, crds=args.crds) as bench:
        world = bench.world
        watcher = PhaseWatch(bench.api, bench.namespace)
        pods = PodWatch(bench.api, OPERATOR_NAMESPACE)
        phases: list[dict[str, float]] = []
        models = {
            "real": [world.real_model(f"real{i}", load_seconds=0) for i in range(2)],
            "kwok": [world.model(f"kwok{i}", ready_delay="0s") for i in range(2)],
        }
        times: dict[str, list[float]] = {"real": [], "kwok": []}
        for r in range(args.rounds):
            for kind in ("real", "kwok"):
                lane = world.real_lane(f"real{r}") if kind == "real" else world.lane(f"kwok{r}")
                for i in range(args.swaps + 1):  # the first load of each round is not a swap
                    name = f"{kind}-{r}-{i}"
                    doc = world.job_doc(name, models[kind][i % 2])
                    t0 = time.monotonic()
                    create_jobs(world, [doc])
                    at, _n, _o = watcher.until(lambda n, p, o, j=name: n == j and p == "Running", timeout=120)
                    if i:
                        times[kind].append(at - t0)
                        if kind == "real" and (split := pods.swap_phases(lane, t0, at)) is not None:
                            phases.append(split)
                    world.complete(name)
                world.custom.delete_cluster_custom_object(GROUP, VERSION, "gpulanes", lane)
                wait_until(lambda lane=lane: not world.backend_pods(lane), timeout=60, what=f"lane {lane}'s pod gone")
        watcher.stop()
        pods.stop()
        real, kwok = statistics.median(times["real"]), statistics.median(times["kwok"])
        return {
            "swaps_each": len(times["real"]),
            "real_node_p50_s": round(real, 2),
            "real_node_max_s": round(max(times["real"]), 2),
            "kwok_p50_s": round(kwok, 2),
            "kwok_max_s": round(max(times["kwok"]), 2),
            "ratio_p50": round(real / kwok, 1),
            # The real node's swaps split by the backend pods' milestones as the bench's watch saw them.
            "real_node_phases_p50_s": {k: round(statistics.median(p[k] for p in phases), 2) for k in phases[0]}
            if phases
            else {},
            "real_node_swaps_split": len(phases),
        }


def scale(args: argparse.Namespace) -> dict[str, Any]:
    with bench_world(*args.operator_args, crds=args.crds) as bench, contextlib.ExitStack() as stack:
        api, world, namespace = bench.api, bench.world, bench.namespace
        # The jobs are spread over the shards' models.
        made = shards_of(bench, args, stack, "busy")
        operators, models = [operator for operator, _, _ in made], [model for _, model, _ in made]
        blockers = [world.job(f"blocker-{k}-{i}", model) for k, model in enumerate(models) for i in range(args.lanes)]
        for name in blockers:
            world.wait_phase(name, "Running")
        watcher = PhaseWatch(api, namespace)
        before = [operator.metrics() for operator in operators]
        bands = ["interactive", "normal", "batch"]
        docs = [world.job_doc(f"s{i:05d}", models[i % args.shards], priority=bands[i % 3], member=f"m{i % 50}")
                for i in range(args.jobs)]  # fmt: skip
        for i, doc in enumerate(docs):
            if args.labelled and i % args.shards:  # created in their shard, as a creator that knows it would
                doc["metadata"]["labels"] = {SHARD_LABEL: f"s{i % args.shards}"}
        pids = [operator.proc.pid for operator in operators if operator.proc is not None]
        cpu = sum(map(cpu_seconds, pids))
        others = {name: pids_named(name) for name in ("kube-apiserver", "etcd")}
        others_cpu = {name: sum(map(cpu_seconds, pids)) for name, pids in others.items()}
        ticks = machine_ticks()
        t0 = time.monotonic()
        create_jobs(world, docs)
        created = time.monotonic() - t0
        positioned: set[str] = set()
        last = t0
        while len(positioned) < args.jobs:
            at, name, obj = watcher.until(lambda n, p, o: True, timeout=600)
            if name not in blockers and (obj.get("status") or {}).get("position") and name not in positioned:
                positioned.add(name)
                last = at
        elapsed = last - t0
        cpu = sum(map(cpu_seconds, pids)) - cpu  # a share near 1.0 per shard: its one event loop is the bound
        others_cpu = {name: sum(map(cpu_seconds, pids)) - others_cpu[name] for name, pids in others.items()}
        ticks = {k: v - ticks[k] for k, v in machine_ticks().items()}
        all_ticks = sum(ticks.values())
        writes: dict[str, float] = {}
        for operator, was in zip(operators, before, strict=True):
            for k, v in operator.metrics().items():
                if k.startswith("gpulane_api_writes_total{"):
                    writes[k.split('"')[1]] = writes.get(k.split('"')[1], 0) + v - was.get(k, 0)
        rss_positioned = max(peak_rss_mib(pid) for pid in pids)
        # Then many dispatches with the queue still long: lane history and job stories must stay bounded.
        # The watch tells which job runs next; listing 5,000 jobs per step would time the bench instead.
        d0 = time.monotonic()
        for name in blockers:
            world.complete(name)
        done = set(blockers)
        for _ in range(args.dispatches):
            _, name, _ = watcher.until(lambda n, p, o: p == "Running" and n not in done, timeout=60)
            done.add(name)
            world.complete(name)
        dispatch_seconds = time.monotonic() - d0
        watcher.stop()
        jobs = world.jobs()
        lane = world.custom.list_cluster_custom_object(GROUP, VERSION, "gpulanes")["items"][0]
        return {
            "shards": args.shards,
            "lanes": args.lanes * args.shards,
            "jobs": args.jobs,
            "create_seconds_apiserver": round(created, 1),
            "all_positioned_seconds": round(elapsed, 1),
            "jobs_per_second": round(args.jobs / elapsed, 1),
            "operator_cpu_share_positioning": round(cpu / elapsed, 2),
            # While positioning, in cores: the apiserver and etcd; and the machine's idle and stolen shares.
            **{f"{name}_cpu_share_positioning": round(c / elapsed, 2) for name, c in others_cpu.items()},
            "machine_idle_share_positioning": round((ticks["idle"] + ticks["iowait"]) / all_ticks, 2),
            "machine_steal_share_positioning": round(ticks["steal"] / all_ticks, 2),
            "operator_writes": {k: int(v) for k, v in sorted(writes.items()) if v},
            "operator_peak_rss_mib_positioned": rss_positioned,
            "dispatches_after": args.dispatches,
            "dispatches_per_second_with_queue": round(args.dispatches / dispatch_seconds, 1),
            "operator_peak_rss_mib": max(peak_rss_mib(pid) for pid in pids),
            "lane_status_bytes": len(json.dumps(lane.get("status") or {})),
            "largest_job_status_bytes": max(len(json.dumps(j.get("status") or {})) for j in jobs),
        }


def shards_versus(bench: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The bench with one shard and with ``--shards-versus`` shards, alternated round by round in one run."""
    runs: dict[str, list[dict[str, Any]]] = {"one": [], "sharded": []}
    for _ in range(args.versus_rounds):
        for which, count in (("one", 1), ("sharded", args.shards_versus)):
            runs[which].append(bench(argparse.Namespace(**{**vars(args), "shards": count})))
    numbers = [k for k, v in runs["one"][0].items() if isinstance(v, int | float)]
    pairs = {k: [t[k] / o[k] for o, t in zip(runs["one"], runs["sharded"], strict=True) if o[k]] for k in numbers}
    ratio = {k: round(statistics.median(v), 2) for k, v in pairs.items() if v}
    return {"runs": runs, "sharded_over_one_median": ratio}


def versus(bench: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The bench against the base commit's operator and this tree's, alternated so that a drifting machine
    slows both alike; the base's ``gpulane`` is imported first through PYTHONPATH (``git archive``), and its
    ``crds/`` are applied for its rounds (a CRD's rules are part of what a status write costs the apiserver)."""
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "this": []}
    with tempfile.TemporaryDirectory() as tmp:
        tree = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.base, "gpulane", "crds"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=tree.stdout, check=True)
        for round_ in range(1, args.versus_rounds + 1):
            for which in ("base", "this"):
                os.environ.pop("PYTHONPATH", None)
                if which == "base":
                    os.environ["PYTHONPATH"] = tmp  # the operator process inherits it
                crds = Path(tmp) / "crds" if which == "base" else args.crds  # each side with its own CRDs
                side: dict[str, Any] = {"crds": crds}
                if getattr(args, "timeline", None):  # one file a run: FILE.base.1, FILE.this.1, ...
                    side["timeline"] = f"{args.timeline}.{which}.{round_}"
                runs[which].append(bench(argparse.Namespace(**{**vars(args), **side})))
        os.environ.pop("PYTHONPATH", None)
    numbers = [k for k, v in runs["this"][0].items() if isinstance(v, int | float)]
    pairs = {k: [t[k] / b[k] for b, t in zip(runs["base"], runs["this"], strict=True) if b[k]] for k in numbers}
    ratio = {k: round(statistics.median(v), 2) for k, v in pairs.items() if v}  # no ratio to a base of 0
    return {"base": args.base, "runs": runs, "this_over_base_median": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--jobs", type=int, default=200, help="dispatches timed")
    lat.add_argument("--pending", type=int, default=0, help="jobs queued behind them (default: just those)")
    lat.add_argument("--lanes", type=int, default=1, help="warm lanes per shard, each on a kwok node of its own")
    lat.add_argument(
        "--timeline", help="each dispatch's wall-clock start, time and trip to this file (--base: FILE.base.1, ...)"
    )
    lat.add_argument("--profile", help="sample the operator with py-spy while timed; collapsed stacks to this file")
    lat.add_argument("--profile-format", default="raw", choices=("raw", "speedscope"),
                     help="collapsed stacks, or each sample in order (speedscope: the loop's holds)")  # fmt: skip
    lat.add_argument("--py-spy", default="py-spy", help="the py-spy to run (pip install py-spy; not a dependency)")
    lat.add_argument("--idle-trips", type=int, default=100, help="apiserver trips timed after the operator stopped")
    lat.add_argument(
        "--trip-every", type=int, default=1, help="time the apiserver's trip after every Nth dispatch (default: each)"
    )
    sc = sub.add_parser("scale")
    sc.add_argument("--jobs", type=int, default=5000)
    sc.add_argument("--dispatches", type=int, default=200, help="jobs run one after another once all are queued")
    sc.add_argument("--lanes", type=int, default=1, help="busy lanes per shard, each on a kwok node of its own")

    sc.add_argument("--labelled", action="store_true", help="jobs created with their shard's label (no hand-over)")
    sw = sub.add_parser("swap")
    sw.add_argument("--rounds", type=int, default=3, help="rounds, each one lane on the real node then one on kwok")
    sw.add_argument("--swaps", type=int, default=5, help="swaps per lane and round")
    for p in (lat, sc):
        p.add_argument("--shards", type=int, default=1, help="operators, each with its lanes and model (--shard)")
        p.add_argument("--shards-versus", type=int, help="one shard then this many, alternated (--versus-rounds)")
    for p in (lat, sc, sw):
        p.set_defaults(crds=REPO / "crds")
        p.add_argument("--operator-args", nargs="*", default=[], help="extra arguments for gpulane operator")
        p.add_argument("--base", help="also run the operator of this commit, alternated round by round")
        p.add_argument("--versus-rounds", type=int, default=2, help="rounds of base then this tree (with --base)")
    args = parser.parse_args()
    bench = {"latency": latency, "scale": scale, "swap": swap}[args.what]
    if getattr(args, "shards_versus", None):
        result = shards_versus(bench, args)
    else:
        result = versus(bench, args) if args.base else bench(args)
    result["machine"] = machine()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
