"""Images without a registry (`make images`): a pause image (a static Go binary), a Python base image from
Debian's packages (mmdebstrap), and the project's image from the top-level Dockerfile on that base. Each
is a docker-archive (manifest.json, a config, layer tars) cached by the hash of its inputs, and imported
into the real node's containerd with `ctr images import`.

The project image is assembled from the Dockerfile itself (see ``assemble_dockerfile``): ENV, WORKDIR,
COPY, USER, EXPOSE, ENTRYPOINT and CMD are applied as Docker applies them, and the one RUN (a
`python3 -m pip install`) runs the same pip command on the host's Python of the same minor version, into
the image's root. Anything else in the Dockerfile is refused, so the two builds cannot drift apart.
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ClusterError, Log
from .layout import HACK, REPO

PAUSE_IMAGE = "gpulane.local/pause:3.10"
BASE_IMAGE = "gpulane.local/python-base:bookworm"
PROJECT_IMAGE = "gpulane.local/gpulane:dev"


def _version() -> str:
    """gpulane's version, read from the source (this module runs without the package installed too)."""
    found = re.search(r'^__version__ = "([^"]+)"$', (REPO / "gpulane" / "__init__.py").read_text(), re.M)
    if found is None:
        raise ClusterError("gpulane/__init__.py does not set __version__")
    return found[1]


# The chart defaults its image tag to its appVersion, the gpulane version: the project image carries both.
PROJECT_TAGS = (PROJECT_IMAGE, f"gpulane.local/gpulane:{_version()}")

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = os.environ.get("GPULANE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_PACKAGES = ("python3",)
BASE_PYTHON = "3.11"  # Debian bookworm's python3; the host's pip must match it (see assemble_dockerfile)
# Bump when the way an image is assembled changes, so cached archives are rebuilt.
RECIPE = "2"  # 2: the project image is tagged with the version too


@dataclass(frozen=True)
class Image:
    name: str
    archive: Path
    key: str


def cache_dir() -> Path:
    if env := os.environ.get("GPULANE_IMAGES_CACHE"):
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpulane" / "images"


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _config(diff_ids: list[str], settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": settings,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in diff_ids]},
    }


def write_archive(path: Path, names: tuple[str, ...], layers: list[Path], settings: dict[str, Any]) -> None:
    """A docker-archive that `ctr images import` (and `docker load`) reads: one config, layer tars, and
    the image's names (tags)."""
    diff_ids = [_file_sha256(layer) for layer in layers]
    config = json.dumps(_config(diff_ids, settings), sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": list(names), "Layers": [f"{d}/layer.tar" for d in diff_ids]}]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    with tarfile.open(tmp, "w") as out:
        for arcname, data in ((config_name, config), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
        for digest, layer in zip(diff_ids, layers, strict=True):
            out.add(layer, arcname=f"{digest}/layer.tar")
    tmp.replace(path)


def _layer_from_dir(root: Path, out: Path) -> None:
    """A deterministic layer tar of ``root`` (sorted, owned by root, fixed mtime)."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with tarfile.open(out, "w") as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False, filter=normalise)


# ---------------------------------------------------------------------------------------------- pause


def build_pause(log: Log) -> Image:
    src = HACK / "node" / "pause"
    go_version = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout
    key = _digest(RECIPE, go_version, *((src / f).read_bytes() for f in ("go.mod", "main.go")))[:16]
    archive = cache_dir() / f"pause-{key}.tar"
    if archive.exists():
        return Image(PAUSE_IMAGE, archive, key)
    log(f"building {PAUSE_IMAGE} (go build of hack/node/pause)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"}
        proc = subprocess.run(
            ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(root / "pause"), "."],
            cwd=src,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ClusterError(f"go build of hack/node/pause failed:\n{proc.stderr}")
        layer = Path(tmp) / "layer.tar"
        _layer_from_dir(root, layer)
        write_archive(archive, (PAUSE_IMAGE,), [layer], {"Entrypoint": ["/pause"]})
    return Image(PAUSE_IMAGE, archive, key)


# ----------------------------------------------------------------------------------------------- base


def _base_key() -> str:
    version = subprocess.run(["mmdebstrap", "--version"], capture_output=True, text=True, check=False).stdout
    return _digest(RECIPE, version, DEBIAN_SUITE, DEBIAN_MIRROR, *BASE_PACKAGES)[:16]


def build_base(log: Log) -> tuple[Image, Path]:
    """The Debian root filesystem with python3 (one layer); returns the image and its layer tar."""
    if shutil.which("mmdebstrap") is None:
        raise ClusterError("mmdebstrap not found: run `make node-deps` (installs it from Debian's packages)")
    key = _base_key()
    layer = cache_dir() / f"python-base-{key}.layer.tar"
    archive = cache_dir() / f"python-base-{key}.tar"
    if not layer.exists():
        log(f"building {BASE_IMAGE} with mmdebstrap ({DEBIAN_SUITE}, {', '.join(BASE_PACKAGES)}; about 30 s)")
        layer.parent.mkdir(parents=True, exist_ok=True)
        tmp = layer.with_suffix(".partial.tar")
        proc = subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=apt",
                f"--include={','.join(BASE_PACKAGES)}",
                # No apt lists or caches in the image: they are only needed to install more.
                "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*.bin",
                DEBIAN_SUITE,
                str(tmp),
                DEBIAN_MIRROR,
            ],
            env={**os.environ, "SOURCE_DATE_EPOCH": "0"},
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise ClusterError(f"mmdebstrap failed (mirror {DEBIAN_MIRROR}):\n{proc.stderr[-2000:]}")
        tmp.replace(layer)
    if not archive.exists():
        settings = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["python3"]}
        write_archive(archive, (BASE_IMAGE,), [layer], settings)
    return Image(BASE_IMAGE, archive, key), layer


# ------------------------------------------------------------------------------------ the Dockerfile


@dataclass
class Assembly:
    """What the Dockerfile's instructions set, in the image config's terms."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    exposed: dict[str, dict[str, str]] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **self.env}
        out: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in env.items()], "WorkingDir": self.workdir}
        for key, value in (("User", self.user), ("Entrypoint", self.entrypoint), ("Cmd", self.cmd)):
            if value:
                out[key] = value
        if self.exposed:
            out["ExposedPorts"] = self.exposed
        return out


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _ignored(rel: Path, patterns: list[str]) -> bool:
    text = rel.as_posix()
    return any(
        fnmatch.fnmatch(text, p) or fnmatch.fnmatch(rel.name, p.removeprefix("**/"))
        for p in patterns
        if p and not p.startswith("#")
    )


def _context_files(context: Path, sources: list[str], patterns: list[str]) -> list[Path]:
    files: list[Path] = []
    for source in sources:
        path = context / source
        if not path.exists():
            raise ClusterError(f"Dockerfile COPY: {source} does not exist in {context}")
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        files += [f for f in candidates if f.is_file() and not _ignored(f.relative_to(context), patterns)]
    return files


def _copy(context: Path, root: Path, workdir: str, args: str, patterns: list[str]) -> None:
    *sources, dest = shlex.split(args)
    target = Path(dest if dest.startswith("/") else f"{workdir}/{dest}")
    for source in sources:
        src = context / source
        for f in _context_files(context, [source], patterns):
            rel = f.relative_to(src) if src.is_dir() else Path(f.name)
            out = (
                root / target.relative_to("/") / rel
                if (src.is_dir() or dest.endswith("/"))
                else root / target.relative_to("/")
            )
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out)


