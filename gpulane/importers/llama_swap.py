"""``gpulane import-llama-swap CONFIG.yaml``: a llama-swap configuration as GpuModel manifests.

One GpuModel per llama-swap model, on stdout as multi-document YAML; one warning line on stderr for each
key that cannot be carried over, saying why. Macros are expanded as llama-swap expands them (global, then
the model's own, each able to use those before it; ``${env.NAME}``; ``${PORT}`` and ``${MODEL_ID}``).
A ``cmd`` becomes the serving container's args, run by the entrypoint of the image its program is mapped to by
``--image PROGRAM=IMAGE``; a ``docker run`` or ``podman run`` line gives its own image, volumes, env and
port. What would not run in a pod is rewritten, each time with a warning: a server bound to loopback is
bound to every address, and ``${env.NAME}`` is read from a Secret instead of written into the manifest
(``--expand-env NAME`` for a value that is no secret, a path or a port). The exit status is non-zero only
when the file is not a llama-swap configuration (docs/migration.md).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gpulane.api.pod_templates import SERVING_CONTAINER, refused_host_path
from gpulane.api.resources import API_VERSION, GpuModelSpec
from gpulane.importers.filters import model_filters
from gpulane.importers.pod_rewrites import SECRET, Environment, Import, bind_anywhere, host_mounts, server_of

DEFAULT_START_PORT = 5800  # llama-swap's startPort: ${PORT}; each GpuModel is a pod of its own
MAX_TTL = 604800  # GpuModel.spec.ttlSeconds' bound: a week
MACRO = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")
NAME_CHARS = re.compile(r"[^a-z0-9.-]+")
PARALLEL_FLAGS = ("--parallel", "-np")  # llama-server's slots: how many jobs it serves at once
# Where backend pods run (the operator's --namespace): the chart's, for a release in gpulane-system.
BACKEND_NAMESPACE = "gpulane-system-backends"
# Top-level keys that configure llama-swap itself, and what gpulane does instead.
GLOBAL_KEYS = {
    "logLevel": "the operator and the bridge log with --verbose",
    "logTimeFormat": "logs are Kubernetes' (kubectl logs)",
    "logToStdout": "logs are Kubernetes' (kubectl logs)",
    "metricsMaxInMemory": "metrics are Prometheus' (/metrics)",
    "captureBuffer": "no request captures",
    "store": "no activity store: GpuJobs and their Events are the record",
    "ui": "no web UI: kubectl get gj, gpulane queue",
    "performance": "no performance page",
    "sendLoadingState": "a queued stream gets SSE comments with its position instead",
    "includeAliasesInList": "the bridge always lists aliases in /v1/models, each as an entry of its own",
    "unloadTimeout": "a backend pod gets terminationGracePeriodSeconds 5",
    "apiKeys": "the bridge's keys file (docs/bridge.md) gives each key a member, a tier and a priority cap",
    "groups": "one model per GPU lane at a time; several lanes serve side by side",
    "hooks": "no preload: a lane loads a model when a job needs it",
    "profiles": "no profiles",
    "selectors": "no selectors",
    "peers": "no peers",
    "tailcat": "no Tailcat listener",
    "upstream": "give its ignorePaths to the bridge: --upstream-ignore-path REGEX each (chart: "
    "bridge.upstreamIgnorePaths); /upstream calls of other paths are queued",
    "matrix": "one model per GPU lane at a time",
}
# A model's keys that have no GpuModel field, and why.
MODEL_KEYS = {
    "cmdStop": "a backend pod is stopped by deleting it",
    "unlisted": "every GpuModel is listed in /v1/models",
    "name": "GpuModels have no display name",
    "description": "GpuModels have no description",
    "metadata": "GpuModels have no metadata of llama-swap's kind (labels and annotations are Kubernetes')",
    "compat": "no websocket special case",
    "sendLoadingState": "a queued stream gets SSE comments with its position instead",
    "unloadTimeout": "a backend pod gets terminationGracePeriodSeconds 5",
}


# docker run options that take a value (as the next word, or after "=").
WITH_VALUE = frozenset(
    [
        "-v",
        "--volume",
        "-e",
        "--env",
        "-p",
        "--publish",
        "--name",
        "--gpus",
        "--shm-size",
        "--network",
        "--net",
        "--ipc",
        "--runtime",
        "--device",
        "-w",
        "--workdir",
        "--entrypoint",
        "--user",
        "-u",
        "--env-file",
        "--restart",
        "--pull",
        "--platform",
        "--cpus",
        "-m",
        "--memory",
    ]
)


class NotLlamaSwap(ValueError):
    """The file is not a llama-swap configuration."""


def expand(text: str, macros: Mapping[str, str], environ: Environment, where: str) -> str:
    """llama-swap's substitution: ``${env.NAME}`` first, then the macros (which may use earlier ones)."""

    def env(match: re.Match[str]) -> str:
        name = match[1]
        if not name.startswith("env."):
            return match[0]
        return environ.value(name[4:], where)

    text = MACRO.sub(env, text)
    for _ in range(16):  # macros of macros, as far as they go
        expanded = MACRO.sub(lambda m: macros.get(m[1], m[0]), text)
        if expanded == text:
            break
        text = expanded
    return text


