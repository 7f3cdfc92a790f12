"""One version: the package's (pyproject.toml reads gpulane.__version__), the chart's appVersion, and so the
image tag the chart defaults to; `gpulane version` prints it."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import yaml

from gpulane import __version__
from gpulane.cli import main

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpulane"


def test_the_chart_and_the_package_carry_gpulanes_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert importlib.metadata.version("gpulane") == __version__, "reinstall: make install"
    assert yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"] == "", "the tag follows appVersion"


def test_gpulane_version_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"gpulane {__version__}\n"
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"gpulane {__version__}\n"
