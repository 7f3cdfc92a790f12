"""Leader election's additions to the official client's (gpulane/kube/leader.py): the fence that stops
a leader's writes before another replica may lead, and its timing rules."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpulane.kube import leader
from gpulane.kube.client import Fenced, Kube
from gpulane.kube.leader import Fence, FencedLeaseLock, Timing


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_fence_is_open_only_until_the_renew_deadline_after_the_last_renewal_started():
    clock = Clock()
    fence = Fence(clock)
    assert not fence.open()  # a standby writes nothing
    fence.renewed(started=100.0, renew_deadline=10.0)
    clock.now = 109.9
    assert fence.open()
    clock.now = 110.0
    assert not fence.open()
    fence.renewed(started=108.0, renew_deadline=10.0)
    assert fence.open()
    fence.close()
    assert not fence.open()


def test_a_write_takes_at_most_the_gap_between_the_fence_and_another_leader():
    timing = Timing(lease_seconds=15, renew_deadline_seconds=10, retry_seconds=2)
    assert timing.write_timeout == 5  # the last write sent at the fence has ended when the Lease can pass


@pytest.mark.parametrize(
    ("timing", "says"),
    [
        (Timing(10, 10, 2), "must be longer than the renew deadline"),
        (Timing(15, 2, 2), "must be over 1.2 times the retry period"),
        (Timing(15, 10, 0.5), "which must be at least 1s"),
    ],
)
def test_bad_timings_are_refused_with_the_rule(timing: Timing, says: str):
    with pytest.raises(ValueError, match=says):
        timing.check()


class FakeLeases:
    """The library's LeaseLock calls, answered in memory (``delay`` seconds each)."""

    def __init__(self, delay: float = 0.0, ok: bool = True) -> None:
        self.delay, self.ok = delay, ok

    async def update(self, *args: Any) -> bool:
        await asyncio.sleep(self.delay)
        return self.ok


def lock(fence: Fence, leases: FakeLeases, monkeypatch: pytest.MonkeyPatch) -> FencedLeaseLock:
    monkeypatch.setattr(leader.LeaseLock, "update", lambda self, *a: leases.update(*a))
    monkeypatch.setattr(leader.LeaseLock, "__init__", lambda self, name, namespace, identity, api: None)
    made = FencedLeaseLock("gpulane-operator", "ns", "me", None, fence, Timing(4, 3, 1))  # type: ignore[arg-type]
    made.name = "gpulane-operator"
    return made


def test_a_renewal_moves_the_fence_from_when_it_started(monkeypatch: pytest.MonkeyPatch):
    clock = Clock()
    fence = Fence(clock)
    made = lock(fence, FakeLeases(), monkeypatch)
    assert asyncio.run(made.update("gpulane-operator", "ns", None)) is True  # type: ignore[arg-type]
    assert fence.until == 103.0


def test_a_failed_or_hung_renewal_does_not_move_the_fence(monkeypatch: pytest.MonkeyPatch):
    fence = Fence(Clock())
    assert asyncio.run(lock(fence, FakeLeases(ok=False), monkeypatch).update("l", "ns", None)) is False  # type: ignore[arg-type]
    assert asyncio.run(lock(fence, FakeLeases(delay=5), monkeypatch).update("l", "ns", None)) is False  # type: ignore[arg-type]
    assert not fence.open()


def test_a_fenced_kube_refuses_every_write_before_sending_it():
    class Api:
        def sanitize_for_serialization(self, obj: Any) -> Any:
            return obj

    kube = Kube(Api(), "gpulane-system")  # type: ignore[arg-type]
    kube.fence = lambda: False
    sent: list[Any] = []

    async def patch(*args: Any, **kwargs: Any) -> None:
        sent.append(args)

    with pytest.raises(Fenced, match="does not hold the operator's Lease"):
        asyncio.run(kube._write("job-status", patch, "ns", "job", {"status": {}}))
    assert sent == []


def test_a_leader_whose_apiserver_goes_away_steps_down_within_the_renew_deadline(monkeypatch: pytest.MonkeyPatch):
    """Seen in the chaos run: the library catches only ApiException, so a refused connection while the
    apiserver restarted ended its task quietly; the leader stopped renewing but never stepped down."""

    async def created(self: FencedLeaseLock, *args: Any, **kwargs: Any) -> bool:
        self.fence.renewed(self.fence.clock(), self.timing.renew_deadline_seconds)
        return True

    async def unreachable(self: Any, name: str, namespace: str) -> Any:
        if not hasattr(self, "asked"):
            self.asked = True
            missing = leader.ApiException(status=404, reason="Not Found")  # the Lease does not exist yet
            missing.body = '{"code": 404}'
            return False, missing
        raise OSError("Cannot connect to host 10.250.0.1:16443 [Connection refused]")

    def init(self: Any, name: str, namespace: str, identity: str, api: Any) -> None:
        self.name, self.namespace, self.identity = name, namespace, identity

    monkeypatch.setattr(leader.LeaseLock, "__init__", init)
    monkeypatch.setattr(leader.LeaseLock, "get", unreachable)
    monkeypatch.setattr(leader.FencedLeaseLock, "create", created)
    events: list[str] = []

    async def run() -> None:
        fence = Fence()
        lost = asyncio.Event()
        task = await leader.campaign(None, "ns", "me", Timing(2, 1.5, 1), fence, lambda: events.append("led"),  # type: ignore[arg-type]
                                     lambda: (events.append("lost"), lost.set()))  # fmt: skip
        assert fence.open()
        await asyncio.wait_for(lost.wait(), timeout=5)
        assert not fence.open()
        await asyncio.wait_for(task, timeout=2)

    asyncio.run(asyncio.wait_for(run(), timeout=15))
    assert events == ["led", "lost"]
