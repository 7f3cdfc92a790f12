"""Unit tests of ``JobTable.enter``: a GpuJob's watch event read against the table gives, as data, what follows
(the core's events, the writes, the records) and moves the table; nothing is written and no client is needed."""

from __future__ import annotations

from typing import Any

from gpulane.api.contract import FINALIZER
from gpulane.core.dispatcher import Dispatcher
from gpulane.core.events import JobCancelled, JobFinished, JobSubmitted, dispatches
from gpulane.core.policy import Policy
from gpulane.operator.intake import Admission, DropFinalizer, Refuse
from gpulane.operator.job_table import Freed, Intake, JobState, JobTable

from .helpers import dispatcher

NOW = 1_000.0


def body(name: str, *, model: str = "m", uid: str | None = None, phase: str | None = None, **meta: Any) -> dict:
    status = {"phase": phase, "lane": "gpu-0"} if phase else {}
    metadata = {"namespace": "ns", "name": name, "uid": uid or f"uid-{name}", **meta}
    return {"metadata": metadata, "spec": {"model": model, "priority": 0}, "status": status}


def admission(**overrides: Any) -> Admission:
    fields: dict[str, Any] = {"policy": Policy(), "now": NOW, "models": {"m"}, "elsewhere": set(), **overrides}
    return Admission(**fields)


def table_on() -> tuple[JobTable, Dispatcher]:
    d, _ = dispatcher(lanes={"gpu-0": "m"})
    return JobTable(d), d


def running(table: JobTable, d: Dispatcher, name: str, started: float | None = None) -> None:
    """Admit a job through ``enter`` and let the core dispatch it."""
    [event] = table.enter("ADDED", body(name, finalizers=[FINALIZER]), admission()).events
    table.moved_by(d.handle(event), None)
    if started is not None:
        table.start(table[f"ns/{name}"], started)


def test_a_new_job_of_a_served_model_is_admitted_and_the_core_hears_it():
    table, _ = table_on()
    intake = table.enter("ADDED", body("a"), admission())
    assert [type(e) for e in intake.events] == [JobSubmitted] and intake.events[0].job.id == "ns/a"
    assert table["ns/a"].state == JobState.PENDING and intake.writes == [] and not intake.parked


def test_a_new_job_of_an_unknown_model_is_parked_and_the_core_hears_nothing():
    table, _ = table_on()
    intake = table.enter("ADDED", body("a", model="later"), admission())
    assert intake.events == [] and intake.parked and table["ns/a"].state == JobState.PARKED


def test_a_job_of_another_shards_model_is_handed_over_not_admitted():
    table, _ = table_on()
    b = body("a", model="theirs")
    intake = table.enter("ADDED", b, admission(elsewhere={"theirs"}))
    assert intake.handed is b and intake.events == [] and "ns/a" not in table


def test_refusals_are_writes_and_the_job_stays_out_of_the_table():
    table, _ = table_on()
    table.enter("ADDED", body("first"), admission())
    full = table.enter("ADDED", body("second"), admission(pending_cap=1))
    bad = body("bad")
    bad["spec"]["priority"] = "urgent-please"
    invalid = table.enter("ADDED", bad, admission())
    claimed = table.enter("MODIFIED", body("forged", phase="Running"), admission())
    reasons = [w.refusal.reason for i in (full, invalid, claimed) for w in i.writes if isinstance(w, Refuse)]
    assert reasons == ["NamespaceQueueFull", "InvalidPriority", "NotDispatched"]
    assert [k for k in ("ns/second", "ns/bad", "ns/forged") if k in table] == []
    assert all(i.events == [] for i in (full, invalid, claimed))


def test_a_deleted_waiting_job_leaves_the_queue_and_its_expiry_record_goes():
    table, _ = table_on()
    table.enter("ADDED", body("a"), admission())
    intake = table.enter("DELETED", body("a"), admission())
    assert intake.events == [JobCancelled("ns/a")] and intake.gone == "uid-a" and "ns/a" not in table


def test_a_job_created_again_under_its_name_replaces_the_old_one_in_order():
    table, _ = table_on()
    table.enter("ADDED", body("a"), admission())
    intake = table.enter("ADDED", body("a", uid="uid-new"), admission())
    assert [type(e) for e in intake.events] == [JobCancelled, JobSubmitted]
    assert table["ns/a"].uid == "uid-new"


def test_an_active_job_that_finished_frees_its_lane_timed_by_the_operators_clock():
    table, d = table_on()
    running(table, d, "a", started=NOW - 30)
    view = table["ns/a"]
    done = body("a", phase="Succeeded", finalizers=[FINALIZER])
    intake = table.enter("MODIFIED", done, admission())
    assert intake.events == [JobFinished("ns/a", 30.0)]
    assert intake.freed == [Freed(view, "gpu-0", 30.0)]
    assert intake.writes == [DropFinalizer("ns", "a", [FINALIZER])] and intake.finished is done
    assert "ns/a" not in table


def test_deleting_an_active_job_asks_for_its_cancel_once_and_a_waiting_one_just_leaves():
    table, d = table_on()
    running(table, d, "a")
    table.enter("ADDED", body("b", finalizers=[FINALIZER]), admission())
    deleting = {"deletionTimestamp": "2026-12-06T00:00:00Z", "finalizers": [FINALIZER]}
    active = table.enter("MODIFIED", body("a", **deleting), admission())
    assert active.cancel == [table["ns/a"]] and active.events == []
    table["ns/a"].ending = True  # its end is being written: a later event asks for nothing more
    assert table.enter("MODIFIED", body("a", **deleting), admission()).cancel == []
    waiting = table.enter("MODIFIED", body("b", **deleting), admission())
    assert waiting.events == [JobCancelled("ns/b")] and waiting.writes == [DropFinalizer("ns", "b", [FINALIZER])]


def test_free_tells_the_core_once():
    table, d = table_on()
    running(table, d, "a")
    view = table["ns/a"]
    first = table.free(view, None, table.enter("MODIFIED", body("a"), admission()))
    assert first.events == [JobFinished("ns/a", None)]
    assert dispatches(d.handle(first.events[0])) == []
    again = table.free(view, None, Intake())
    assert again.events == [] and again.freed == []
