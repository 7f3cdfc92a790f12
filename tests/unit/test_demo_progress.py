"""`make demo`'s steps (hack/localdemo/progress.py): name and elapsed time as plain lines when stdout is not
a terminal, a spinner redrawn in place when it is, and the end of the step's log when it fails."""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path

import pytest

HACK = Path(__file__).resolve().parents[2] / "hack"
if str(HACK) not in sys.path:
    sys.path.insert(0, str(HACK))

from localdemo import progress  # noqa: E402  (lives in hack/, which is not a package)
from localdemo.progress import Progress, StepFailed, elapsed  # noqa: E402

from .helpers import until_now  # noqa: E402


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def use_clock(monkeypatch: pytest.MonkeyPatch, clock: Callable[[], float]) -> None:
    """progress.py's time.monotonic, and only its own."""
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=clock))


def ticks(*times: float) -> Callable[[], float]:
    """A clock answering ``times`` in order, and failing the test if asked once more."""
    left = list(times)
    return lambda: left.pop(0)


def spinners() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive() and t is not threading.current_thread()}


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.0, "0.0s"),
        (4.24, "4.2s"),
        (59.94, "59.9s"),
        (59.96, "1m00s"),  # not "60.0s"
        (60.0, "1m00s"),
        (187.3, "3m07s"),
        (3600.0, "60m00s"),
    ],
)
def test_elapsed_is_tenths_under_a_minute_then_minutes_and_seconds(seconds: float, shown: str) -> None:
    assert elapsed(seconds) == shown


def test_without_a_tty_a_step_is_two_plain_lines_its_name_then_done_in_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_clock(monkeypatch, ticks(100.0, 103.0, 105.5))  # Progress made, the step begins, the step ends
    out = io.StringIO()
    steps = Progress(tmp_path / "logs", out)
    assert not steps.tty
    with steps.step("tools (kube-apiserver, etcd)") as log:
        log.write_text("go build ./cmd/kube-apiserver\n")
    assert out.getvalue() == "[3.0s] tools (kube-apiserver, etcd) ...\ndone   tools (kube-apiserver, etcd) in 2.5s\n"
    assert log == tmp_path / "logs" / "tools.log"  # the step's output stays in its log
    assert log.read_text() == "go build ./cmd/kube-apiserver\n"


def test_a_step_over_a_minute_shows_minutes_and_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_clock(monkeypatch, ticks(0.0, 65.0, 65.0 + 14 * 60 + 19.4))
    out = io.StringIO()
    with Progress(tmp_path, out).step("tools (helm)"):
        pass
    assert out.getvalue() == "[1m05s] tools (helm) ...\ndone   tools (helm) in 14m19s\n"


def test_a_failing_step_names_itself_and_carries_the_end_of_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_clock(monkeypatch, ticks(0.0, 1.0, 3.0))
    out = io.StringIO()
    steps = Progress(tmp_path, out)
    cause = RuntimeError("`hack/tools/build.sh` exited with 2")
    with pytest.raises(StepFailed) as failed, steps.step("tools (kube-apiserver, etcd)") as log:
        log.write_text("".join(f"build line {i}\n" for i in range(1, 31)))
        raise cause
    assert out.getvalue() == (
        "[1.0s] tools (kube-apiserver, etcd) ...\n"
        "FAILED tools (kube-apiserver, etcd) after 2.0s: `hack/tools/build.sh` exited with 2\n"
    )
    message = str(failed.value)
    head, _, end = message.partition("\n")
    assert head == "tools (kube-apiserver, etcd) failed: `hack/tools/build.sh` exited with 2"
    assert end.splitlines() == [f"--- the end of {log} ---", *(f"build line {i}" for i in range(6, 31))]
    assert failed.value.__cause__ is cause


def test_run_puts_the_commands_output_in_the_steps_log_and_not_on_stdout(tmp_path: Path) -> None:
    out = io.StringIO()
    Progress(tmp_path, out).run("node packages (runc)", ["sh", "-c", "echo fetched runc; echo warning >&2"])
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert re.fullmatch(r"\[\d+\.\ds\] node packages \(runc\) \.\.\.", lines[0]), lines
    assert re.fullmatch(r"done   node packages \(runc\) in \d+\.\ds", lines[1]), lines
    assert (tmp_path / "node.log").read_text() == "fetched runc\nwarning\n"


