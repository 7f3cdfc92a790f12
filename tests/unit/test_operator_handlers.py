"""kopf's settings as gpulane's startup leaves them."""

from __future__ import annotations

import kopf

from gpulane.operator.handlers import NoDiffBase


def test_events_are_not_copied_for_a_diff_nobody_reads() -> None:
    """gpulane has only event handlers: kopf's default diff base deep-copies each event's whole body
    (a quarter of kopf's handling of an event, by py-spy in bench/operator.py latency), this one keeps nothing."""
    status = {"story": [{"i": i} for i in range(100)]}
    body = kopf.Body({"metadata": {"name": "j", "labels": {"a": "b"}}, "spec": {"model": "m"}, "status": status})
    storage = NoDiffBase()
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None
    storage.store(body=body, patch=kopf.Patch(), essence=kopf.BodyEssence())
    assert storage.fetch(body=body) is None
    assert kopf.AnnotationsDiffBaseStorage().build(body=body) != {}  # what the default would have kept
