"""The web page (``gpulane ui``, docs/ui.md) in a real browser: Debian's Chromium driven by Playwright, against the
real apiserver and operator. A ServiceAccount of the test's namespace logs in with a token for the page's audience;
another namespace's jobs run beside it.

Screenshots of each view go to $GPULANE_SCREENSHOTS when it is set (``make screenshots`` sets docs/img)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from .browser import RECORD_SHOWN, chromium, log_in, shown_at
from .operator_support import API, GROUP, OperatorProcess, UiProcess, World, phase_watch
from .support import Cluster, wait_until

pytestmark = pytest.mark.e2e("kwok")

KEYS = "keys:\n- {name: film-app, key: sk-e2e-film-app, member: film-app}\n"
HIDDEN = "(a job of another namespace)"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def ui(cluster: Cluster, world: World, tmp_path: Path) -> Iterator[UiProcess]:
    keys = tmp_path / "keys.yaml"
    keys.write_text(KEYS)
    process = UiProcess(cluster, tmp_path, world.namespace, keys).start()
    yield process
    process.stop()


@pytest.fixture
def other(cluster: Cluster, world: World, api_client: client.ApiClient, core_v1: client.CoreV1Api) -> Iterator[World]:
    """A second team's namespace, whose jobs the viewer may not read."""
    name = f"{world.namespace[:50]}-other"
    core_v1.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"gpulane.dev/e2e": "true"}))
    )
    theirs = World(cluster, api_client, name)
    yield theirs
    theirs.strip_finalizers()
    core_v1.delete_namespace(name, propagation_policy="Background")


def viewer_token(cluster: Cluster, namespace: str) -> str:
    """A ServiceAccount that may read its own namespace's GpuJobs, and a token of it for the page."""
    rbac = f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: viewer, namespace: {namespace}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: gpujob-reader, namespace: {namespace}}}
rules: [{{apiGroups: [{GROUP}], resources: [gpujobs, gpuchains], verbs: [get, list, watch]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: viewer-reads, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: gpujob-reader}}
subjects: [{{kind: ServiceAccount, name: viewer, namespace: {namespace}}}]
"""
    cluster.kubectl("apply", "-f", "-", input=rbac)
    made = cluster.kubectl("create", "token", "viewer", "-n", namespace, "--audience", "gpulane-ui")
    return made.stdout.strip()


def shot(page: Any, name: str) -> None:
    """A screenshot for the docs, when the run is asked for them."""
    if where := os.environ.get("GPULANE_SCREENSHOTS"):
        page.screenshot(path=str(Path(where) / f"ui-{name}.png"), full_page=True)


def test_the_page_shows_a_dispatch_within_a_second_and_the_jobs_story(
    cluster: Cluster, world: World, operator: OperatorProcess, ui: UiProcess, browser: Any, other: World
) -> None:
    lane = world.lane()
    model = world.model("chat", ready_delay="0s")
    world.job("first", model, member="alice")
    world.wait_phase("first", "Running")
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    log_in(page, ui.url, viewer_token(cluster, world.namespace))
    page.wait_for_selector(f"[data-lane='{lane}'] .running-job a:text('{world.namespace}/first')")
    # The browser notes when the next job's name first shows among the lane's running jobs: both clocks are
    # this machine's, so its time minus the time our watch saw the operator's write is the page's delay.
    page.evaluate(RECORD_SHOWN)
    world.job("second", model, member="bob")
    world.wait_phase("second", "Pending")
    with phase_watch(world) as seen:
        world.complete("first")
        written = wait_until(lambda: next((time.time() for n, p in list(seen) if n == "second" and p == "Running"),
                                          None), what="the watch to see second Running", interval=0.005)  # fmt: skip
    shown = wait_until(lambda: shown_at(page, f"{world.namespace}/second"), what="the page to show the dispatch")
    assert shown - written < 1.0, f"the page showed the dispatch {shown - written:.2f}s after its write"

    # A queue behind it, and another namespace's job: load on the page, never its name.
    world.job("render-poster", model, member="carol", priority="batch")
    world.job("summarise-notes", model, member="alice", tier="pro")
    world.job("answer-ticket", model, member="dave", priority="interactive")
    other.job("their-secret-job", model, member="mallory")
    world.wait_phase("render-poster", "Pending")
    page.goto(f"{ui.url}/#queue")
    page.wait_for_selector("#queue-table .hidden-job")
    shot(page, "queue")
    for view in ("lanes", "queue", "chains", "usage"):
        page.goto(f"{ui.url}/#{view}")
        page.wait_for_selector("#live.on")
        page.wait_for_selector("#view[data-updated]")
        html = page.content()
        assert "their-secret-job" not in html and other.namespace not in html and "mallory" not in html, view
        if view == "usage":
            shot(page, "usage")
    page.goto(f"{ui.url}/#lanes")
    page.wait_for_selector(f"[data-lane='{lane}'] svg rect[data-kind='run']")
    shot(page, "lanes")
    # A member named like markup is text on the page, never an element.
    world.job("odd-member", model, member="<img src=x onerror=alert(1)>eve")
    page.goto(f"{ui.url}/#queue")
    page.wait_for_selector("#queue-table td:text-is('<img src=x onerror=alert(1)>eve')")
    assert page.locator("#queue-table img").count() == 0

    # The story of the second job: it waited for the first.
    page.goto(f"{ui.url}/#job/{world.namespace}/second")
    story = page.wait_for_selector("#story").inner_text()
    assert f"{world.namespace}/second ({model}" in story and "was queued at" in story
    assert "It was dispatched at" in story
    shot(page, "job")
    page.goto(f"{ui.url}/#job/{other.namespace}/their-secret-job")
    assert "that you may see" in page.wait_for_selector("#view .error").inner_text()
    page.close()


def test_a_chains_progress_moves_on_the_page(
    cluster: Cluster, world: World, operator: OperatorProcess, ui: UiProcess, browser: Any
) -> None:
    world.lane()
    model = world.model("render", ready_delay="0s", expectedRunSeconds=60)
    world.apply({"apiVersion": API, "kind": "GpuChain", "metadata": {"name": "film", "namespace": world.namespace},
                 "spec": {"model": model, "priority": "batch", "count": 3}})  # fmt: skip
    page = browser.new_page(viewport={"width": 1280, "height": 500})
    log_in(page, ui.url, "sk-e2e-film-app", view="chains")  # the bridge's key: the chain's member is the namespace's
    page.goto(f"{ui.url}/#chains")
    # A key sees its own member's chains only: this one is the namespace's, so it is not listed.
    page.wait_for_selector("text=No GpuChain that you may see.")
    page.click("#logout")
    log_in(page, ui.url, viewer_token(cluster, world.namespace), view="chains")
    row = f"[data-chain='{world.namespace}/film'] .progress-text"
    page.wait_for_selector(f"{row}:text('0/3')")
    world.wait_phase("film-0", "Running")
    world.complete("film-0")
    page.wait_for_selector(f"{row}:text('1/3')")
    world.wait_phase("film-1", "Running")
    shot(page, "chains")
    page.close()


def test_a_bad_token_gets_the_login_not_data(world: World, ui: UiProcess, browser: Any) -> None:
    world.lane()
    page = browser.new_page()
    page.goto(f"{ui.url}/#queue")
    page.wait_for_selector("#login:not([hidden])")
    page.fill("#secret", "not-a-key-nor-a-token")
    page.click("#login-form button")
    error = page.wait_for_selector("#login-error:text('neither a bridge API key')")
    assert error.is_visible()
    assert page.inner_text("#view") == "" and not page.is_visible("#queue-table")
    shot(page, "login")
    page.close()
