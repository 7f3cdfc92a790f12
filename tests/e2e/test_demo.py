"""`make demo`, shortened (``Plan.short``): the chart on the real node gpu-0 with the demo's values, a film
applied with kubectl and image calls through the bridge's Service with the real `openai` client. The
summary's figures are checked against the API, and the dispatches against priority order."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from localdemo import release
from localdemo.plan import FREE, STUDIO, Plan
from localdemo.play import Player
from localdemo.summary import summarize
from localdemo.view import LiveView

from gpulane.api.contract import FINALIZER
from gpulane.api.resources import GpuPolicySpec
from gpulane.api.times import parse_time

from .support import Cluster
from .test_chart import page_view

pytestmark = pytest.mark.e2e("gpu-0")


def band(job: dict[str, Any]) -> int:
    return round(int(job["status"]["score"]["priority"]) / 100)


def when(job: dict[str, Any], field: str) -> float:
    return parse_time(job["status"].get(field)) or 0.0


def test_the_demo_plays_a_film_against_interactive_calls_on_gpu_0(
    cluster: Cluster, tmp_path: Path, no_operator: None
) -> None:
    if not cluster.info.real_node:
        raise AssertionError("the demo needs the real node gpu-0; the cluster runs with GPULANE_NODE=kwok")
    tools = release.Tools(cluster.info.bindir, cluster.kubeconfig)
    cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")  # another test's
    plan = Plan.short()
    shown = io.StringIO()
    try:
        release.install(tools, tmp_path, "gpulane-admin")
        player = Player(tools, plan, release.bridge_url(tools), LiveView(shown))
        jobs = player.play(timeout=300)
        by_name = {j["metadata"]["name"]: j for j in jobs}

        # Every job ran and succeeded on gpu-0, the backend pod really on the real node.
        assert len(jobs) == plan.shots + len(plan.previews) + len(plan.calls), sorted(by_name)
        assert {j["status"]["phase"] for j in jobs} == {"Succeeded"}, {n: j["status"] for n, j in by_name.items()}
        assert {j["status"]["lane"] for j in jobs} == {release.LANE}
        backends = f"{release.NAMESPACE}-backends"  # the chart's namespace for backend pods
        pods = tools.get("pods", "-n", backends, "-l", "app.kubernetes.io/component=backend")["items"]
        assert pods and {p["spec"]["nodeName"] for p in pods} == {release.LANE}
        # The web page the demo ends by pointing at: the studio's key logs in, and it shows the lane.
        page = page_view(release.ui_url(tools).rstrip("/"), STUDIO.key, release.LANE)
        assert page["viewer"] == f"key {STUDIO.name}"

        # The bridge capped the free key's interactive call to its 0, and said so; the studio's was not.
        answers = {a.call.key.name: a for a in player.answers}
        assert all(a.error is None for a in player.answers), [a.error for a in player.answers]
        assert answers[FREE.name].capped == f"100 -> 0 (key {FREE.name})"
        assert answers[STUDIO.name].capped is None
        capped_job = by_name[answers[FREE.name].job or ""]
        assert capped_job["spec"]["priority"] == 0 and capped_job["spec"]["member"] == FREE.member

        # Priority order: no dispatch went to a job of a lower band than one already waiting (a second
        # of slack for a job the operator's watch had not delivered yet).
        policy = GpuPolicySpec.model_validate(tools.get("gpupolicy", "default")["spec"])
        summary = summarize(jobs, player.lane(), player.models(), policy)
        assert [r["job"].split("/")[-1] for r in summary.dispatches] == sorted(
            by_name, key=lambda n: when(by_name[n], "dispatchedAt")
        )
        for record in summary.dispatches:
            at = parse_time(record["at"]) or 0
            winner = by_name[record["job"].split("/")[-1]]
            waiting = [j for j in jobs if when(j, "submittedAt") < at - 1 < at < when(j, "dispatchedAt")]
            assert all(band(j) <= band(winner) for j in waiting), (winner["metadata"]["name"], record)

        # The summary's figures are the API's: waits from submittedAt to startedAt, swaps from the lane.
        def wait(name: str) -> float:
            return when(by_name[name], "startedAt") - when(by_name[name], "submittedAt")

        assert sorted(summary.live.waits["interactive"]) == sorted([wait(answers[STUDIO.name].job or ""),
                                                                    wait("preview-01")])  # fmt: skip
        assert summary.live.waits["normal"] == [wait(capped_job["metadata"]["name"])]
        assert sorted(summary.live.waits["batch"]) == sorted(wait(f"shot-{i:02d}") for i in range(1, plan.shots + 1))
        loads = [r for r in summary.dispatches if r["load"]]  # the operator's own record; the first one is cold
        assert summary.live.swaps == len(loads) - 1 >= 2
        # The bridge records the ask, as the webhook does.
        assert summary.capped == [f"{capped_job['metadata']['name']} ({FREE.member}: 100 -> 0)"]
        # Alice's preview (interactive, tier free) waited beside carol's image (tier pro): it won because its
        # model was the one loaded, and the lane's record says swap affinity decided.
        assert summary.changed_by["affinity"] >= 1, summary.dispatches
        # FIFO makes the interactive call wait behind the shots queued before it; gpulane does not.
        assert max(summary.simulated["fifo"].waits["interactive"]) > max(summary.live.waits["interactive"])
        assert set(summary.simulated) == {"gpulane", "fifo", "strict"}
        text = summary.render()
        assert "wait p50 / max" in text and "fifo (simulated)" in text and "model swaps" in text

        # The live view (not a terminal here: plain lines) told each job's start.
        assert all(f"Running     {name} (" in shown.getvalue() for name in by_name), shown.getvalue()

        # `helm test`: the chart's test pod lists the models through the bridge and runs one completion.
        tested = cluster.helm("test", release.RELEASE, "-n", release.NAMESPACE, "--logs", "--timeout", "180s")
        assert "the bridge lists ['h3-video', 'sdxl']" in tested.stdout, tested.stdout
        assert "h3-video answered:" in tested.stdout, tested.stdout
    finally:
        release.remove(tools)
        cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")


def test_removing_a_demo_stopped_mid_play_leaves_nothing_behind(cluster: Cluster, no_operator: None) -> None:
    """A demo stopped mid-play (Ctrl-C, a killed test run) leaves jobs with the operator's finalizer, and its
    operator goes with the release: `remove` takes the finalizer off, so the namespace does not hang."""
    tools = release.Tools(cluster.info.bindir, cluster.kubeconfig)
    cluster.kubectl("create", "namespace", release.NAMESPACE)
    job = {"apiVersion": "gpulane.io/v1alpha1", "kind": "GpuJob",
           "metadata": {"name": "shot-01", "namespace": release.NAMESPACE, "finalizers": [FINALIZER]},
           "spec": {"model": "h3-video", "priority": "batch"}}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    release.remove(tools)
    left = cluster.kubectl("get", "namespace", release.NAMESPACE, "--ignore-not-found", "-o", "name").stdout
    assert left == "", left
