"""`make demo`'s command (hack/localdemo/cli.py) without a cluster: its notice up front (the cold and warm
times), the set-up steps in order with a failing one's log, Ctrl-C, and what it prints to explore."""

from __future__ import annotations

import json
import re
import shlex
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "hack") not in sys.path:
    sys.path.insert(0, str(REPO / "hack"))

from localdemo import cli, release  # noqa: E402  (lives in hack/, which is not a package)
from localdemo.plan import IMAGE_MODEL, MODELS, STUDIO, Plan  # noqa: E402
from localdemo.play import film  # noqa: E402

from gpulane.cli import build_parser  # noqa: E402

NODE = "node packages (runc, CNI plugins, mmdebstrap)"
TOOLS = "tools (kube-apiserver, etcd, kubelet, containerd, helm ...)"
CLUSTER = "cluster and images (etcd, kube-apiserver, the real node gpu-0)"
TIME = r"\d+\.\ds"  # a step's elapsed time, as a pattern


def assert_steps(out: str, *patterns: str) -> None:
    """The output's lines after the notice match ``patterns``, one each."""
    lines = out.split(" Logs: ", 1)[1].splitlines()[2:]  # the notice ends with the logs' path and a blank line
    assert len(lines) == len(patterns), lines
    for line, pattern in zip(lines, patterns, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


def script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def hack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hack/ of stand-ins: its scripts leave a mark when they run; the demo's logs go under tmp_path, and the
    cluster never starts (up fails unless a test replaces it)."""
    fake = tmp_path / "hack"
    script(fake / "node" / "deps.sh", f"echo 'runc is installed'\ntouch {tmp_path}/deps-ran")
    script(fake / "tools" / "build.sh", f"echo 'built kube-apiserver'\ntouch {tmp_path}/build-ran")
    monkeypatch.setattr(cli, "HACK", fake)
    monkeypatch.setattr(cli, "default_state_dir", lambda: tmp_path / "state" / "cluster")

    def no_cluster(**_: Any) -> None:
        raise AssertionError("the test's cluster step should not have been reached")

    monkeypatch.setattr(cli, "up", no_cluster)
    return fake


def failing_up(error: BaseException, calls: list[dict[str, Any]]) -> Callable[..., None]:
    def up(log: Callable[[str], None], **kwargs: Any) -> None:
        calls.append(kwargs)
        log("etcd healthy at 0.3 s")
        raise error

    return up


def test_the_notice_comes_first_with_the_plan_the_cold_and_warm_times_and_the_logs(
    hack: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script(hack / "node" / "deps.sh", "exit 1")
    assert cli.main([]) == 1
    out = capsys.readouterr().out
    notice = (
        "gpulane demo: a film of 10 shots at batch priority, 5 interactive image calls and 1 preview share one"
        " GPU, the real node gpu-0.\n"
        "The first run builds Kubernetes, containerd and CoreDNS from source"
        f" (about {cli.COLD_MINUTES} minutes on 2 cores); later runs take about {cli.WARM_MINUTES} minutes."
        f" Logs: {tmp_path / 'state' / 'demo-logs'}\n"
    )
    assert out.startswith(notice), out
    assert (tmp_path / "state" / "demo-logs").is_dir()


def test_short_says_the_shorter_plan(hack: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script(hack / "node" / "deps.sh", "exit 1")
    assert cli.main(["--short"]) == 1
    short = Plan.short()
    assert capsys.readouterr().out.startswith(
        f"gpulane demo: a film of {short.shots} shots at batch priority, {len(short.calls)} interactive image"
        f" calls and {len(short.previews)} preview share one GPU"
    )


def test_a_failing_first_step_stops_the_demo_with_its_name_and_the_end_of_its_log(
    hack: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script(
        hack / "node" / "deps.sh",
        'for i in $(seq 1 40); do echo "apt line $i"; done\n'
        "echo 'E: Unable to locate package mmdebstrap' >&2\nexit 100",
    )
    assert cli.main([]) == 1
    captured = capsys.readouterr()
    assert_steps(
        captured.out,
        rf"\[{TIME}\] {re.escape(NODE)} \.\.\.",
        rf"FAILED {re.escape(NODE)} after {TIME}: `{re.escape(str(hack / 'node' / 'deps.sh'))}` exited with 100",
    )
    assert "apt line" not in captured.out  # the step's output went to its log
    assert not (tmp_path / "build-ran").exists()  # nothing after the failing step ran

    err_lines = captured.err.splitlines()
    log = tmp_path / "state" / "demo-logs" / "node.log"
    assert err_lines[:3] == [
        "",
        f"error: {NODE} failed: `{hack / 'node' / 'deps.sh'}` exited with 100",
        f"--- the end of {log} ---",
    ]
    # The log's last 25 lines: apt lines 17 to 40 and the error apt wrote to stderr.
    assert err_lines[3:] == [*(f"apt line {i}" for i in range(17, 41)), "E: Unable to locate package mmdebstrap"]


def test_the_steps_run_in_order_and_a_cluster_error_fails_its_step(
    hack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(cli, "up", failing_up(cli.ClusterError("port 16001 is taken"), calls))
    assert cli.main(["--short"]) == 1
    assert calls == [{"real_node": True}]
    captured = capsys.readouterr()
    assert_steps(
        captured.out,
        rf"\[{TIME}\] {re.escape(NODE)} \.\.\.",
        rf"done   {re.escape(NODE)} in {TIME}",
        rf"\[{TIME}\] {re.escape(TOOLS)} \.\.\.",
        rf"done   {re.escape(TOOLS)} in {TIME}",
        rf"\[{TIME}\] {re.escape(CLUSTER)} \.\.\.",
        rf"FAILED {re.escape(CLUSTER)} after {TIME}: port 16001 is taken",
    )
    assert "chart" not in captured.out
    logs = tmp_path / "state" / "demo-logs"
    assert (logs / "node.log").read_text() == "runc is installed\n"
    assert (logs / "tools.log").read_text() == "built kube-apiserver\n"
    assert captured.err == (
        f"\nerror: {CLUSTER} failed: port 16001 is taken\n--- the end of {logs / 'cluster.log'} ---\n"
        "etcd healthy at 0.3 s\n"
    )


def test_ctrl_c_stops_the_demo_with_130_and_no_error(
    hack: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "up", failing_up(KeyboardInterrupt(), []))
    assert cli.main([]) == 130
    captured = capsys.readouterr()
    assert_steps(
        captured.out,
        *(rf"\[{TIME}\] {re.escape(NODE)} \.\.\.", rf"done   {re.escape(NODE)} in {TIME}"),
        *(rf"\[{TIME}\] {re.escape(TOOLS)} \.\.\.", rf"done   {re.escape(TOOLS)} in {TIME}"),
        *(rf"\[{TIME}\] {re.escape(CLUSTER)} \.\.\.", rf"stopped {re.escape(CLUSTER)} after {TIME}"),
    )
    assert "FAILED" not in captured.out
    assert captured.err == "\ninterrupted\n"


TOOLS_BIN, KUBECONFIG = Path("/state/tools/bin"), Path("/state/cluster/admin.kubeconfig")
BRIDGE = "http://10.96.0.12:8090/v1"
UI = "http://10.96.0.13:8092/"


def commands() -> list[str]:
    """explore()'s commands: its indented lines without their comments, a continued line joined."""
    text = cli.explore(release.Tools(TOOLS_BIN, KUBECONFIG), BRIDGE, UI).replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.startswith("  ")]


