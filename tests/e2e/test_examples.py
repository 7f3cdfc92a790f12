"""The README's tour: examples/ applied with kubectl, on the cluster's own real node gpu-0, where each
model's backend pod really runs its server, and `gpulane bridge --execute-namespace default` executes every
job's request, as the tour says: nothing here completes a job by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpulane.api.times import parse_time

from .operator_support import BridgeProcess, OperatorProcess, World
from .support import REPO, Cluster, wait_until

pytestmark = pytest.mark.e2e("gpu-0")

EXAMPLES = REPO / "examples"
SHOTS = [f"film-shot-{i}" for i in range(1, 6)]


def test_the_image_overtakes_the_films_queued_shots(
    cluster: Cluster, api_client: client.ApiClient, operator: OperatorProcess, tmp_path: Path
) -> None:
    world = World(cluster, api_client, "default")
    keys = tmp_path / "keys.yaml"  # the bridge's own calls are not used here; it needs a keys file all the same
    keys.write_text(yaml.safe_dump({"keys": [{"name": "tour", "key": "sk-tour-0123456789", "member": "tour"}]}))
    bridge = BridgeProcess(cluster, tmp_path, "default", keys).launch()
    try:
        bridge.wait_ready()
        for name in ("00-lane.yaml", "01-models.yaml", "02-film.yaml"):
            cluster.kubectl("apply", "-f", str(EXAMPLES / name))
        # The film's model loads for 3 s: the image arrives meanwhile and goes ahead of the other shots.
        world.wait_phase("film-shot-1", "Dispatching")
        cluster.kubectl("apply", "-f", str(EXAMPLES / "03-image.yaml"))
        wait_until(lambda: world.status("bobs-image").get("position") == 1, what="the image first in the queue")
        done = {n: world.wait_phase(n, "Succeeded", "Failed", timeout=90) for n in ["bobs-image", *SHOTS]}
        assert all(s["phase"] == "Succeeded" for s in done.values()), done
        order = sorted(done, key=lambda n: parse_time(done[n]["dispatchedAt"]) or 0)
        assert order == ["film-shot-1", "bobs-image", *SHOTS[1:]]
        # Each answer is the job's own, from its model's server on gpu-0, stored beside the job.
        for name, status in done.items():
            stored = world.core.read_namespaced_config_map(status["result"]["configMap"], "default")
            answer = json.loads(stored.data["response.json"])
            if name == "bobs-image":
                assert answer["data"][0]["revised_prompt"] == "drawn by sdxl", answer
            else:
                assert answer["model"] == "h3-video", (name, answer)
        shot = json.loads(world.core.read_namespaced_config_map(done["film-shot-3"]["result"]["configMap"],
                                                                "default").data["response.json"])  # fmt: skip
        assert "render shot 3" in shot["choices"][0]["message"]["content"]
        assert {world.status(n)["lane"] for n in done} == {"gpu-0"}
    finally:
        bridge.stop()
        cluster.kubectl("delete", "-f", str(EXAMPLES), "--ignore-not-found", "--wait=true", "--timeout=60s")