def macro_table(raw: Any, where: str, inherited: Mapping[str, str], environ: Environment) -> dict[str, str]:
    table = dict(inherited)
    if raw is None:
        return table
    if not isinstance(raw, Mapping):
        raise NotLlamaSwap(f"{where}: macros must be a mapping")
    for name, value in raw.items():
        if name in ("PORT", "MODEL_ID", "PID"):
            raise NotLlamaSwap(f"{where}: {name} is a reserved macro name")
        table[str(name)] = expand(str(value).strip() if isinstance(value, str) else _scalar(value), table, environ,
                                  f"{where}.{name}")  # fmt: skip
    return table


def _scalar(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def command_words(cmd: str) -> list[str]:
    """A ``cmd`` as llama-swap reads it: comment lines of a block dropped, then split like a shell does."""
    lines = [line.split(" #", 1)[0] for line in cmd.splitlines() if not line.strip().startswith("#")]
    return shlex.split(" ".join(lines))


def model_name(model_id: str) -> str:
    """A GpuModel name (a DNS subdomain) for a llama-swap model ID."""
    name = NAME_CHARS.sub("-", model_id.lower()).strip("-.")
    return name[:253] or "model"


def from_container_run(words: list[str], where: str, out: Import) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A ``docker run`` / ``podman run`` line: the serving container, and its pod's volumes."""
    container: dict[str, Any] = {"name": "backend", "env": [], "volumeMounts": []}
    volumes: list[dict[str, Any]] = []
    i = 2
    with_value = WITH_VALUE
    while i < len(words) and words[i].startswith("-"):
        flag, _, inline = words[i].partition("=")
        value = inline or (words[i + 1] if flag in with_value and i + 1 < len(words) else "")
        i += 1 if inline or flag not in with_value else 2
        if flag in ("-v", "--volume"):
            source, _, rest = value.partition(":")
            target, _, mode = rest.partition(":")
            if not source.startswith("/"):
                out.warn(where, f"volume {value!r}: only host paths carry over (a named volume is Docker's)")
                continue
            if refused := refused_host_path(source):
                out.warn(where, f"volume {value!r} refused: {refused}; not carried over")
                continue
            name = f"vol-{len(volumes)}"
            volumes.append({"name": name, "hostPath": {"path": source}})
            mount: dict[str, Any] = {"name": name, "mountPath": target}
            if "ro" in mode.split(","):
                mount["readOnly"] = True
            container["volumeMounts"].append(mount)
        elif flag in ("-e", "--env"):
            key, eq, val = value.partition("=")
            if eq:
                container["env"].append({"name": key, "value": val})
            else:
                out.warn(where, f"env {key!r} without a value (taken from the host's environment by Docker)")
        elif flag in ("-p", "--publish"):
            container["_port"] = int(value.rsplit(":", 1)[-1].split("/")[0])
        elif flag == "--shm-size":
            size = value.upper().rstrip("B") + "i" if value[-1:].isalpha() else value  # Docker's 8g is 8Gi
            volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}})
            container["volumeMounts"].append({"name": "shm", "mountPath": "/dev/shm"})
        elif flag in ("--gpus", "--runtime", "--device"):
            out.warn(where, f"{flag} {value}: the GPU is the lane's (GpuLane resource and count; spec.template's "
                     "runtimeClassName, e.g. nvidia)")  # fmt: skip
        elif flag in ("--entrypoint",):
            container["command"] = [value]
        elif flag in ("-w", "--workdir"):
            container["workingDir"] = value
        elif flag not in ("--rm", "-d", "--detach", "-i", "-t", "-it", "--init", "--name"):
            out.warn(where, f"docker run option {flag} is not carried over")
    if i >= len(words):
        raise NotLlamaSwap(f"{where}: the {words[0]} run line names no image")
    container["image"] = words[i]
    if words[i + 1 :]:
        container["args"] = words[i + 1 :]
    return container, volumes


