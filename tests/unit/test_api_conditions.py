"""Unit tests of gpulane/api/conditions.py: one condition per type, its transition time kept while its status holds."""

from gpulane.api.conditions import condition, merge_condition
from gpulane.api.times import format_time

# 2024-05-01T12:00:00Z
T0 = 1714564800.0
T0_TEXT = "2024-05-01T12:00:00Z"


def test_condition_shape():
    cond = condition("Ready", True, "PodReady", "the pod is ready", T0)
    assert cond == {
        "type": "Ready",
        "status": "True",
        "reason": "PodReady",
        "message": "the pod is ready",
        "lastTransitionTime": "2024-05-01T12:00:00.000Z",
    }


def test_condition_false_and_observed_generation():
    cond = condition("Accepted", False, "Invalid", "bad", T0, generation=3)
    assert cond["status"] == "False"
    assert cond["observedGeneration"] == 3


def test_condition_observed_generation_zero_is_written():
    assert condition("Accepted", True, "Ok", "", T0, generation=0)["observedGeneration"] == 0


def test_merge_condition_into_nothing():
    new = condition("Ready", True, "PodReady", "", T0)
    assert merge_condition(None, new) == [new]
    assert merge_condition([], new) == [new]


def test_merge_condition_replaces_the_same_type_and_keeps_others():
    other = condition("Accepted", True, "Ok", "fine", T0)
    old = condition("Ready", False, "Loading", "loading", T0)
    new = condition("Ready", True, "PodReady", "ready", T0 + 60)
    merged = merge_condition([other, old], new)
    assert len(merged) == 2
    assert other in merged
    ready = [c for c in merged if c["type"] == "Ready"]
    assert len(ready) == 1
    assert ready[0]["reason"] == "PodReady"
    assert ready[0]["message"] == "ready"


def test_merge_condition_updates_transition_time_when_status_flips():
    old = condition("Ready", False, "Loading", "loading", T0)
    new = condition("Ready", True, "PodReady", "ready", T0 + 60)
    (merged,) = merge_condition([old], new)
    assert merged["status"] == "True"
    assert merged["lastTransitionTime"] == format_time(T0 + 60)


def test_merge_condition_keeps_transition_time_when_status_unchanged():
    old = condition("Ready", False, "Loading", "loading", T0)
    new = condition("Ready", False, "ImagePull", "pulling the image", T0 + 60, generation=2)
    (merged,) = merge_condition([old], new)
    assert merged["lastTransitionTime"] == format_time(T0)
    # Everything else is the new condition's.
    assert merged["reason"] == "ImagePull"
    assert merged["message"] == "pulling the image"
    assert merged["observedGeneration"] == 2


def test_merge_condition_does_not_mutate_its_inputs():
    old = condition("Ready", False, "Loading", "loading", T0)
    new = condition("Ready", False, "Loading", "still loading", T0 + 60)
    existing = [old]
    old_copy, new_copy = dict(old), dict(new)
    merge_condition(existing, new)
    assert existing == [old_copy]
    assert new == new_copy


def test_merge_condition_without_old_transition_time_uses_the_new_one():
    old = {"type": "Ready", "status": "True", "reason": "x", "message": ""}
    new = condition("Ready", True, "PodReady", "", T0 + 5)
    (merged,) = merge_condition([old], new)
    assert merged["lastTransitionTime"] == format_time(T0 + 5)
