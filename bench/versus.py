"""The dispatch benchmark on this tree and on a base commit, alternated in one run, as a ratio.

The base commit's ``gpulane`` package is extracted with ``git archive`` into a temporary directory;
each round runs ``bench/dispatch.py`` (this tree's script, which uses only the public core API)
once against each tree, in child processes, alternating so that a drifting host slows both alike.

    .venv/bin/python bench/versus.py [--base 69f7a58] [--rounds 4] [--pending 10000 100000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(tree: Path, pending: int, decisions: int, repeat: int, teams: int) -> float:
    """The median decision time (us) of one ``bench/dispatch.py`` run against ``tree``'s gpulane."""
    args = [sys.executable, str(ROOT / "bench" / "dispatch.py"), "--pending", str(pending)]
    args += ["--decisions", str(decisions), "--repeat", str(repeat), "--baseline-decisions", "0", "--teams", str(teams)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(args, env=env, cwd=tempfile.gettempdir(), check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1].split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="69f7a58")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pending", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--teams", type=int, default=0, help="members in teams (a base from before 6ab552d has none)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.base, "gpulane"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; base {args.base}")
        print(f"{'pending':>8} {'base us':>18} {'this tree us':>18} {'ratio':>7}")
        for n in args.pending:
            old: list[float] = []
            new: list[float] = []
            for _ in range(args.rounds):
                old.append(run(base, n, args.decisions, args.repeat, args.teams))
                new.append(run(ROOT, n, args.decisions, args.repeat, args.teams))
            ratio = statistics.median(b / a for a, b in zip(old, new, strict=True))
            spread = lambda xs: f"{min(xs):.1f}-{max(xs):.1f}"  # noqa: E731
            print(f"{n:>8} {spread(old):>18} {spread(new):>18} {ratio:>6.2f}x")


if __name__ == "__main__":
    main()
