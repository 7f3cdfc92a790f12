"""A position refresh as a JSON patch (job_writes.refreshed): what it sets, what it removes, and its guard."""

from gpulane.operator.job_writes import refreshed


def test_a_refresh_applies_only_to_a_pending_job_and_removes_what_went() -> None:
    written = (3, True, 1000.0, 12, "gpu-0")  # the last write: a position on gpu-0 with an estimate
    status = {"position": 2, "positionExact": True, "estimatedStart": None, "expectedLane": None, "reason": None}
    patch = refreshed(status, written)
    assert patch[0] == {"op": "test", "path": "/status/phase", "value": "Pending"}
    assert {"op": "add", "path": "/status/position", "value": 2} in patch
    removed = {p["path"] for p in patch if p["op"] == "remove"}
    assert removed == {"/status/estimatedStart", "/status/expectedLane"}


def test_a_refresh_removes_nothing_that_was_never_written() -> None:
    status = {"position": 2, "positionExact": True, "estimatedStart": None, "expectedLane": None}
    assert [p["op"] for p in refreshed(status, (3, True, None, 12, None))] == ["test", "add", "add"]
