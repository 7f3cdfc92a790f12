"""What a server that holds several models runs with (issue 36): llama-server in router mode, its preset
built from the GpuModels that name it, and the flags that leave every load to the operator."""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpulane.api.resources import GpuModelSpec, ModelRouter

PRESET_DIR = "/etc/gpulane/server"
PRESET_FILE = "preset.ini"
# A preset key is a llama-server flag without its dashes, its short form, or a LLAMA_ARG_ environment name.
KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# Flags the router itself sets for every model it starts, or that would let a model escape the operator.
RESERVED = frozenset({"host", "port", "alias", "models-preset", "models-dir", "models-max", "models-autoload"})


class PresetError(ValueError):
    """A held model's preset that the server could not take; the message names the model and the key."""


def preset_ini(held: Mapping[str, GpuModelSpec]) -> str:
    """The server's preset: a section per held model, named as calls name it (the GpuModel's name), holding
    that model's ``spec.preset`` keys."""
    lines = ["version = 1", ""]
    for name in sorted(held):
        if not KEY.match(name.replace(".", "-")):
            raise PresetError(f"GpuModel {name!r}: its name cannot be a preset section")
        lines.append(f"[{name}]")
        for key, value in sorted((held[name].preset or {}).items()):
            if not KEY.match(key):
                raise PresetError(f"GpuModel {name!r}: spec.preset key {key!r} is not a llama-server flag name")
            if key.lstrip("-") in RESERVED:
                raise PresetError(f"GpuModel {name!r}: spec.preset key {key!r} is the router's to set")
            if any(c in value for c in "\r\n"):
                raise PresetError(f"GpuModel {name!r}: spec.preset.{key} holds a line break")
            lines.append(f"{key} = {value}")
        lines.append("")
    return "\n".join(lines)


def router_args(router: ModelRouter, port: int) -> list[str]:
    """llama-server's flags for a lane's server: its preset, no load on its own, and at most ``maxLoaded``."""
    return [
        "--models-preset", f"{PRESET_DIR}/{PRESET_FILE}",
        "--no-models-autoload",
        "--models-max", str(router.max_loaded),
        "--host", "0.0.0.0",
        "--port", str(port),
    ]  # fmt: skip
