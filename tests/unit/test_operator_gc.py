"""The operator's tuning of Python's cyclic collector (gpulane/operator/main.py ``tune_gc``)."""

from __future__ import annotations

import copy
import gc
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from gpulane.operator.main import GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_imported_code_leaves_the_collections_and_young_ones_are_rarer(restored_gc: None) -> None:
    gc.unfreeze()
    _, middle, old = gc.get_threshold()
    tune_gc()
    assert gc.get_freeze_count() > 10_000  # the modules, classes and functions imported so far
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, middle, old)
    assert GC_YOUNG_THRESHOLD > 700  # CPython's default, which made collection 30% of a burst's CPU


def test_a_young_collection_frees_a_few_watch_events_bodies_not_hundreds(restored_gc: None) -> None:
    """kopf keeps each watch event's parsed body in a reference cycle (its Body and its Meta, Spec and Status
    views, its Patch and their parts), so only a collection frees it. At 20,000 allocations a young collection
    freed hundreds of events' at once, 20 to 70 ms of the loop between dispatches."""
    gc.unfreeze()
    tune_gc()
    raw = {
        "apiVersion": "gpulane.io/v1alpha1", "kind": "GpuJob",
        "metadata": {"name": "j", "namespace": "team-a", "labels": {"gpulane.io/member": "m1"},
                     "managedFields": [{"manager": "gpulane-operator", "fieldsV1": {"f:status": {"f:phase": {}}}}]},
        "spec": {"model": "llama-8b", "priority": 100, "tier": "free", "member": "m1"},
        "status": {"phase": "Pending", "position": 12, "score": {"priority": 100, "tier": 0, "total": 100.0},
                   "conditions": [{"type": "Admitted", "status": "True", "reason": "Queued"}]},
    }  # fmt: skip
    freed: list[int] = []

    def collected(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] < 2:
            freed.append(info["collected"])

    def event() -> None:  # one event, read as kopf reads it, then dropped
        body, patch = kopf.Body(copy.deepcopy(raw)), kopf.Patch()
        assert body.meta.name == "j" and patch.status is not None

    gc.collect()
    event()
    per_event = gc.collect()  # what one event leaves to the collector
    assert per_event > 0, "kopf's views no longer hold a cycle: this tuning may go"
    gc.callbacks.append(collected)
    try:
        for _ in range(3_000):  # the events under test
            event()
    finally:
        gc.callbacks.remove(collected)
    assert freed, "no young collection in 3,000 events"
    assert max(freed) <= 100 * per_event, f"a young collection freed {max(freed) // per_event} events' bodies"
