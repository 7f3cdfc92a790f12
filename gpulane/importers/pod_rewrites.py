"""What a command written for the host needs to run in a pod, for the importers: an address a pod is reached
on, ``${env.NAME}`` read from a Secret rather than written into a manifest, and the host paths it names
mounted where it names them. Each rewrite is a warning (``Import``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulane.api.pod_templates import refused_host_path

# Servers that listen on 127.0.0.1 unless told otherwise (each one's --help), and the flag that moves them.
LOOPBACK_SERVERS = {
    "llama-server": "--host",
    "whisper-server": "--host",
    "sd-server": "--listen-ip",
    "sglang.launch_server": "--host",
}
BIND_FLAGS = ("--host", "--listen-ip")
ANY_ADDRESS = "0.0.0.0"
SECRET = "llama-swap-env"  # the Secret that ${env.NAME} is read from, by default


@dataclass
class Import:
    warnings: list[str] = field(default_factory=list)

    def warn(self, where: str, message: str) -> None:
        self.warnings.append(f"{where}: {message}")


@dataclass
class Environment:
    """How ``${env.NAME}`` is written. llama-swap reads it from its own environment; a manifest would carry the
    value in clear, to whoever may read GpuModels. So it becomes ``$(NAME)``, which Kubernetes fills in from
    the serving container's env, read from a Secret (``secret_env``). Names given to ``--expand-env`` (a
    path, a port: nothing secret) are read from the importing shell instead."""

    values: Mapping[str, str] = field(default_factory=dict)
    expanded: frozenset[str] = frozenset()
    secret: str = SECRET
    referenced: set[str] = field(default_factory=set)

    def value(self, name: str, where: str) -> str:
        if name not in self.expanded:
            self.referenced.add(name)
            return f"$({name})"
        if name not in self.values:
            raise ValueError(f"{where}: ${{env.{name}}} is not set in the environment (llama-swap refuses it too)")
        return self.values[name]

    def secret_env(self, *texts: str) -> list[dict[str, Any]]:
        """The env entries that read, from the Secret, the names ``texts`` refer to as ``$(NAME)``."""
        used = sorted(n for n in self.referenced if any(f"$({n})" in t for t in texts))
        return [self._read(n, n) for n in used]

    def from_secret(self, env: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """An entry whose whole value is ``${env.NAME}`` reads it from the Secret itself (``$(NAME)`` of its
        own name would name nothing, and another name needs no second entry)."""
        out = []
        for entry in env:
            ref = re.fullmatch(r"\$\(([A-Za-z0-9_.-]+)\)", entry.get("value", ""))
            out.append(self._read(entry["name"], ref[1]) if ref and ref[1] in self.referenced else entry)
        return out

    def _read(self, name: str, key: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": self.secret, "key": key}}}


def _loopback(address: str) -> bool:
    host = address.strip("[]").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def server_of(words: list[str]) -> str | None:
    """Which of LOOPBACK_SERVERS a command runs: its program's name, or the module of ``python -m``."""
    names = {Path(words[0]).name, *(words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m")}
    return next((server for server in LOOPBACK_SERVERS if server in names), None)


def bind_anywhere(words: list[str], server: str | None, where: str, out: Import) -> list[str]:
    """The arguments with a bind address that a pod is reached on: in a pod, loopback is the container's
    own, which neither the kubelet's readiness probe nor the bridge (both call the pod's IP) can reach."""
    words = list(words)
    flags = (*BIND_FLAGS, "-l") if server == "sd-server" else BIND_FLAGS  # sd-server's short --listen-ip
    bound = False
    for i, word in enumerate(words):
        flag, eq, inline = word.partition("=")
        if flag not in flags or (not eq and i + 1 >= len(words)):
            continue
        bound = True
        address = inline if eq else words[i + 1]
        if _loopback(address):
            if eq:
                words[i] = f"{flag}={ANY_ADDRESS}"
            else:
                words[i + 1] = ANY_ADDRESS
            out.warn(where, f"{flag} {address}: in a pod nothing outside the container reaches loopback (the "
                     f"kubelet's probe and the bridge call the pod's IP); written as {flag} {ANY_ADDRESS}")  # fmt: skip
    if not bound and server is not None:
        flag = LOOPBACK_SERVERS[server]
        words += [flag, ANY_ADDRESS]
        out.warn(where, f"{server} listens on 127.0.0.1 unless told otherwise, which nothing outside its "
                 f"container reaches: {flag} {ANY_ADDRESS} added")  # fmt: skip
    return words


def _paths(args: list[str]) -> list[str]:
    """The absolute host paths among a command's arguments (``-m /x``, ``--model=/x``), normalised."""
    found = []
    for word in args:
        value = word.partition("=")[2] if word.startswith("-") else word
        if value.startswith("/") and "$(" not in value:
            found.append(os.path.normpath(value))
    return found


def host_mounts(
    args: list[str], roots: tuple[str, ...], where: str, out: Import
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read-only hostPath volumes and their mounts, at the same paths, for the host paths a ``cmd`` names: each
    path under a weights root mounts that root; without roots, each path mounts its directory (a name with
    an extension is taken for a file), a directory inside another mounted one adding nothing."""
    dirs: set[str] = set()
    for path in _paths(args):
        root = next((r for r in roots if path == r or path.startswith(r.rstrip("/") + "/")), None)
        if roots and root is None:
            out.warn(where, f"{path} is under no --weights-root: taken to be in the image, not mounted")
            continue
        folder = root or (os.path.dirname(path) if "." in os.path.basename(path) else path)
        if refused := refused_host_path(folder):
            out.warn(where, f"{path}: mounting {folder} refused ({refused}); not mounted")
            continue
        dirs.add(folder)
    kept = sorted(d for d in dirs if not any(d.startswith(o.rstrip("/") + "/") for o in dirs if o != d))
    for folder in kept:
        out.warn(where, f"{folder} is mounted read-only from the host at the same path (hostPath, a directory "
                 "that must exist on the lane's node)")  # fmt: skip
    volumes = [{"name": f"host-{i}", "hostPath": {"path": d, "type": "Directory"}} for i, d in enumerate(kept)]
    mounts = [{"name": f"host-{i}", "mountPath": d, "readOnly": True} for i, d in enumerate(kept)]
    return volumes, mounts
