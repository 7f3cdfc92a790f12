"""``wait_until`` itself (support.py): which probe errors it retries, which fail at once, and what a
timeout reports. No cluster is needed."""

from __future__ import annotations

import subprocess
import time
from types import SimpleNamespace

import pytest

from .support import CommandFailed, wait_until


def failing(*errors: Exception, then: object = None) -> tuple[list[int], object]:
    """A probe that raises ``errors`` one per call, then returns ``then``; and the count of its calls."""
    calls: list[int] = []

    def probe() -> object:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return then

    return calls, probe


def test_errors_while_the_thing_is_not_there_yet_are_retried() -> None:
    failed = CommandFailed(["kubectl", "get"], subprocess.CompletedProcess([], 1, "", "NotFound"))
    on_none = AttributeError("'NoneType' object has no attribute 'phase'", obj=None)  # a status not written yet
    calls, probe = failing(KeyError("status"), OSError("refused"), failed, on_none, then="ready")
    assert wait_until(probe, timeout=5, interval=0.01) == "ready" and len(calls) == 5


@pytest.mark.parametrize(
    "error",
    [NameError("nmae"), AttributeError("no attribute 'stauts'", obj=SimpleNamespace()), AssertionError("exited")],
    ids=["NameError", "AttributeError-on-an-object", "AssertionError"],
)
def test_a_broken_or_decided_probe_fails_at_once(error: Exception) -> None:
    calls, probe = failing(error, then="never")
    started = time.monotonic()
    with pytest.raises(type(error)) as raised:
        wait_until(probe, timeout=30, interval=0.01, what="the thing")
    assert raised.value is error and len(calls) == 1 and time.monotonic() - started < 5
    assert "waiting for the thing" in "".join(error.__notes__)


def test_a_timeout_reports_and_chains_the_last_error() -> None:
    calls, probe = failing(*(KeyError("position") for _ in range(1000)))
    with pytest.raises(AssertionError) as raised:
        wait_until(probe, timeout=0.2, interval=0.01, what="a position")
    message = str(raised.value)
    assert "timed out after 0s waiting for a position" in message
    assert f"{len(calls)} of {len(calls)} probes raised; the last raised KeyError('position')" in message
    assert isinstance(raised.value.__cause__, KeyError)
