"""The operator on the real local control plane: dispatch order, pod reuse and swaps, lanes, the job
lifecycle and its failure modes, restarts. The tests act as the executor: they complete a Running
job by writing its outcome to the status, as the bridge will."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from .operator_support import OperatorProcess, World, first_write, phase_watch, pod_watch
from .support import REPO, wait_until

pytestmark = pytest.mark.e2e("kwok")


def test_dispatch_order_follows_the_scores(world: World, operator: OperatorProcess) -> None:
    lane = world.lane()
    sdxl, flux = world.model("sdxl"), world.model("flux")
    world.job("blocker", sdxl, member="zed")
    world.wait_phase("blocker", "Running")
    # Members all differ, so fair share plays no part; aging is a fraction of a point.
    burst = [
        world.job_doc("film-free", sdxl, priority="batch", member="a"),
        world.job_doc("film-max", sdxl, priority="batch", tier="max", member="b"),
        world.job_doc("chat", flux, priority=0, member="c"),
        world.job_doc("image", flux, priority="interactive", member="d"),
        world.job_doc("image-pro", sdxl, priority="interactive", tier="pro", member="e"),
    ]
    world.apply(*burst)
    for doc in burst:
        world.wait_phase(doc["metadata"]["name"], "Pending")
    queued = world.status("image-pro")
    assert queued["position"] == 1 and queued["positionExact"] is True and "estimatedStart" in queued
    # The apiserver names each write's author after its user agent: the operator's, not the client library's.
    writers = {(m["manager"], m.get("subresource")) for m in world.get("image-pro")["metadata"]["managedFields"]}
    assert ("gpulane-operator", "status") in writers, writers
    assert queued["score"] == {
        "priority": 100,
        "tier": 1,
        "affinity": 10,
        "aging": queued["score"]["aging"],
        "total": queued["score"]["total"],
    }
    order = world.run_through({"blocker", *(d["metadata"]["name"] for d in burst)})
    # image-pro: 100 + 1 + affinity 10; image: 100 (swap to flux); chat: 0 + affinity; then the batch
    # band, tier first: film-max -98 (swap back to sdxl), film-free -100 + affinity.
    assert order == ["blocker", "image-pro", "image", "chat", "film-max", "film-free"]
    won = world.wait_events("image", "Dispatched")
    assert won and "swapping" in won[0].message and "priority 100" in won[0].message
    finished = world.status("chat")
    assert finished["phase"] == "Succeeded" and finished["lane"] == lane and finished["waited"]
    assert not world.get("chat")["metadata"].get("finalizers"), "the finalizer is removed once the job ended"


def test_reuse_keeps_the_pod_and_a_swap_never_overlaps_two_pods(world: World, operator: OperatorProcess) -> None:
    lane = world.lane()
    sdxl, flux = world.model("sdxl", ready_delay="2s"), world.model("flux", ready_delay="2s")
    with pod_watch(world.core, lane) as seen, phase_watch(world) as writes:
        world.job("a1", sdxl)
        first = world.wait_phase("a1", "Running")
        uid = world.backend_pods(lane)[0].metadata.uid
        world.job("a2", sdxl)
        world.job("b1", flux)
        world.complete("a1")
        second = world.wait_phase("a2", "Running")
        assert world.backend_pods(lane)[0].metadata.uid == uid, "the warm pod is reused, not restarted"
        assert second["pod"] == first["pod"] and second["endpoint"] == first["endpoint"]
        # Written once a2 had left the queue for the lane: the operator saw b1 with a2 running, and kept it.
        wait_until(lambda: world.status("b1").get("position") == 1, what="b1 at the head of the queue")
        world.complete("a2")
        world.wait_phase("b1", "Dispatching")
        world.wait_phase("b1", "Running")
        swapped = first_write(writes, "b1", "Dispatching", "Running")
        assert swapped > first_write(writes, "a2", "Succeeded"), f"the swap did not wait for a2 to end: {writes}"
        [pod] = world.backend_pods(lane)
        assert pod.metadata.uid != uid and pod.metadata.annotations["gpulane.io/model"] == flux
    lane_status = wait_until(
        lambda: (s := world.cluster_status("gpulanes", lane)).get("residentModel") == flux and s.get("ready") and s,
        what="the lane's status to show flux Ready",
    )
    assert lane_status["pod"] == pod.metadata.name and lane_status["running"] == [f"{world.namespace}/b1"]
    assert [c["reason"] for c in lane_status["conditions"] if c["type"] == "Ready"] == ["BackendReady"]
    learned = wait_until(lambda: world.cluster_status("gpumodels", sdxl).get("loads"), what="sdxl's learned loads")
    assert learned >= 1 and world.cluster_status("gpumodels", sdxl)["loadSeconds"] > 0
    live: set[str] = set()  # the pods of this lane that exist, event by event
    most = 0
    for kind, _name, pod_uid in seen:
        if kind == "DELETED":
            live.discard(pod_uid)
        else:
            live.add(pod_uid)
        most = max(most, len(live))
    assert most == 1, f"two backend pods existed at once: {seen}"


def test_a_job_lands_on_the_lane_where_its_model_is_warm(world: World, operator: OperatorProcess) -> None:
    left, right = world.lane("left"), world.lane("right")
    sdxl, flux = world.model("sdxl"), world.model("flux")
    world.job("warm-sdxl", sdxl)
    world.job("warm-flux", flux)
    world.run_through({"warm-sdxl", "warm-flux"})
    lanes = {world.status("warm-sdxl")["lane"], world.status("warm-flux")["lane"]}
    assert lanes == {left, right}
    flux_lane = world.status("warm-flux")["lane"]
    for i in range(3):
        world.job(f"flux-{i}", flux)
        assert world.wait_phase(f"flux-{i}", "Running")["lane"] == flux_lane
        world.complete(f"flux-{i}")


def test_cancelling_a_queued_and_a_running_job(world: World, operator: OperatorProcess) -> None:
    world.lane()
    sdxl = world.model("sdxl")
    world.job("running", sdxl)
    world.wait_phase("running", "Running")
    world.job("queued", sdxl)
    world.job("next", sdxl)
    world.wait_phase("queued", "Pending")
    world.cluster.kubectl("delete", "gpujob", "queued", "-n", world.namespace, "--wait=true", "--timeout=30s")
    world.cluster.kubectl("delete", "gpujob", "running", "-n", world.namespace, "--wait=true", "--timeout=30s")
    # The lane was freed by the cancellation and the queued job is gone: `next` runs.
    assert world.wait_phase("next", "Running")
    assert world.wait_events("running", "Deleted")


def test_a_backend_that_never_becomes_ready_fails_the_job_and_the_lane_recovers(
    world: World, operator: OperatorProcess
) -> None:
    lane = world.lane()
    stuck = world.model("stuck", ready_delay="1h", loadTimeoutSeconds=3)
    good = world.model("good")
    world.job("doomed", stuck)
    world.job("after", good)
    failed = world.wait_phase("doomed", "Failed", timeout=30)
    assert failed["reason"] == "ModelLoadTimeout" and "not Ready within 3s" in failed["message"]
    assert world.wait_phase("after", "Running", timeout=30)["lane"] == lane
    assert all(e.type == "Warning" for e in world.wait_events("doomed", "ModelLoadTimeout"))


def test_a_job_past_its_deadline_fails_and_frees_the_lane(world: World, operator: OperatorProcess) -> None:
    world.lane()
    sdxl = world.model("sdxl")
    world.job("slow", sdxl, maxRunSeconds=2)
    world.job("next", sdxl)
    world.wait_phase("slow", "Running")
    failed = world.wait_phase("slow", "Failed", timeout=20)
    assert failed["reason"] == "DeadlineExceeded"
    world.wait_phase("next", "Running")
    # The executor's late report does not overwrite the outcome: its test on phase Running fails.
    late = world.cluster.kubectl(
        "patch",
        "gpujob",
        "slow",
        "-n",
        world.namespace,
        "--subresource=status",
        "--type=json",
        "-p",
        '[{"op":"test","path":"/status/phase","value":"Running"},{"op":"replace","path":"/status/phase","value":"Succeeded"}]',
        check=False,
    )
    assert late.returncode != 0 and world.status("slow")["phase"] == "Failed"


def test_a_deleted_backend_pod_fails_its_running_job_and_the_lane_reloads(
    world: World, operator: OperatorProcess
) -> None:
    lane = world.lane()
    sdxl = world.model("sdxl")
    world.job("victim", sdxl)
    world.wait_phase("victim", "Running")
    [pod] = world.backend_pods(lane)
    world.core.delete_namespaced_pod(pod.metadata.name, "gpulane-system", grace_period_seconds=0)
    lost = world.wait_phase("victim", "Failed", timeout=30)
    assert lost["reason"] == "BackendLost"
    world.job("survivor", sdxl)
    assert world.wait_phase("survivor", "Running", timeout=30)["pod"] == pod.metadata.name


def test_a_pod_deleted_while_loading_puts_its_job_back_once_then_fails_it(
    world: World, operator: OperatorProcess
) -> None:
    lane = world.lane()
    slow = world.model("slow", ready_delay="1h")
    world.job("patient", slow)
    world.wait_phase("patient", "Dispatching")
    [first] = wait_until(lambda: world.backend_pods(lane), what="the first pod")
    world.core.delete_namespaced_pod(first.metadata.name, "gpulane-system", grace_period_seconds=0)
    [event] = world.wait_events("patient", "LoadLost")
    assert "waits again" in event.message
    [second] = wait_until(
        lambda: [p for p in world.backend_pods(lane) if p.metadata.uid != first.metadata.uid],
        what="a new pod loading the model again",
    )
    assert world.status("patient")["phase"] in ("Pending", "Dispatching")
    world.core.delete_namespaced_pod(second.metadata.name, "gpulane-system", grace_period_seconds=0)
    lost = world.wait_phase("patient", "Failed", timeout=30)
    assert lost["reason"] == "BackendLost", lost


def test_operator_killed_and_restarted_loses_nothing_and_keeps_the_order(
    world: World, operator: OperatorProcess
) -> None:
    world.lane()
    sdxl, flux = world.model("sdxl"), world.model("flux")
    shots = [world.job_doc(f"shot-{i}", sdxl, priority="batch", member="film") for i in range(4)]
    world.apply(*shots)
    world.wait_phase("shot-0", "Running")
    for doc in shots[1:]:
        world.wait_phase(doc["metadata"]["name"], "Pending")
    operator.kill()
    # While the operator is down: an image arrives and the running shot completes.
    world.job("image", flux, priority="interactive", member="someone")
    world.complete("shot-0")
    time.sleep(1)
    operator.start()
    order = world.run_through({"image", "shot-1", "shot-2", "shot-3"})
    assert order[0] == "image", order
    assert order[1:] == ["shot-1", "shot-2", "shot-3"]
    for name in ["shot-0", *order]:
        assert world.status(name)["phase"] == "Succeeded"
        dispatches = world.wait_events(name, "Dispatched")
        assert len(dispatches) == 1, f"{name} was dispatched {len(dispatches)} times"


def test_lanes_and_models_deleted_and_applied_again_lose_no_waiting_job(
    world: World, operator: OperatorProcess
) -> None:
    """docs/operations.md, "What to back up": the GpuLane and GpuModel specs are the user's to keep; applied
    again after a loss, every job still waiting runs, in its order. The running one fails LaneRemoved."""
    lane, model = world.lane(), world.model("restore")
    kept = [
        {
            "apiVersion": d["apiVersion"],
            "kind": d["kind"],
            "metadata": {"name": d["metadata"]["name"]},
            "spec": d["spec"],
        }
        for d in json.loads(
            world.cluster.kubectl(
                "get", f"gpulanes.gpulane.io/{lane}", f"gpumodels.gpulane.io/{model}", "-o", "json"
            ).stdout
        )["items"]
    ]
    world.job("running", model)
    world.wait_phase("running", "Running")
    for name in ("second", "third"):
        world.job(name, model)
    wait_until(lambda: world.status("third").get("position") == 2, what="both queued")
    world.cluster.kubectl("delete", f"gpulanes.gpulane.io/{lane}", f"gpumodels.gpulane.io/{model}", "--wait=true")
    failed = world.wait_phase("running", "Failed")
    assert failed["reason"] == "LaneRemoved", failed
    wait_until(lambda: world.status("third").get("reason") == "ModelNotFound", what="the waiting jobs parked")
    world.apply(*kept)
    assert world.run_through({"second", "third"}) == ["second", "third"]


def test_operator_restart_adopts_the_running_job(world: World, operator: OperatorProcess) -> None:
    lane = world.lane()
    sdxl = world.model("sdxl")
    with phase_watch(world) as writes:
        world.job("long", sdxl)
        running = world.wait_phase("long", "Running")
        world.job("waiting", sdxl)
        world.wait_phase("waiting", "Pending")
        operator.kill()
        # Erased while it is down, so that what is waited for below is the restarted operator's own writes.
        world.erase_status("waiting", "position")
        world.erase_status(lane, "running", plural="gpulanes")
        operator.start()
        wait_until(
            lambda: world.cluster_status("gpulanes", lane).get("running") == [f"{world.namespace}/long"],
            what="the restarted operator to show long on its lane",
        )
        wait_until(lambda: world.status("waiting").get("position") == 1, what="the restarted operator to queue waiting")
        assert world.status("long")["pod"] == running["pod"]
        [pod] = world.backend_pods(lane)
        world.complete("long")
        assert world.wait_phase("waiting", "Running")["pod"] == pod.metadata.name
        started = first_write(writes, "waiting", "Dispatching", "Running")
        assert started > first_write(writes, "long", "Succeeded"), f"the adopted job did not hold the lane: {writes}"
    assert world.backend_pods(lane)[0].metadata.uid == pod.metadata.uid


def test_metrics_and_health(world: World, operator: OperatorProcess) -> None:
    dispatches, writes = 'gpulane_dispatches_total{band="100"}', 'gpulane_api_writes_total{kind="job-status"}'
    before = operator.metrics()  # the session's operator: earlier tests' counts are in it
    world.lane()
    sdxl = world.model("sdxl")
    world.job("one", sdxl, priority="interactive")
    world.wait_phase("one", "Running")
    assert operator.get("/healthz")[0] == 200 and operator.get("/readyz")[0] == 200
    samples = wait_until(
        lambda: (m := operator.metrics()).get(dispatches, 0) > before.get(dispatches, 0) and m,
        what="this test's dispatch counted in /metrics",
    )
    assert samples[writes] > before.get(writes, 0)
    assert any(k.startswith("gpulane_wait_seconds_bucket{band=") for k in samples)
    # The loop's lag probe has been waking up since the operator started (twenty times a second).
    assert samples["gpulane_event_loop_lag_seconds_count"] > before.get("gpulane_event_loop_lag_seconds_count", 0)
    # Python's collections are timed (young ones come all the time), and the freezes counted, not walked.
    assert samples['gpulane_gc_pause_seconds_count{generation="0"}'] > 0
    assert "gpulane_gc_freezes_total" in samples and "gpulane_gc_frozen_objects" not in samples


def test_a_model_serving_two_jobs_at_once_runs_two_on_one_pod(world: World, operator: OperatorProcess) -> None:
    lane = world.lane()
    llm = world.model("llm", maxConcurrency=1)
    with phase_watch(world) as writes:
        world.job("first", llm)
        world.wait_phase("first", "Running")
        # A live edit: the model now declares two parallel slots.
        world.apply(
            {
                "apiVersion": "gpulane.io/v1alpha1",
                "kind": "GpuModel",
                "metadata": {"name": llm},
                "spec": {
                    "image": "example.invalid/llm:1",
                    "maxConcurrency": 2,
                    "podAnnotations": {"gpulane.dev/kwok-ready-delay": "1s"},
                },
            }
        )
        world.job("second", llm)
        world.job("third", llm)
        second = world.wait_phase("second", "Running")
        assert second["pod"] == world.status("first")["pod"]
        # Written once second had left the queue: the operator saw third with both slots taken, and kept it.
        wait_until(lambda: world.status("third").get("position") == 1, what="third at the head of the queue")
        world.complete("first")
        assert world.wait_phase("third", "Running")["lane"] == lane
        started = first_write(writes, "third", "Dispatching", "Running")
        assert started > first_write(writes, "first", "Succeeded"), f"more jobs ran than the model allows: {writes}"
    assert len(world.backend_pods(lane)) == 1


def test_every_metric_of_the_grafana_dashboard_is_exported(world: World, operator: OperatorProcess) -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana" / "gpulane-dashboard.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"gpulane_[a-z_]+", target["expr"])
    }
    assert len(used) >= 10
    # The chart's alerts (metrics.prometheusRule) too.
    rules = (REPO / "charts" / "gpulane" / "templates" / "observability.yaml").read_text()
    used |= set(re.findall(r"gpulane_[a-z_]+", rules.split("kind: PrometheusRule", 1)[1]))

    # A dispatch and a load, so that every histogram and labelled counter has a sample.
    def loads() -> float:
        return sum(v for k, v in operator.metrics().items() if k.startswith("gpulane_model_load_seconds_count"))

    before = loads()
    world.lane()
    world.job("one", world.model("sdxl"), priority="interactive")
    world.wait_phase("one", "Running")
    world.complete("one")
    wait_until(lambda: loads() > before, what="this test's load counted in /metrics")
    # Declared families count: a labelled counter has no sample until its first label value.
    family = re.compile(r"_(total|bucket|sum|count)$")
    typed = re.findall(r"^# TYPE (gpulane_[a-z_]+) ", operator.get("/metrics")[1], re.MULTILINE)
    declared = {family.sub("", n) for n in typed}
    names = {family.sub("", n) for n in used}
    missing = sorted(n for n in names if n not in declared)
    assert not missing, f"the dashboard queries metrics the operator does not export: {missing}"


def _set_ready(world: World, node: str, ready: bool) -> None:
    """Play a kubelet that stops (or resumes) posting Ready: kwok no longer manages the node, so only this
    status stands."""
    world.core.patch_node(node, {"metadata": {"annotations": {"kwok.x-k8s.io/node": None}}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletNotReady",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    world.core.patch_node_status(node, {"status": {"conditions": [condition]}})


def _lane_ready(world: World, lane: str) -> dict[str, Any]:
    conditions = world.cluster_status("gpulanes", lane).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Ready"), {})


def test_a_lane_whose_node_is_not_ready_waits_for_it(world: World, operator: OperatorProcess) -> None:
    node = world.node("flaky")
    lane = world.lane("flaky", node=node)
    model = world.model("m")
    world.job("before", model)
    world.wait_phase("before", "Running")
    world.complete("before")
    _set_ready(world, node, False)
    wait_until(lambda: _lane_ready(world, lane).get("reason") == "NodeUnavailable", what="the lane offline")
    assert f"node {node} is not Ready (KubeletNotReady)" in _lane_ready(world, lane)["message"]
    world.job("during", model)
    # The queue writer writes a job Pending only once the dispatcher has taken it in and kept it queued;
    # no estimate means it found no lane online to run it.
    queued = world.wait_phase("during", "Pending")
    assert queued["position"] == 1 and "estimatedStart" not in queued, f"no lane should be online: {queued}"
    _set_ready(world, node, True)
    assert world.wait_phase("during", "Running")["lane"] == lane


def test_a_deleted_model_gives_its_lane_back_once_its_running_job_ends(world: World, operator: OperatorProcess) -> None:
    """Issue 34: a deleted GpuModel's pod served on, with whatever rights its template gave it. Deleted while a
    job of it runs, the pod serves that job to its end (it succeeds), then goes; deleted while idle, it goes at
    once. The lane says why, in an Event."""
    lane = world.lane()

    def stopped(model: str) -> list[str]:
        wait_until(lambda: not world.backend_pods(lane), what=f"{model}'s pod stopped")
        selector = f"involvedObject.kind=GpuLane,involvedObject.name={lane},reason=ModelDeleted"
        events = world.core.list_namespaced_event("default", field_selector=selector).items  # a cluster-scoped object's
        return [e.message for e in events if f"GpuModel {model!r} was deleted" in e.message]

    busy = world.model("busy")
    world.job("running", busy)
    world.wait_phase("running", "Running")
    world.cluster.kubectl("delete", f"gpumodels.gpulane.io/{busy}", "--wait=true")
    world.complete("running")
    assert world.wait_phase("running", "Succeeded", "Failed")["phase"] == "Succeeded"  # its pod outlived it
    assert wait_until(lambda: stopped(busy), what="the lane's ModelDeleted Event")

    idle = world.model("idle")
    world.job("done", idle)
    world.wait_phase("done", "Running")
    world.complete("done")
    world.wait_phase("done", "Succeeded")
    [pod] = world.backend_pods(lane)  # kept loaded for a next job, as always
    assert pod.metadata.annotations["gpulane.io/model"] == idle
    world.cluster.kubectl("delete", f"gpumodels.gpulane.io/{idle}", "--wait=true")
    assert wait_until(lambda: stopped(idle), what="the idle model's pod stopped, and the Event")


def test_a_model_idle_past_its_ttl_gives_the_gpu_back_and_the_next_job_loads_it_again(
    world: World, operator: OperatorProcess
) -> None:
    """Issue 33, llama-swap's ttl: GpuModel.spec.ttlSeconds. Idle that long, the lane stops the model's pod
    and says so (an Event, its Ready condition); the next job loads the model in a new pod."""
    lane, model = world.lane(), world.model("ttl", ttlSeconds=2)
    world.job("first", model)
    world.wait_phase("first", "Running")
    [first_pod] = world.backend_pods(lane)
    world.complete("first")
    world.wait_phase("first", "Succeeded")
    wait_until(lambda: not world.backend_pods(lane), timeout=30, what="the idle model's pod stopped")
    selector = f"involvedObject.kind=GpuLane,involvedObject.name={lane},reason=ModelUnloaded"
    [event] = wait_until(lambda: world.core.list_namespaced_event("default", field_selector=selector).items,
                         what="the lane's ModelUnloaded Event")  # fmt: skip
    assert f"GpuModel {model!r} had no job for" in event.message and "ttlSeconds" in event.message
    ready = wait_until(lambda: next((c for c in world.cluster_status("gpulanes", lane).get("conditions") or []
                                     if c["type"] == "Ready" and c["reason"] == "NoModel"), None),
                       what="the lane's Ready condition")  # fmt: skip
    assert "ttlSeconds" in ready["message"] and world.cluster_status("gpulanes", lane).get("residentModel") is None
    world.job("second", model)
    world.wait_phase("second", "Running")
    [second_pod] = world.backend_pods(lane)
    assert second_pod.metadata.uid != first_pod.metadata.uid  # loaded again
    world.complete("second")
