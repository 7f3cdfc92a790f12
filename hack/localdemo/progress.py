"""Steps with their name, elapsed time and a spinner on a terminal; plain lines otherwise (CI, a pipe).

A step's own output goes to a log file, shown (its tail) only when the step fails."""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

SPINNER = "|/-\\"
FRAME_SECONDS = 0.2  # how often the spinner redraws


class StepFailed(RuntimeError):
    """A step that failed; the message names it and carries the end of its log."""


def elapsed(seconds: float) -> str:
    """``4.2s`` under a minute, ``3m07s`` from then on (59.96 s is ``1m00s``, not ``60.0s``)."""
    tenths = round(seconds, 1)
    if tenths < 60:
        return f"{tenths:.1f}s"
    minutes, secs = divmod(int(tenths), 60)
    return f"{minutes}m{secs:02d}s"


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Progress:
    def __init__(self, logs: Path, out: TextIO | None = None) -> None:
        # sys.stdout when called, not when imported: a redirected stdout (a pipe, contextlib, pytest) is used
        self.logs, self.out = logs, sys.stdout if out is None else out
        self.tty = self.out.isatty()
        self.started = time.monotonic()
        logs.mkdir(parents=True, exist_ok=True)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[Path]:
        """Runs the body as the step ``name``; yields the step's log file."""
        log = self.logs / f"{name.split()[0]}.log"
        log.write_text("")
        begun = time.monotonic()
        done = threading.Event()
        spinner = threading.Thread(target=self._spin, args=(name, begun, done), daemon=True)
        if self.tty:
            spinner.start()
        else:
            self.say(f"[{elapsed(begun - self.started)}] {name} ...")
        try:
            yield log
        except Exception as err:
            self._stop(done, spinner)
            self._line(f"FAILED {name} after {elapsed(time.monotonic() - begun)}: {err}")
            raise StepFailed(f"{name} failed: {err}\n--- the end of {log} ---\n{tail(log)}") from err
        except BaseException:  # Ctrl-C or an exit: not the step failing, so it goes on as itself
            self._stop(done, spinner)
            self._line(f"stopped {name} after {elapsed(time.monotonic() - begun)}")
            raise
        self._stop(done, spinner)
        self._line(f"done   {name} in {elapsed(time.monotonic() - begun)}")

    @staticmethod
    def _stop(done: threading.Event, spinner: threading.Thread) -> None:
        done.set()
        if spinner.is_alive():
            spinner.join()

    def run(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        """One command as a step, its output in the step's log."""
        with self.step(name) as log, log.open("a") as sink:
            proc = subprocess.run(list(argv), stdout=sink, stderr=subprocess.STDOUT, env=env, check=False)
            if proc.returncode:
                raise RuntimeError(f"`{' '.join(argv)}` exited with {proc.returncode}")

    def _spin(self, name: str, begun: float, done: threading.Event) -> None:
        for frame in itertools.cycle(SPINNER):
            if done.wait(FRAME_SECONDS):
                return
            self.out.write(f"\r{frame} {name}  {elapsed(time.monotonic() - begun)}\x1b[K")
            self.out.flush()

    def _line(self, text: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[K")
        self.say(text)