def _run_pip(root: Path, workdir: str, args: str, log: Log) -> None:
    argv = shlex.split(args)
    if argv[:4] != ["python3", "-m", "pip", "install"]:
        raise ClusterError(
            f"Dockerfile RUN {args!r}: the local assembler runs only `python3 -m pip install ...` (see "
            "hack/localcluster/images.py); keep other steps out of the Dockerfile or extend the assembler"
        )
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    if host != BASE_PYTHON:
        raise ClusterError(f"the host's Python is {host}, the base image's is {BASE_PYTHON}: wheels would not match")

    def into_root(value: str) -> str:
        path = value if value.startswith("/") else f"{workdir}/{value}"
        return str(root / Path(path).relative_to("/"))

    mapped: list[str] = []
    for arg in argv[4:]:
        if arg.startswith("--target="):
            mapped.append("--target=" + into_root(arg.removeprefix("--target=")))
        elif arg.startswith("-"):
            mapped.append(arg)
        else:
            mapped.append(into_root(arg))
    log(f"RUN pip install on the host's Python {host} into the image root")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", *mapped], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise ClusterError(f"Dockerfile RUN {args!r} failed:\n{proc.stderr[-2000:]}")


def assemble_dockerfile(dockerfile: Path, context: Path, root: Path, build_args: dict[str, str], log: Log) -> Assembly:
    """Apply ``dockerfile`` to an empty layer directory ``root`` (on top of the base named by FROM)."""
    patterns = []
    if (context / ".dockerignore").exists():
        patterns = [p.strip() for p in (context / ".dockerignore").read_text().splitlines()]
    asm = Assembly()
    args = dict(build_args)
    for word, rest in dockerfile_instructions(dockerfile.read_text()):
        if word == "ARG":
            name, _, default = rest.partition("=")
            args.setdefault(name, default)
        elif word == "FROM":
            continue  # the base layer is given; its name came from the BASE build argument
        elif word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                asm.env[key] = value
        elif word == "WORKDIR":
            asm.workdir = rest if rest.startswith("/") else f"{asm.workdir.rstrip('/')}/{rest}"
            (root / asm.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif word == "COPY":
            _copy(context, root, asm.workdir, rest, patterns)
        elif word == "RUN":
            _run_pip(root, asm.workdir, rest, log)
        elif word == "USER":
            asm.user = rest
        elif word == "EXPOSE":
            asm.exposed.update({p if "/" in p else f"{p}/tcp": {} for p in rest.split()})
        elif word in ("ENTRYPOINT", "CMD"):
            value = json.loads(rest)
            setattr(asm, word.lower(), value)
        else:
            raise ClusterError(f"Dockerfile instruction {word} is not supported by the local assembler")
    return asm


def _project_key(base_key: str, dockerfile: Path) -> str:
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()]
    sources: list[str] = []
    for word, rest in dockerfile_instructions(dockerfile.read_text()):
        if word == "COPY":
            sources += shlex.split(rest)[:-1]
    parts: list[bytes | str] = [RECIPE, base_key, dockerfile.read_bytes(), "|".join(patterns)]
    for f in _context_files(REPO, sources, patterns):
        parts += [str(f.relative_to(REPO)), f.read_bytes()]
    return _digest(*parts)[:16]


