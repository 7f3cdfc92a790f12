"""The README's tour: examples/ applied with kubectl, on the cluster's own real node gpu-0, where each
model's backend pod really runs its server."""

from __future__ import annotations

import json
import urllib.request

import pytest
from kubernetes import client

from .operator_support import OperatorProcess, World
from .support import REPO, Cluster

pytestmark = pytest.mark.e2e

EXAMPLES = REPO / "examples"


def test_the_image_overtakes_the_films_queued_shots(
    cluster: Cluster, api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    world = World(cluster, api_client, "default")
    try:
        for name in ("00-lane.yaml", "01-models.yaml", "02-film.yaml"):
            cluster.kubectl("apply", "-f", str(EXAMPLES / name))
        running = world.wait_phase("film-shot-1", "Running")
        with urllib.request.urlopen(f"{running['endpoint']}/v1/models", timeout=5) as resp:
            assert [m["id"] for m in json.loads(resp.read())["data"]] == ["h3-video"], "the pod's own server"
        cluster.kubectl("apply", "-f", str(EXAMPLES / "03-image.yaml"))
        world.wait_phase("bobs-image", "Pending")
        assert world.status("bobs-image")["position"] == 1
        order = world.run_through({"bobs-image", *(f"film-shot-{i}" for i in range(1, 6))})
        assert order == ["film-shot-1", "bobs-image", "film-shot-2", "film-shot-3", "film-shot-4", "film-shot-5"]
    finally:
        cluster.kubectl("delete", "-f", str(EXAMPLES), "--ignore-not-found", "--wait=true", "--timeout=60s")
