"""The standalone webhook's kopf memories (issue 16, item 8): reviewing GpuJob UPDATEs must not keep one
memory per job forever, since the webhook watches no GpuJobs and so never sees them deleted."""

from __future__ import annotations

import asyncio

from kopf._core.reactor import inventory

from gpulane.admission.webhook import AdmissionMemories


def body(kind: str, uid: str) -> dict[str, object]:
    return {"apiVersion": "gpulane.io/v1alpha1", "kind": kind, "metadata": {"uid": uid, "name": uid, "namespace": "a"}}


async def review_updates(memories: inventory.ResourceMemories, kind: str, count: int) -> int:
    for i in range(count):
        await memories.recall(body(kind, f"uid-{i}"))  # what kopf does for each UPDATE review
    return len(list(memories.iter_all_memories()))


def test_gpujob_reviews_leave_no_memory_behind() -> None:
    assert asyncio.run(review_updates(inventory.ResourceMemories(), "GpuJob", 1000)) == 1000  # kopf's own: a leak
    assert asyncio.run(review_updates(AdmissionMemories(), "GpuJob", 1000)) == 0


def test_watched_kinds_are_still_remembered() -> None:
    """GpuPolicies and GpuModels are watched: kopf forgets them on their DELETED events."""
    assert asyncio.run(review_updates(AdmissionMemories(), "GpuPolicy", 3)) == 3
