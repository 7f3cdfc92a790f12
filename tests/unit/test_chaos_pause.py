"""The chaos run's ``--pause`` (bench/chaos.py): seconds between a recovery and the next fault, MIN,MAX."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from chaos import pause


@pytest.mark.parametrize(("text", "bounds"), [("1,2", (1.0, 2.0)), ("3", (3.0, 3.0)), ("0,0.5", (0.0, 0.5))])
def test_a_pause_is_min_and_max_seconds(text: str, bounds: tuple[float, float]) -> None:
    assert pause(text) == bounds


@pytest.mark.parametrize("text", ["3,1", "-1,2", "x", "1,y", ""])
def test_a_pause_that_is_no_range_of_seconds_is_refused_by_name(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="MIN,MAX seconds with 0 <= MIN <= MAX"):
        pause(text)
