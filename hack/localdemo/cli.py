"""`make demo`: sets up the local cluster with the real node gpu-0, installs the chart with the demo's
values, plays a film against interactive image calls, and prints what happened beside what FIFO and strict
priority would have done. The system is left running to explore."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

from localcluster import ClusterError, default_state_dir, up
from localcluster.layout import tools_bindir

from gpulane.api.resources import GpuPolicySpec

from . import release
from .plan import STUDIO, Plan
from .play import Player
from .progress import Progress, StepFailed
from .summary import summarize
from .view import LiveView

HACK = Path(__file__).resolve().parents[1]
# `make demo`'s time on the project's 2-core machine: cold (a fresh clone, empty caches) and warm (tools and
# images cached, cluster stopped). The one source of these figures: README.md and docs/demo.md ("Times")
# state them as "about N minutes", and tests/unit/test_demo_times.py fails when they differ from these.
COLD_MINUTES, WARM_MINUTES = 18, 2
ADMIN = "gpulane-admin"  # kubectl's user in the local cluster's admin kubeconfig


def explore(tools: release.Tools, bridge_url: str, ui_url: str) -> str:
    ns = release.NAMESPACE
    return f"""
gpulane keeps running. Explore it:
  the web page: {ui_url}  (log in with the key {STUDIO.key}, docs/ui.md)
  export KUBECONFIG={tools.kubeconfig} PATH="{tools.bindir}:$PATH"
  kubectl get gj -n {ns}                   # every job, its phase, band, score and wait
  .venv/bin/gpulane queue -n {ns} --watch  # the queue as the operator sees it
  .venv/bin/gpulane why shot-05 -n {ns}    # why a shot waited: who went ahead, and which term decided
  curl -s {bridge_url}/chat/completions -H "Authorization: Bearer {STUDIO.key}" \\
       -H "X-LlamaSwap-Priority: interactive" -H "Content-Type: application/json" \\
       -d '{{"model": "sdxl", "messages": [{{"role": "user", "content": "hi"}}]}}'
  Grafana: import deploy/grafana/gpulane-dashboard.json (the operator's metrics are on its pods' :8080/metrics)
  make cluster-down                        # stop it all and give the host back
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--short", action="store_true", help="the suite's shorter film and fewer calls")
    args = parser.parse_args(argv)
    plan = Plan.short() if args.short else Plan()
    progress = Progress(default_state_dir().parent / "demo-logs")
    progress.say(
        f"gpulane demo: a film of {plan.shots} shots at batch priority, {len(plan.calls)} interactive image calls"
        f" and {len(plan.previews)} preview share one GPU, the real node gpu-0.\n"
        f"The first run builds Kubernetes, containerd and CoreDNS from source (about {COLD_MINUTES} minutes on 2"
        f" cores); later runs take about {WARM_MINUTES} minutes. Logs: {progress.logs}\n"
    )
    try:
        progress.run("node packages (runc, CNI plugins, mmdebstrap)", [str(HACK / "node" / "deps.sh")])
        progress.run("tools (kube-apiserver, etcd, kubelet, containerd, helm ...)", [str(HACK / "tools" / "build.sh")])
        with progress.step("cluster and images (etcd, kube-apiserver, the real node gpu-0)") as log, log.open("a") as f:
            info = up(log=lambda line: print(line, file=f, flush=True), real_node=True)
        tools = release.Tools(tools_bindir(), info.kubeconfig)
        with (
            progress.step("chart (operator, admission, bridge, web page, policy, lane, models)"),
            tempfile.TemporaryDirectory() as tmp,
        ):
            release.install(tools, Path(tmp), ADMIN)
        bridge_url = release.bridge_url(tools)
        view = LiveView(progress.out)
        player = Player(tools, plan, bridge_url, view)
        with contextlib.nullcontext() if view.tty else progress.step("play"):
            jobs = player.play()
    except (StepFailed, ClusterError, RuntimeError, TimeoutError) as err:
        print(f"\nerror: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    policy = GpuPolicySpec.model_validate((tools.get("gpupolicy", "default").get("spec")) or {})
    summary = summarize(jobs, player.lane(), player.models(), policy)
    progress.say("\n" + summary.render())
    for answer in player.answers:
        if answer.error:
            progress.say(f"{answer.call.key.member}'s call failed: {answer.error}")
    progress.say(explore(tools, bridge_url, release.ui_url(tools)))
    return 1 if any(a.error for a in player.answers) else 0