def test_run_of_a_failing_command_fails_the_step_with_its_exit_code_and_output(tmp_path: Path) -> None:
    out = io.StringIO()
    argv = ["sh", "-c", "echo 'Get:1 runc'; echo 'E: Unable to locate package mmdebstrap' >&2; exit 100"]
    with pytest.raises(StepFailed) as failed:
        Progress(tmp_path, out).run("node packages (runc, mmdebstrap)", argv)
    failure = r"^FAILED node packages \(runc, mmdebstrap\) after \d+\.\ds: `sh -c .*` exited with 100$"
    assert re.search(failure, out.getvalue(), re.M), out.getvalue()
    assert str(failed.value).startswith("node packages (runc, mmdebstrap) failed: `sh -c ")
    assert str(failed.value).endswith(
        f"exited with 100\n--- the end of {tmp_path / 'node.log'} ---\n"
        "Get:1 runc\nE: Unable to locate package mmdebstrap"
    )


def test_on_a_tty_the_spinner_redraws_the_steps_name_and_elapsed_time_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "FRAME_SECONDS", 0.005)
    second = itertools.count(0.0, 1.0)  # every reading of the clock is one second later
    use_clock(monkeypatch, lambda: next(second))
    out = FakeTTY()
    steps = Progress(tmp_path, out)  # 0 s
    assert steps.tty
    before = spinners()
    with steps.step("tools (etcd)"):  # begins at 1 s
        until_now(lambda: out.getvalue().count("\x1b[K") >= 6, "six frames of the spinner")
    text = out.getvalue()
    frames = re.findall(r"\r(.) tools \(etcd\)  (\S+)\x1b\[K", text)
    assert len(frames) >= 6
    # Each frame turns the spinner one step and shows the time since the step began (one second per reading).
    assert "".join(f for f, _ in frames) == "".join(itertools.islice(itertools.cycle("|/-\\"), len(frames)))
    assert [shown for _, shown in frames] == [f"{i}.0s" for i in range(1, len(frames) + 1)]
    # Redrawn in place: nothing but the frames, then the line is cleared and the step's last line printed.
    assert text == "".join(f"\r{f} tools (etcd)  {s}\x1b[K" for f, s in frames) + (
        f"\r\x1b[Kdone   tools (etcd) in {len(frames) + 1}.0s\n"
    )
    assert spinners() == before, "the spinner's thread outlived its step"


def test_on_a_tty_a_failing_step_stops_the_spinner_and_prints_its_failure_on_a_clean_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "FRAME_SECONDS", 0.005)
    out = FakeTTY()
    steps = Progress(tmp_path, out)
    before = spinners()
    with (
        pytest.raises(StepFailed, match=r"^chart \(operator\) failed: helm: timed out\n"),
        steps.step("chart (operator)"),
    ):
        until_now(lambda: "\r| chart (operator)  " in out.getvalue(), "the spinner's first frame")
        raise TimeoutError("helm: timed out")
    text = out.getvalue()
    assert re.search(r"\x1b\[K\r\x1b\[KFAILED chart \(operator\) after \d+\.\ds: helm: timed out\n$", text), text
    assert spinners() == before, "the spinner's thread outlived its failed step"


def test_ctrl_c_in_a_step_is_not_reported_as_the_step_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_clock(monkeypatch, ticks(0.0, 0.0, 2.0))
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), Progress(tmp_path, out).step("tools (etcd)") as log:
        log.write_text("compiling\n")
        raise KeyboardInterrupt
    assert out.getvalue() == "[0.0s] tools (etcd) ...\nstopped tools (etcd) after 2.0s\n"


def test_progress_writes_to_the_stdout_of_when_it_is_made(tmp_path: Path) -> None:
    """Not to the sys.stdout of when progress.py was imported: a redirected stdout gets the lines."""
    replaced = io.StringIO()
    with contextlib.redirect_stdout(replaced):
        Progress(tmp_path).say("gpulane demo")
    assert replaced.getvalue() == "gpulane demo\n"