def model_manifest(
    model_id: str, raw: Mapping[str, Any], macros: Mapping[str, str], images: Mapping[str, str],
    environ: Environment, start_port: int, health_timeout: int | None, out: Import, runtime_class: str | None = None,
    weights_roots: tuple[str, ...] = (), default_ttl: Any = None,
) -> dict[str, Any]:  # fmt: skip
    where = f"models.{model_id}"
    table = macro_table(raw.get("macros"), f"{where}.macros", macros, environ)
    table.update(PORT=str(start_port), MODEL_ID=model_id)
    cmd = raw.get("cmd")
    if not isinstance(cmd, str) or not cmd.strip():
        raise NotLlamaSwap(f"{where}: cmd is required")
    words = command_words(expand(cmd, table, environ, f"{where}.cmd"))
    if not words:
        raise NotLlamaSwap(f"{where}: cmd is empty")
    spec: dict[str, Any] = {}
    template_spec: dict[str, Any] = {}
    port = start_port
    if Path(words[0]).name in ("docker", "podman") and len(words) > 1 and words[1] == "run":
        container, volumes = from_container_run(words, f"{where}.cmd", out)
        port = container.pop("_port", port)
        if "args" in container:  # the image's own entrypoint: only an explicit loopback address is known
            container["args"] = bind_anywhere(container["args"], None, f"{where}.cmd", out)
        container["env"] = environ.from_secret(container["env"])
        container = {k: v for k, v in container.items() if v}
        template_spec = {"containers": [container], **({"volumes": volumes} if volumes else {})}
    else:
        words = bind_anywhere(words, server_of(words), f"{where}.cmd", out)
        program = words[0]
        image = images.get(program) or images.get(Path(program).name)
        if image is None:
            image = f"set-me/{Path(program).name}"
            out.warn(f"{where}.cmd", f"no image for {program}: give --image {program}=IMAGE (written as {image})")
        else:
            out.warn(f"{where}.cmd", f"{image}'s entrypoint runs in place of {program}, with the cmd's arguments "
                     "(give the model a command if the image's entrypoint is not the server)")  # fmt: skip
        # The program's path on the host means nothing in the image: a server image's entrypoint is its server
        # (llama.cpp's /app/llama-server, vLLM's, whisper.cpp's), which gets the cmd's arguments.
        spec.update(image=image, args=words[1:])
    proxy = raw.get("proxy")
    if proxy is not None:
        address = expand(str(proxy), table, environ, f"{where}.proxy")
        if ref := re.search(r"\$\(([A-Za-z0-9_.-]+)\)", address):
            raise NotLlamaSwap(f"{where}.proxy: ${{env.{ref[1]}}} in an address: give --expand-env {ref[1]} (an "
                               "address is no secret; it is read from this shell then)")  # fmt: skip
        url = urlsplit(address)
        if template_spec and url.port != port:  # docker's -p HOST:CONTAINER: the pod is called on CONTAINER
            out.warn(f"{where}.proxy", f"port {url.port} is the host's; the pod is called on its container port {port}")
        elif url.port is None:
            out.warn(f"{where}.proxy", f"{proxy!r} names no port; {port} assumed")
        else:
            port = url.port
        if url.path not in ("", "/"):
            out.warn(f"{where}.proxy", f"the path {url.path!r} is not carried over: the bridge calls the pod's root")
    spec["port"] = port
    check = raw.get("checkEndpoint")
    if check == "none":
        out.warn(f"{where}.checkEndpoint", "none: gpulane needs a readiness path; /health is assumed")
    elif check is not None:
        spec["readinessPath"] = str(check) if str(check).startswith("/") else f"/{check}"
    env: list[dict[str, Any]] = []
    for entry in raw.get("env") or []:
        name, eq, value = str(entry).partition("=")
        if not eq:
            out.warn(f"{where}.env", f"{entry!r} is not NAME=value")
            continue
        env.append({"name": name, "value": expand(value, table, environ, f"{where}.env")})
    env = environ.from_secret(env)
    if plain := [e for e in env if "value" in e]:
        spec["env"] = plain
    # A docker run line's container is the serving one; a cmd's gets a template container for its Secret env.
    serving: dict[str, Any] = template_spec["containers"][0] if template_spec else {"name": SERVING_CONTAINER}
    if not template_spec:  # a cmd runs on the host: the host paths it names are mounted where it names them
        volumes, mounts = host_mounts(spec["args"], weights_roots, f"{where}.cmd", out)
        if mounts:
            serving["volumeMounts"] = mounts
            template_spec.update(containers=[serving], volumes=volumes)
    texts = [*spec.get("args", []), *(e["value"] for e in plain), *serving.get("args", []),
             *(e.get("value", "") for e in serving.get("env", []))]  # fmt: skip
    secret = [e for e in [*environ.secret_env(*texts), *(e for e in env if "valueFrom" in e)]
              if e["name"] not in {x["name"] for x in serving.get("env", [])}]  # fmt: skip
    if secret:  # before the entries that use them: Kubernetes fills in $(NAME) from those defined earlier
        serving["env"] = [*secret, *serving.get("env", [])]
        template_spec.setdefault("containers", [serving])
    keys = {e["valueFrom"]["secretKeyRef"]["key"] for e in serving.get("env", []) if "valueFrom" in e}
    for name in sorted(keys):
        out.warn(where, f"${{env.{name}}} is read from Secret {environ.secret} (key {name}), never written into "
                 "the manifest")  # fmt: skip
    if runtime_class:
        template_spec["runtimeClassName"] = runtime_class
    slots = _parallel(words)
    if slots is not None:
        spec["maxConcurrency"] = slots
    if health_timeout is not None:
        spec["loadTimeoutSeconds"] = max(15, health_timeout)
    if "filters" in raw and (filters := model_filters(raw["filters"], f"{where}.filters", out)):
        spec["filters"] = filters
    ttl = raw.get("ttl", default_ttl)
    if ttl is not None:
        seconds = ttl if isinstance(ttl, int) and not isinstance(ttl, bool) else None
        if seconds is None or seconds < 0:
            out.warn(f"{where}.ttl", f"{ttl!r} is not a number of seconds; the model stays loaded")
        elif seconds > 0:  # 0 is llama-swap's "never unload"
            spec["ttlSeconds"] = min(seconds, MAX_TTL)
    if "concurrencyLimit" in raw:
        out.warn(f"{where}.concurrencyLimit", "gpulane queues every call (the bridge's --max-queued caps the queue); "
                 "maxConcurrency is the server's parallel slots (llama-server --parallel)")  # fmt: skip
    for key, why in MODEL_KEYS.items():
        if key in raw:
            out.warn(f"{where}.{key}", why)
    aliases = _aliases(raw.get("aliases"), f"{where}.aliases", out)
    if "useModelName" in raw:
        spec["useModelName"] = str(raw["useModelName"])
    known = {"cmd", "proxy", "checkEndpoint", "env", "ttl", "concurrencyLimit", "macros", "aliases", "useModelName",
             "filters", *MODEL_KEYS}  # fmt: skip
    for key in raw:
        if key not in known:
            out.warn(f"{where}.{key}", "not a key of llama-swap's model configuration; ignored")
    if template_spec:
        spec["template"] = {"spec": template_spec}
    name = model_name(model_id)
    if name != model_id:  # clients keep calling it by its llama-swap name
        out.warn(where, f"named {name!r}: a GpuModel's name is a Kubernetes name; {model_id!r} is an alias")
        aliases.insert(0, model_id)
    if aliases:
        spec["aliases"] = aliases
    GpuModelSpec.model_validate(spec)  # what the CRD would refuse, refused here first
    return {"apiVersion": API_VERSION, "kind": "GpuModel", "metadata": {"name": name}, "spec": spec}


