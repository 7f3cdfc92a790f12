import importlib.util
import json
from pathlib import Path

import pytest

from gpulane.cli import main

SCENARIO = str(Path(__file__).resolve().parents[2] / "scenarios" / "film-burst-vs-interactive.yaml")


def test_json_has_jobs_and_summary(capsys):
    assert main(["simulate", SCENARIO, "--policy", "gpulane", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    job = payload["jobs"][0]
    assert {
        "name",
        "stream",
        "member",
        "tier",
        "priority",
        "model",
        "submittedAt",
        "dispatchedAt",
        "startedAt",
        "finishedAt",
        "coldStart",
    } <= set(job)
    assert job["name"] == "film-0" and job["priority"] == -100
    probe = next(j for j in payload["jobs"] if j["name"] == "probe")
    assert probe["stream"] is None
    images = payload["summary"]["streams"]["images"]
    assert {"p50", "p95", "p99", "max"} <= set(images["waitSeconds"])
    assert {"swaps", "gpuUtilisation"} <= set(images)
    assert probe["score"]["priority"] == 100 and probe["score"]["total"] >= 100
    assert "interactive" in payload["summary"]["bands"]
    assert 0 < payload["summary"]["overall"]["gpuUtilisation"] <= 1


def test_compare_prints_a_side_by_side_table(capsys):
    assert main(["simulate", SCENARIO, "--compare", "fifo,strict,llama-swap,gpulane"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "fifo" in line)
    assert header.split() == ["fifo", "strict", "llama-swap", "gpulane"]
    assert "wait p95" in out and "swaps" in out and "fairness (interactive, Jain)" in out


def test_plot_writes_a_png(tmp_path, capsys):
    target = tmp_path / "out.png"
    assert main(["simulate", SCENARIO, "--compare", "fifo,gpulane", "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_what_to_install(tmp_path, capsys, monkeypatch):
    """The image installs gpulane without the `plots` extra."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["simulate", SCENARIO, "--plot", str(tmp_path / "out.png")]) == 2
    assert "pip install 'gpulane[plots]'" in capsys.readouterr().err
    assert not (tmp_path / "out.png").exists()


def test_bad_scenario_exits_2_with_the_reason(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\njobs: [{name: a, model: m, runSeconds: 5, priority: urgent}]\n")
    assert main(["simulate", str(bad)]) == 2
    assert "priority 'urgent'" in capsys.readouterr().err


def test_unknown_policy_is_refused(capsys):
    with pytest.raises(SystemExit) as err:
        main(["simulate", SCENARIO, "--compare", "fifo,lottery"])
    assert err.value.code == 2
    assert "unknown policy 'lottery'" in capsys.readouterr().err


def test_a_flood_scenario_exits_2(tmp_path, capsys):
    flood = tmp_path / "flood.yaml"
    flood.write_text(
        "name: f\nstreams: [{name: s, member: m, model: x, runSeconds: 1,"
        " arrival: {poissonPerHour: 1.0e+6}, until: 12h}]\n"
    )
    assert main(["simulate", str(flood)]) == 2
    err = capsys.readouterr().err
    assert "plans more than 200,000 jobs" in err
    assert "warning: model 'x' is not declared" in err


@pytest.mark.parametrize("seconds", ["0", str(7 * 86400 + 1)])
def test_the_bridge_refuses_a_run_limit_out_of_range(seconds, tmp_path):
    with pytest.raises(SystemExit, match="--max-run-seconds must be from 1 to 604800"):
        main(["bridge", "--keys-file", str(tmp_path / "keys.yaml"), "--max-run-seconds", seconds])


def test_the_operator_refuses_a_shard_name_that_is_no_label_value():
    with pytest.raises(SystemExit, match="--shard: shard name 'Big': lowercase letters, digits and '-'"):
        main(["operator", "--shard", "Big"])
