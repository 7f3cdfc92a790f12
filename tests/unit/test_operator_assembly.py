"""The operator as one object (``gpulane/operator/assembly.py``) and its leadership (``kube/leader.Leadership``):
when it reports ready, what leading and losing the Lease do. The whole start, against a real apiserver, is the
end-to-end suite's (every e2e test starts an operator; ``test_operator_ha.py`` its elections)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpulane.kube.leader import Election, Leadership, Timing
from gpulane.operator.assembly import Operator
from gpulane.operator.settings import Settings

from .test_operator_controller import World


def test_without_an_election_the_replica_leads_at_once() -> None:
    changes: list[bool] = []
    leadership = Leadership(None)
    asyncio.run(leadership.win(None, changes.append))  # type: ignore[arg-type]  # no Lease: no client needed
    assert changes == [True] and leadership.leading and not leadership.standing_by


def test_a_standby_is_ready_and_a_leader_once_rebuilt_and_synced() -> None:
    election = Election("gpulane-system", "replica-a", Timing())
    operator = Operator(Settings(), Leadership(election), "127.0.0.1", 0)
    assert operator.ready(), "a standby stands by, as it should: ready"
    operator.leadership.leading = True
    assert not operator.ready(), "a leader with no state yet is not"
    operator.controller = World().ctl
    operator.controller.ready = True
    assert not operator.ready(), "rebuilt, not yet checked against a resync"
    operator.controller.synced = True
    assert operator.ready()


def test_losing_the_lease_counts_a_transition_and_stops_the_process() -> None:
    stopped: list[Any] = []
    election = Election("gpulane-system", "replica-a", Timing())
    operator = Operator(Settings(), Leadership(election), "127.0.0.1", 0, on_lost=lambda: stopped.append(True))
    operator.controller = World().ctl
    metrics = operator.controller.metrics
    operator._led(True)
    assert metrics.leader._value.get() == 1 and stopped == []
    operator._led(False)
    assert metrics.leader._value.get() == 0 and stopped == [True]
    assert metrics.leader_transitions._value.get() == 2