def _ignore_paths(upstream: object) -> str:
    """The bridge's flags for llama-swap's upstream.ignorePaths."""
    paths = upstream.get("ignorePaths") if isinstance(upstream, Mapping) else None
    if not isinstance(paths, list) or not paths:
        return GLOBAL_KEYS["upstream"]
    flags = " ".join(f"--upstream-ignore-path {shlex.quote(str(p))}" for p in paths)
    return f"the bridge skips the queue for these paths with {flags} (chart: bridge.upstreamIgnorePaths)"


def _aliases(raw: object, where: str, out: Import) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        out.warn(where, "not a list of names; ignored")
        return []
    names = [str(a).strip() for a in raw if str(a).strip()]
    if len(names) != len(raw):
        out.warn(where, "empty names dropped")
    return names


def _parallel(words: list[str]) -> int | None:
    for i, word in enumerate(words):
        flag, _, inline = word.partition("=")
        if flag in PARALLEL_FLAGS:
            value = inline or (words[i + 1] if i + 1 < len(words) else "")
            if value.isdigit() and int(value) >= 1:
                return min(int(value), 1024)
    return None


def convert(
    config: Any, images: Mapping[str, str], environ: Environment | None = None, runtime_class: str | None = None,
    weights_roots: tuple[str, ...] = (),
) -> tuple[list[dict[str, Any]], list[str]]:  # fmt: skip
    """GpuModel manifests for a parsed llama-swap configuration, and the warnings."""
    environ = environ or Environment(os.environ)
    if not isinstance(config, Mapping) or not isinstance(config.get("models"), Mapping) or not config["models"]:
        raise NotLlamaSwap("not a llama-swap configuration: it has no 'models' mapping")
    out = Import()
    macros = macro_table(config.get("macros"), "macros", {}, environ)
    start_port = int(config.get("startPort", DEFAULT_START_PORT))
    health = config.get("healthCheckTimeout")
    for key, why in GLOBAL_KEYS.items():
        if key in config:
            out.warn(key, _ignore_paths(config[key]) if key == "upstream" else why)
    for key in config:
        if key not in GLOBAL_KEYS and key not in ("models", "macros", "startPort", "healthCheckTimeout", "globalTTL"):
            out.warn(str(key), "not a key of llama-swap's configuration; ignored")
    manifests = []
    for model_id, raw in config["models"].items():
        if not isinstance(raw, Mapping):
            raise NotLlamaSwap(f"models.{model_id}: a model is a mapping")
        manifests.append(model_manifest(str(model_id), raw, macros, images, environ, start_port,
                                        int(health) if health is not None else None, out, runtime_class,
                                        weights_roots, config.get("globalTTL")))  # fmt: skip
    return manifests, out.warnings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="llama-swap's config.yaml")
    parser.add_argument("--image", action="append", default=[], metavar="PROGRAM=IMAGE",
                        help="the image that runs PROGRAM (a cmd's first word, its path or its name)")  # fmt: skip
    parser.add_argument("--runtime-class", metavar="NAME",
                        help="runtimeClassName of every model's pods (nvidia on k3s and the GPU Operator)")  # fmt: skip
    parser.add_argument("--expand-env", action="append", default=[], metavar="NAME",
                        help="write ${env.NAME} from this shell (a path, a port), not from a Secret")  # fmt: skip
    parser.add_argument("--weights-root", action="append", default=[], metavar="DIR",
                        help="where weights live on the GPU nodes: a cmd's paths under DIR mount DIR; others are "
                        "taken to be in the image (default: each path's directory is mounted)")  # fmt: skip
    parser.add_argument("--values", action="store_true",
                        help="print the chart's values (models:, and lanes: with --node) for helm -f")  # fmt: skip
    parser.add_argument("--node", metavar="NAME",
                        help="also a GpuLane on node NAME, named after it (the box's one GPU)")  # fmt: skip
    parser.add_argument("--secret", default=SECRET,
                        help="the Secret that ${env.NAME} is read from (default %(default)s)")  # fmt: skip
    parser.add_argument("--namespace", default=BACKEND_NAMESPACE,
                        help="the backend pods' namespace, for the Secret's command (default %(default)s)")  # fmt: skip


