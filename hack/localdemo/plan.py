"""What the demo plays, in compressed time: a film's shots at batch priority, applied with kubectl, and
image calls through the bridge from two API keys of different tiers, one of which asks for more priority
than its key allows. Alice also previews a shot at interactive priority: waiting beside an image of a
higher tier, it wins when its model is the one loaded (swap affinity changes the winner)."""

from __future__ import annotations

from dataclasses import dataclass, field

FILM_MODEL, IMAGE_MODEL = "h3-video", "sdxl"
# The fake backend's seconds (load, per call): a film shot takes longer than an image, as on a real GPU.
MODELS = {FILM_MODEL: (3.0, 3.0), IMAGE_MODEL: (2.0, 1.0)}
FILM_MEMBER = "alice"


@dataclass(frozen=True)
class Key:
    name: str
    key: str
    member: str
    tier: str
    max_priority: int


STUDIO = Key("studio", "sk-demo-studio", "carol", "pro", 100)
FREE = Key("free", "sk-demo-free", "bob", "free", 0)  # asks for interactive anyway: capped to normal


@dataclass(frozen=True)
class Call:
    at: float  # seconds after the film was applied
    key: Key
    priority: str  # what the caller asks for with X-LlamaSwap-Priority


@dataclass(frozen=True)
class Plan:
    shots: int = 10
    previews: tuple[float, ...] = (8.5,)  # seconds after the film: alice's interactive previews (tier free)
    calls: tuple[Call, ...] = field(
        default_factory=lambda: (
            Call(8, STUDIO, "interactive"),
            Call(9, FREE, "interactive"),
            Call(22, STUDIO, "interactive"),
            Call(23, STUDIO, "interactive"),
            Call(36, FREE, "interactive"),
        )
    )

    @classmethod
    def short(cls) -> Plan:
        """The suite's run: fewer shots and calls, every kind of arrival still there."""
        return cls(shots=4, previews=(4.5,), calls=(Call(4, STUDIO, "interactive"), Call(5, FREE, "interactive")))


KEYS = (STUDIO, FREE)
