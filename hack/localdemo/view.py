"""The live view while the demo plays: the queue as `gpulane queue` shows it, redrawn in place on a
terminal; elsewhere one plain line per change of a job's phase."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from gpulane.explain import report

from .progress import elapsed

Body = dict[str, Any]
CLEAR = "\x1b[H\x1b[2J"


def who(job: Body) -> str:
    spec = job.get("spec") or {}
    return f"{job['metadata']['name']} ({spec.get('member') or '-'}, {spec.get('model')})"


class LiveView:
    def __init__(self, out: TextIO | None = None) -> None:
        self.out = sys.stdout if out is None else out  # sys.stdout when called, not when imported
        self.tty = self.out.isatty()
        self._phases: dict[str, str] = {}

    def show(self, seconds: float, jobs: list[Body], models: dict[str, Body], now: float, progress: str) -> None:
        if self.tty:
            frame = report.render_queue(report.queue(jobs, models, now))
            self.out.write(f"{CLEAR}gpulane demo  {elapsed(seconds)}  {progress}\n\n{frame}\n")
            self.out.flush()
            return
        for job in jobs:
            name, status = job["metadata"]["name"], job.get("status") or {}
            phase = status.get("phase") or "Pending"
            if self._phases.get(name) == phase:
                continue
            self._phases[name] = phase
            score = status.get("score") or {}
            detail = f"position {status['position']}" if phase == "Pending" and status.get("position") else ""
            if phase in ("Dispatching", "Running") and score:
                detail = f"score {score.get('total')} on {status.get('lane')}"
            print(f"[{elapsed(seconds):>7}] {phase:<11} {who(job)} {detail}".rstrip(), file=self.out, flush=True)