def run(args: argparse.Namespace, warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> int:
    images = {}
    for item in args.image:
        program, eq, image = item.partition("=")
        if not eq or not program or not image:
            warn(f"error: --image {item!r} is not PROGRAM=IMAGE")
            return 2
        images[program] = image
    environ = Environment(os.environ, frozenset(args.expand_env), args.secret)
    try:
        config = yaml.safe_load(args.config.read_text())
        roots = tuple(os.path.normpath(r) for r in args.weights_root)
        if bad := [r for r in roots if not r.startswith("/") or refused_host_path(r)]:
            raise NotLlamaSwap(f"--weights-root {bad[0]}: an absolute path that is not the host's own")
        manifests, warnings = convert(config, images, environ, args.runtime_class, roots)
    except (OSError, yaml.YAMLError, NotLlamaSwap, ValueError) as err:
        warn(f"error: {args.config}: {err}")
        return 1
    for line in warnings:
        warn(f"warning: {line}")
    if mounted := sorted({p for m in manifests for p in host_paths(m)}):
        where = (
            "the values set operator.backendPodSecurity: privileged"
            if args.values
            else ("apply them where Pod Security allows it (the chart: operator.backendPodSecurity: privileged)")
        )
        warn(f"note: the models mount host paths ({', '.join(mounted)}), which Pod Security's baseline refuses: "
             f"{where}; gpulane's own rules still refuse privileged containers and the host's own paths")  # fmt: skip
    if environ.referenced:
        literals = " ".join(f'--from-literal={n}="${n}"' for n in sorted(environ.referenced))
        warn(f"note: create the Secret in the backend pods' namespace (the chart creates it at install; a pod "
             f"started before the Secret exists waits for it), from this shell's values (none is printed): "
             f"kubectl create secret generic {args.secret} -n {args.namespace} {literals}")  # fmt: skip
    sys.stdout.write(render(manifests, args.node, as_values=args.values))
    return 0


def host_paths(manifest: dict[str, Any]) -> list[str]:
    """The host paths a GpuModel's pods mount."""
    volumes = ((manifest["spec"].get("template") or {}).get("spec") or {}).get("volumes") or []
    return [v["hostPath"]["path"] for v in volumes if "hostPath" in v]


def render(manifests: list[dict[str, Any]], node: str | None, *, as_values: bool) -> str:
    """The GpuModels (and a GpuLane on ``node``) as manifests, or as the chart's ``models:`` and ``lanes:``."""
    lanes = [] if node is None else [{"name": model_name(node), "spec": {"nodeName": node}}]
    if as_values:
        values: dict[str, Any] = {"models": [{"name": m["metadata"]["name"], "spec": m["spec"]} for m in manifests]}
        if lanes:
            values["lanes"] = lanes
        if any(host_paths(m) for m in manifests):  # Pod Security baseline, the chart's default, refuses them
            values["operator"] = {"backendPodSecurity": "privileged"}
        return yaml.safe_dump(values, sort_keys=False, width=120)
    docs = [{"apiVersion": API_VERSION, "kind": "GpuLane", "metadata": {"name": lane["name"]}, "spec": lane["spec"]}
            for lane in lanes]  # fmt: skip
    return yaml.safe_dump_all([*docs, *manifests], sort_keys=False, width=120)