def build_project(base: Image, base_layer: Path, log: Log) -> Image:
    dockerfile = REPO / "Dockerfile"
    key = _project_key(base.key, dockerfile)
    archive = cache_dir() / f"gpulane-{key}.tar"
    if archive.exists():
        return Image(PROJECT_IMAGE, archive, key)
    log(f"assembling {PROJECT_IMAGE} from the Dockerfile with BASE={BASE_IMAGE}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        asm = assemble_dockerfile(dockerfile, REPO, root, {"BASE": BASE_IMAGE}, log)
        layer = Path(tmp) / "layer.tar"
        _layer_from_dir(root, layer)
        write_archive(archive, PROJECT_TAGS, [base_layer, layer], asm.settings())
    return Image(PROJECT_IMAGE, archive, key)


PRUNE_AFTER = 24 * 3600.0
# Project archives kept besides the ones in use, newest first, whatever their age: each source edit makes one
# (~400 MB), and a day of edits made 60 of them (24 GB) on this project's machine.
KEEP_PROJECT_ARCHIVES = 4


def _prune(keep: list[Image]) -> None:
    """Drop archives unused for a day, and project archives beyond the newest few. Not the newest at once:
    another checkout's `up` may be about to import its own."""
    now = time.time()
    for image in keep:
        os.utime(image.archive)
    in_use = {image.archive for image in keep}
    archives = sorted(cache_dir().glob("*.tar"), key=lambda a: a.stat().st_mtime, reverse=True)
    projects = [a for a in archives if a.name.startswith("gpulane-") and a not in in_use]
    for archive in archives:
        if archive in in_use or archive.name.endswith(".layer.tar"):
            continue
        if now - archive.stat().st_mtime > PRUNE_AFTER or archive in projects[KEEP_PROJECT_ARCHIVES:]:
            archive.unlink(missing_ok=True)


def build_images(log: Log) -> list[Image]:
    """Build (or find in the cache) the pause, base and project images; returns the ones a node imports:
    pause and the project's (which holds the base's layer)."""
    started = datetime.datetime.now()
    pause = build_pause(log)
    base, base_layer = build_base(log)
    project = build_project(base, base_layer, log)
    _prune([pause, base, project])
    seconds = (datetime.datetime.now() - started).total_seconds()
    log(f"images ready in {seconds:.1f}s: " + ", ".join(f"{i.name} ({i.archive})" for i in (pause, base, project)))
    return [pause, project]


def import_images(ctr: list[str], images: list[Image], log: Log) -> None:
    """``ctr`` is the ctr command with its --address; images go into the CRI plugin's namespace."""
    for image in images:
        proc = subprocess.run(
            [*ctr, "-n", "k8s.io", "images", "import", str(image.archive)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise ClusterError(f"ctr images import {image.archive} failed:\n{proc.stderr[-2000:]}")
        log(f"imported {image.name}")
