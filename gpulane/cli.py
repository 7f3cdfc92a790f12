"""The ``gpulane`` command line."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from typing import Any, get_args

from gpulane import __version__
from gpulane.core.baselines import RANKINGS
from gpulane.core.policy import FAIR_SHARE_MODES, PolicyError
from gpulane.core.sim.engine import simulate
from gpulane.core.sim.llamaswap import Clients
from gpulane.core.sim.report import comparison_table, jobs_json, llama_swap_settings, summarize
from gpulane.core.sim.scenario import ScenarioError, load_scenario

# The commands that need the cluster's libraries (kopf, kubernetes, aiohttp) live in modules of their own,
# imported only when their command runs: name -> (module, its arguments, its entry point, help).
COMMANDS = {
    "operator": ("gpulane.operator.main", "add_arguments", "run",
                 "run the Kubernetes operator (kopf) against the current cluster"),
    "bridge": ("gpulane.bridge.main", "add_arguments", "run",
               "run the OpenAI-compatible bridge: API calls become GpuJobs"),
    "queue": ("gpulane.explain.main", "queue_arguments", "run_queue",
              "the queue as the dispatcher sees it: running jobs, then positions and scores"),
    "why": ("gpulane.explain.main", "why_arguments", "run_why",
            "why a job (or a chain's latest step) waited: what ran ahead of it, and the term that let it win"),
    "chains": ("gpulane.explain.main", "chains_arguments", "run_chains",
               "each GpuChain: progress, phase, current step and ETA"),
    "result": ("gpulane.explain.result", "result_arguments", "run_result",
               "a job's answer: from its ConfigMap, or streamed from the bridge's results volume"),
    "lanes": ("gpulane.explain.main", "lanes_arguments", "run_lanes",
              "each GPU: resident model, running jobs, queue depth, swaps and use"),
    "usage": ("gpulane.explain.main", "usage_arguments", "run_usage",
              "each namespace's and member's GPU time over a window, weight and fair-share usage"),
    "ui": ("gpulane.ui.main", "add_arguments", "run",
           "serve the live web page: lanes, the queue, chains, a job's story and usage (docs/ui.md)"),
    "fake-backend": ("gpulane.fakes.backend", "add_arguments", "run",
                     "an OpenAI-compatible fake model server (tests, demo)"),
    "webhook": ("gpulane.admission.main", "add_arguments", "run",
                "run the admission webhook alone (priority caps, trusted tier and member)"),
    "webhook-config": ("gpulane.admission.main", "add_config_arguments", "run_config",
                       "print the webhook configurations to kubectl apply"),
    "import-llama-swap": ("gpulane.importers.llama_swap", "add_arguments", "run",
                          "print GpuModels for a llama-swap config.yaml (warnings on stderr)"),
    "admission-policies": ("gpulane.admission.cel", "add_arguments", "run",
                           "print the admission rules as the apiserver's own policies (CEL), to kubectl apply"),
}  # fmt: skip


# A policy named NAME:restart runs on today's lanes: the scenario's servers taken away (a pod per model).
RESTART = ":restart"


def _policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n.removesuffix(RESTART) not in RANKINGS]
    if unknown or not names:
        choices = ", ".join(RANKINGS)
        raise argparse.ArgumentTypeError(
            f"unknown policy {', '.join(unknown)!r}; choose from {choices} (each also as NAME{RESTART})"
        )
    return names


def _simulate(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # said before an hour of simulation
        print("error: --plot needs matplotlib: pip install 'gpulane[plots]'", file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(args.scenario)
    except (ScenarioError, PolicyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for warning in scenario.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    policies = args.compare or [args.policy]
    if args.llama_swap_clients is not None:
        if "llama-swap" not in policies:
            print(
                "warning: --llama-swap-clients has no effect: the llama-swap policy is not simulated", file=sys.stderr
            )
        llama_swap = scenario.llama_swap.model_copy(update={"clients": args.llama_swap_clients})
        scenario = scenario.model_copy(update={"llama_swap": llama_swap})
    settings: dict[str, object] = {}
    if args.fair_share is not None:
        settings["fair_share"] = args.fair_share
    if args.load_yield is not None:
        settings["load_yield"] = args.load_yield
    if settings:
        scenario = scenario.model_copy(update={"policy": scenario.policy.model_copy(update=settings)})
    try:
        results = {
            name: simulate(
                scenario.without_servers() if name.endswith(RESTART) else scenario,
                name.removesuffix(RESTART),
                deadlines=not args.no_queue_timeouts,
            )
            for name in policies
        }
    except ScenarioError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    spacing = scenario.policy.band_spacing
    summaries = {name: summarize(result, spacing) for name, result in results.items()}
    if args.json:
        payload: dict[str, Any] = {"scenario": scenario.name}
        if "llama-swap" in results:
            payload["llamaSwap"] = scenario.llama_swap.model_dump(mode="json", by_alias=True)
        runs = {name: {"jobs": jobs_json(r), "summary": summaries[name]} for name, r in results.items()}
        if args.compare:
            payload["policies"] = runs
        else:
            payload |= {"policy": args.policy, **runs[args.policy]}
        json.dump(payload, sys.stdout, indent=1, allow_nan=False)
        print()
    else:
        print(f"scenario {scenario.name}: {len(next(iter(results.values())).jobs)} jobs, seed {scenario.seed}")
        if "llama-swap" in results:
            print(f"llama-swap: {llama_swap_settings(scenario.llama_swap)}")
        print(comparison_table(summaries))
    if args.plot:
        from gpulane.plot import plot_results  # matplotlib is slow to import; only when asked

        plot_results(scenario.name, results, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _version(args: argparse.Namespace) -> int:
    print(f"gpulane {__version__}")
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command is listed; only ``command``'s module is imported to add its arguments."""
    parser = argparse.ArgumentParser(prog="gpulane", description="Schedule jobs on a one-job-at-a-time GPU.")
    parser.add_argument("--version", action="version", version=f"gpulane {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    version = commands.add_parser("version", help="print gpulane's version (the image tag the chart defaults to)")
    version.set_defaults(run=_version)
    sim = commands.add_parser("simulate", help="run a scenario on a virtual clock with the real dispatcher")
    sim.add_argument("scenario", help="scenario YAML file")
    sim.add_argument("--policy", default="gpulane", choices=RANKINGS)
    sim.add_argument(
        "--compare",
        type=_policies,
        metavar="P1,P2,...",
        help=f"run several policies side by side ({','.join(RANKINGS)}); NAME{RESTART} runs NAME with a pod per "
        "model, the scenario's servers taken away",
    )
    sim.add_argument(
        "--llama-swap-clients",
        choices=get_args(Clients),
        help="what clients do with llama-swap's 429: retry when the model has room, or give the job up "
        "(default: the scenario's llamaSwap.clients, else retry)",
    )
    sim.add_argument(
        "--fair-share",
        choices=FAIR_SHARE_MODES,
        help="how members of a band share the GPU: by decayed GPU time (usage) or turns (default: the scenario's "
        "policy.fairShare, else usage); the gpulane-turns policy always takes turns",
    )
    sim.add_argument(
        "--load-yield",
        action=argparse.BooleanOptionalAction,
        help="whether a load no job started on yields to a much better newcomer (default: policy.loadYield, else no)",
    )
    sim.add_argument(
        "--no-queue-timeouts",
        action="store_true",
        help="callers still give up after queueTimeoutSeconds, but gpulane is not told: their jobs run anyway",
    )
    sim.add_argument("--json", action="store_true", help="print jobs and summary as one JSON object")
    sim.add_argument("--plot", metavar="FILE.png", help="write waits per stream and a GPU timeline per policy")
    sim.set_defaults(run=_simulate)
    for name, (module_name, arguments, entry, text) in COMMANDS.items():
        sub = commands.add_parser(name, help=text)
        if name == command:
            module = importlib.import_module(module_name)
            getattr(module, arguments)(sub)
            sub.set_defaults(run=getattr(module, entry))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
