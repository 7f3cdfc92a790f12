"""The preset and flags of a server that holds several models (issue 36); the real llama-server reads a preset
built this way in tests/e2e/test_llama_router.py."""

from __future__ import annotations

import pytest

from gpulane.api.resources import GpuModelSpec, ModelRouter
from gpulane.operator.server_pods import PresetError, preset_ini, router_args


def held(**preset: str) -> GpuModelSpec:
    return GpuModelSpec.model_validate({"server": "llama", "preset": preset})


def test_a_section_per_held_model_named_as_calls_name_it() -> None:
    text = preset_ini({"beta": held(model="/m/b.gguf"), "alpha": held(model="/m/a.gguf", c="4096")})
    assert text.splitlines() == [
        "version = 1", "",
        "[alpha]", "c = 4096", "model = /m/a.gguf", "",
        "[beta]", "model = /m/b.gguf",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "message"),
    [
        ({"port": "9000"}, "'port' is the router's to set"),
        ({"--models-max": "9"}, "is not a llama-server flag name"),
        ({"bad key": "x"}, "is not a llama-server flag name"),
        ({"model": "/m/a.gguf\n[other]"}, "line break"),
    ],
)
def test_a_preset_the_router_must_not_take_is_refused_naming_the_model(preset: dict[str, str], message: str) -> None:
    with pytest.raises(PresetError, match=message):
        preset_ini({"alpha": held(**preset)})


def test_the_router_loads_nothing_on_its_own() -> None:
    args = router_args(ModelRouter(protocol="LlamaServerRouter", max_loaded=3), 8080)
    assert "--no-models-autoload" in args
    assert args[args.index("--models-max") + 1] == "3" and args[args.index("--port") + 1] == "8080"


def test_a_held_model_is_accepted_by_its_preset_not_a_pod_of_its_own() -> None:
    import asyncio

    from gpulane.operator.models import pod_refusal

    from .test_operator_controller import World

    w = World()
    ok = asyncio.run(pod_refusal(w.ctl._models, "alpha", held(model="/m/a.gguf")))
    bad = asyncio.run(pod_refusal(w.ctl._models, "alpha", held(port="9000")))
    assert ok == (None, "Valid") and bad[1] == "InvalidPreset" and "'port' is the router's" in (bad[0] or "")
    assert not [c for c in w.kube.calls if c.verb == "check_pod"]  # no dry-run pod for it