def test_explore_says_each_way_in() -> None:
    text = cli.explore(release.Tools(TOOLS_BIN, KUBECONFIG), BRIDGE, UI)
    assert text.startswith("\ngpulane keeps running. Explore it:\n")
    for expected in (
        f"the web page: {UI}  (log in with the key {STUDIO.key}",
        f'export KUBECONFIG={KUBECONFIG} PATH="{TOOLS_BIN}:$PATH"',
        "kubectl get gj -n gpulane-demo ",
        ".venv/bin/gpulane queue -n gpulane-demo --watch ",
        ".venv/bin/gpulane why shot-05 -n gpulane-demo ",
        f"curl -s {BRIDGE}/chat/completions ",
        "Grafana: import deploy/grafana/gpulane-dashboard.json",
        "make cluster-down ",
    ):
        assert sum(line.startswith(expected) for line in commands()) == 1, (expected, text)


def test_explores_gpulane_commands_parse_with_gpulanes_own_cli() -> None:
    gpulane = [shlex.split(line, comments=True) for line in commands() if line.startswith(".venv/bin/gpulane ")]
    assert [argv[1] for argv in gpulane] == ["queue", "why"]
    queue = build_parser("queue").parse_args(gpulane[0][1:])
    assert (queue.namespace, queue.watch) == (release.NAMESPACE, True)
    why = build_parser("why").parse_args(gpulane[1][1:])
    assert (why.job, why.namespace) == ("shot-05", release.NAMESPACE)
    assert "name: shot-05\n" in film(Plan().shots)  # the shot it asks about is one the demo plays


def test_explores_curl_is_one_valid_call_through_the_bridge() -> None:
    (curl,) = [shlex.split(line, comments=True) for line in commands() if line.startswith("curl ")]
    assert curl[:3] == ["curl", "-s", f"{BRIDGE}/chat/completions"]
    headers = [curl[i + 1] for i, arg in enumerate(curl) if arg == "-H"]
    assert headers == [
        f"Authorization: Bearer {STUDIO.key}",
        "X-LlamaSwap-Priority: interactive",
        "Content-Type: application/json",
    ]
    body = json.loads(curl[curl.index("-d") + 1])
    assert body == {"model": IMAGE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert body["model"] in MODELS  # a model the demo's release serves


def test_what_explore_points_at_exists_in_the_repository() -> None:
    assert json.loads((REPO / "deploy" / "grafana" / "gpulane-dashboard.json").read_text())
    crd = yaml.safe_load((REPO / "crds" / "gpulane.io_gpujobs.yaml").read_text())
    assert "gj" in crd["spec"]["names"]["shortNames"]
    assert any(line.startswith("cluster-down:") for line in (REPO / "hack" / "cluster.mk").read_text().splitlines())
