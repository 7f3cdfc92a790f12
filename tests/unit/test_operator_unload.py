"""The bridge's /unload reaches the operator as the Lease gpulane-unload (issue 33): honoured only in the
namespace of its --unload-namespace, once per request, and never for a request found at the start."""

from __future__ import annotations

from typing import Any

from gpulane.core.events import Event, UnloadAll
from gpulane.operator import backends
from gpulane.operator.observed import Observed
from gpulane.operator.resync import Sightings


class Lane:
    name = "gpu-0"

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []
        self.kicked = 0

    def say(self, reason: str, message: str) -> None:
        self.said.append((reason, message))

    def kick(self) -> None:
        self.kicked += 1


def ports(lane: Lane, unload_namespace: str | None = "gpulane-system") -> backends.Ports:
    def failed(lane: str, reason: str, message: str, *, lost: bool = False, serving: str | None = None) -> None:
        raise AssertionError("no backend fails here")

    lanes = {lane.name: lane}
    return backends.Ports("gpulane", unload_namespace, lambda: 0.0, lambda lane: None, Observed(),
                          lanes, Sightings(), lambda lane: None, failed)  # type: ignore[arg-type]  # fmt: skip


def lease(namespace: str, at: str, name: str = "gpulane-unload") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"holderIdentity": "key ops", "renewTime": at, "leaseDurationSeconds": 1}}  # fmt: skip


def told(host: backends.Ports, kind: str | None, body: dict[str, Any]) -> list[Event]:
    """What the Lease's event tells the core (the controller settles it)."""
    return backends.lease_event(host, kind, body).events


def test_an_unload_is_acted_on_once_and_only_where_the_bridge_is() -> None:
    lane = Lane()
    host = ports(lane)
    assert told(host, None, lease("gpulane-system", "2026-12-05T00:00:00.000000Z")) == []  # found at the start
    assert told(host, "MODIFIED", lease("tenant", "2026-12-05T00:01:00.000000Z")) == []  # another namespace's
    assert told(host, "MODIFIED", lease("gpulane-system", "2026-12-05T00:01:00.000000Z", "other")) == []  # not it
    assert told(host, "MODIFIED", lease("gpulane-system", "2026-12-05T00:02:00.000000Z")) == [UnloadAll()]
    assert told(host, "MODIFIED", lease("gpulane-system", "2026-12-05T00:02:00.000000Z")) == []  # once per request
    [(reason, message)] = lane.said
    assert reason == "UnloadRequested" and "/unload by key ops" in message


def test_without_an_unload_namespace_nothing_is_honoured() -> None:
    host = ports(Lane(), unload_namespace=None)
    assert told(host, "MODIFIED", lease("gpulane-system", "2026-12-05T00:02:00.000000Z")) == []
