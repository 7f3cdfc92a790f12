"""requirements.lock (`make lock`) pins every dependency of pyproject.toml, extras included, to a version
inside the range pyproject.toml allows: `make install` and the image install exactly those."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    found = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line and not line.startswith((" ", "#", "-")):
            name, version = line.split("==")
            found[canonicalize_name(name)] = version.strip()
    return found


def test_every_dependency_is_pinned_within_its_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    pinned = pins()
    for text in wanted:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is not in requirements.lock: run `make lock`"
        assert req.specifier.contains(pinned[name], prereleases=True), f"{req.name}=={pinned[name]} is outside {req}"


def test_the_image_and_make_install_use_the_lock() -> None:
    assert "-c requirements.lock" in (REPO / "Dockerfile").read_text()
    assert "-c requirements.lock" in (REPO / "Makefile").read_text()
