"""GpuModels that are servers holding several models, or held by one (issue 36): what the API accepts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpulane.api.resources import GpuLaneSpec, GpuModelSpec

ROUTER = {"image": "gpulane.local/llama-server:0.3.36", "router": {"protocol": "LlamaServerRouter", "maxLoaded": 2}}


def test_a_server_and_the_models_it_holds() -> None:
    server = GpuModelSpec.model_validate(ROUTER)
    assert server.router is not None and server.router.max_loaded == 2
    held = GpuModelSpec.model_validate(
        {
            "server": "llama",
            "preset": {"model": "/models/alpha.gguf", "c": "256"},
            "memoryMib": 4000,
            "expectedSwitchSeconds": 2,
        }
    )
    assert (held.server, held.memory_mib, held.expected_switch_seconds) == ("llama", 4000, 2)  # no image of its own
    assert GpuLaneSpec.model_validate({"nodeName": "gpu-0", "memoryMib": 24576}).memory_mib == 24576


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"preset": {"model": "/m.gguf"}}, "spec.image is required"),
        ({"image": "x", "preset": {"model": "/m.gguf"}}, "it needs spec.server"),
        ({**ROUTER, "server": "other"}, "held by a server or is one, not both"),
        ({**ROUTER, "router": {"protocol": "Restart"}}, "LlamaServerRouter"),
        ({**ROUTER, "router": {"protocol": "LlamaServerRouter", "maxLoaded": 0}}, "greater than or equal to 1"),
        ({"server": "llama", "memoryMib": -1}, "greater than or equal to 0"),
    ],
)
def test_what_a_server_model_may_not_say(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        GpuModelSpec.model_validate(spec)
