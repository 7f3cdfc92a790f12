"""`make demo`'s live view (hack/localdemo/view.py), fed jobs as the API returns them: one plain line per
change of a job's phase when stdout is not a terminal (CI, a pipe), the queue redrawn in place on one."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from typing import Any

HACK = Path(__file__).resolve().parents[2] / "hack"
if str(HACK) not in sys.path:
    sys.path.insert(0, str(HACK))

from localdemo.view import CLEAR, LiveView  # noqa: E402  (lives in hack/, which is not a package)

NOW = 1_800_000_000.0


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def job(name: str, member: str, model: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "gpulane-demo", "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": {"model": model, "member": member, "priority": "batch", "tier": "max"},
        "status": status,
    }


def test_without_a_tty_each_job_gets_a_line_for_each_phase_it_enters_and_no_more() -> None:
    out = io.StringIO()
    view = LiveView(out)
    assert not view.tty
    shot = job("shot-01", "alice", "h3-video", phase="Running", lane="gpu-0", score={"total": -96.0})
    image = job("job-7f3a", "carol", "sdxl", phase="Pending", position=1, score={"total": 112.5})
    fresh = job("shot-02", "alice", "h3-video")  # no status yet: Pending
    view.show(3.2, [shot, image, fresh], {}, NOW, "film 0/4 shots, images 0/2 answered")
    assert out.getvalue().splitlines() == [
        "[   3.2s] Running     shot-01 (alice, h3-video) score -96.0 on gpu-0",
        "[   3.2s] Pending     job-7f3a (carol, sdxl) position 1",
        "[   3.2s] Pending     shot-02 (alice, h3-video)",
    ]

    # The same phases again, a new position and score: nothing new (the terminal view shows those).
    image["status"]["position"] = 2
    view.show(4.0, [shot, image, fresh], {}, NOW, "film 0/4 shots, images 0/2 answered")
    assert len(out.getvalue().splitlines()) == 3

    shot["status"]["phase"] = "Succeeded"
    image["status"] = {"phase": "Dispatching", "lane": "gpu-0", "score": {"total": 112.5}}
    view.show(65.4, [shot, image, fresh], {}, NOW, "film 1/4 shots, images 0/2 answered")
    assert out.getvalue().splitlines()[3:] == [
        "[  1m05s] Succeeded   shot-01 (alice, h3-video)",
        "[  1m05s] Dispatching job-7f3a (carol, sdxl) score 112.5 on gpu-0",
    ]


def test_without_a_tty_a_job_without_a_member_shows_a_dash() -> None:
    out = io.StringIO()
    anonymous = job("job-1", "", "sdxl", phase="Failed")
    LiveView(out).show(0.5, [anonymous], {}, NOW, "")
    assert out.getvalue() == "[   0.5s] Failed      job-1 (-, sdxl)\n"


def test_on_a_tty_the_queue_is_redrawn_from_the_top_with_the_time_and_progress() -> None:
    out = FakeTTY()
    view = LiveView(out)
    assert view.tty
    running = job("shot-01", "alice", "h3-video", phase="Running", lane="gpu-0", startedAt="2027-01-15T08:00:00Z")
    waiting = job("job-7f3a", "carol", "sdxl", phase="Pending", position=1, score={"priority": 100, "total": 112.5})
    view.show(12.0, [running, waiting], {}, NOW, "film 0/10 shots, images 0/5 answered")
    first = out.getvalue()
    assert first.startswith(f"{CLEAR}gpulane demo  12.0s  film 0/10 shots, images 0/5 answered\n\n")
    assert "RUNNING" in first and "gpulane-demo/shot-01" in first and "gpu-0" in first
    assert "POS" in first and "gpulane-demo/job-7f3a" in first and "112.5" in first

    waiting["status"] = {"phase": "Running", "lane": "gpu-0"}
    view.show(75.0, [running, waiting], {}, NOW, "film 1/10 shots, images 1/5 answered")
    second = out.getvalue()[len(first) :]
    assert second.startswith(f"{CLEAR}gpulane demo  1m15s  film 1/10 shots, images 1/5 answered\n\n")
    assert "no job is waiting" in second
    assert out.getvalue().count(CLEAR) == 2


def test_the_view_writes_to_the_stdout_of_when_it_is_made() -> None:
    replaced = io.StringIO()
    with contextlib.redirect_stdout(replaced):
        LiveView().show(1.0, [job("shot-01", "alice", "h3-video", phase="Running", lane="gpu-0")], {}, NOW, "")
    assert replaced.getvalue() == "[   1.0s] Running     shot-01 (alice, h3-video)\n"
