"""`gpulane import-llama-swap` (gpulane/importers/llama_swap.py) on a configuration in llama-swap's
documented format that uses every key (tests/unit/data/llama-swap-config.yaml)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulane.api.resources import GpuModelSpec
from gpulane.importers.llama_swap import Environment, NotLlamaSwap, add_arguments, command_words, convert, run

CONFIG = Path(__file__).parent / "data" / "llama-swap-config.yaml"
HF_TOKEN = "hf_secret_value_0123"
ENV = {"MODELS_DIR": "/srv/models", "HF_TOKEN": HF_TOKEN}
IMAGES = {"/app/llama-server": "ghcr.io/ggml-org/llama.cpp:server-cuda"}


def imported() -> tuple[dict[str, dict[str, Any]], list[str]]:
    environ = Environment(ENV, frozenset({"MODELS_DIR"}))
    manifests, warnings = convert(yaml.safe_load(CONFIG.read_text()), IMAGES, environ)
    return {m["metadata"]["name"]: m for m in manifests}, warnings


def cli(*argv: str) -> argparse.Namespace:
    """The command's arguments, parsed by its own parser."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_cmd_with_macros_becomes_the_serving_containers_command_and_args() -> None:
    models, _ = imported()
    spec = models["qwen-7b"]["spec"]
    assert spec["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda"  # --image /app/llama-server=...
    assert "command" not in spec, "the image's entrypoint is its server; the host's path means nothing there"
    # ${PORT} is startPort; ${env.X}; comments dropped. Macros expand where they are defined, as llama-swap's
    # do: the global default_args took the global default_ctx, whatever the model's own default_ctx.
    # --expand-env MODELS_DIR: a path, read from the importing shell; llama-server's loopback default moved.
    assert spec["args"] == ["--port", "10001", "--model", "/srv/models/qwen2.5-7b.gguf", "--ctx-size", "4096",
                            "--temp", "0.7", "--parallel", "4", "--alias", "qwen-7b", "--host", "0.0.0.0"]  # fmt: skip
    assert spec["port"] == 10001 and spec["readinessPath"] == "/health"
    assert spec["env"] == [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
                           {"name": "LLAMA_ARG_FLASH_ATTN", "value": "0.7"}]  # fmt: skip
    # HF_TOKEN=${env.HF_TOKEN}: from the Secret, on the serving container; its value is nowhere.
    # The weights' directory, mounted read-only where the cmd names it.
    assert spec["template"]["spec"] == {
        "containers": [
            {"name": "backend", "volumeMounts": [{"name": "host-0", "mountPath": "/srv/models", "readOnly": True}],
             "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "llama-swap-env",
                                                                         "key": "HF_TOKEN"}}}]}
        ],
        "volumes": [{"name": "host-0", "hostPath": {"path": "/srv/models", "type": "Directory"}}],
    }  # fmt: skip
    assert HF_TOKEN not in yaml.safe_dump(spec)
    assert spec["maxConcurrency"] == 4, "llama-server --parallel: its slots"
    assert spec["loadTimeoutSeconds"] == 500, "healthCheckTimeout"


def test_a_docker_run_line_gives_its_image_volumes_env_shm_and_container_port() -> None:
    models, warnings = imported()
    coder = models["qwen-coder-7b"]["spec"]
    [container] = coder["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda"
    assert container["args"] == ["-m", "/models/coder.gguf", "--port", "8080", "-np", "2"]
    assert container["env"] == [{"name": "HF_TOKEN", "value": "hf_abc"}]
    assert coder["template"]["spec"]["volumes"] == [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
        {"name": "vol-1", "hostPath": {"path": "/srv/models"}},
    ]
    assert {"name": "vol-1", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert coder["port"] == 8080 and coder["maxConcurrency"] == 2
    assert "readinessPath" not in coder  # checkEndpoint none: the default /health, with a warning
    for expected in (
        "models.Qwen/Coder-7B.cmd: volume 'hfcache:/cache': only host paths carry over",
        "models.Qwen/Coder-7B.cmd: --gpus all: the GPU is the lane's",
        "models.Qwen/Coder-7B.proxy: port 9000 is the host's; the pod is called on its container port 8080",
        "models.Qwen/Coder-7B.checkEndpoint: none: gpulane needs a readiness path",
        "models.Qwen/Coder-7B: named 'qwen-coder-7b': a GpuModel's name is a Kubernetes name; 'Qwen/Coder-7B' is",
    ):
        assert any(w.startswith(expected) for w in warnings), (expected, warnings)


def test_aliases_and_use_model_name_carry_over_and_a_renamed_model_keeps_its_name_as_an_alias() -> None:
    models, warnings = imported()
    qwen = models["qwen-7b"]["spec"]
    assert qwen["aliases"] == ["gpt-4o-mini"] and qwen["useModelName"] == "qwen2.5-7b-instruct"
    assert models["qwen-coder-7b"]["spec"]["aliases"][0] == "Qwen/Coder-7B", "clients keep calling it so"
    assert not any(".aliases" in w or ".useModelName" in w for w in warnings)
    assert (
        "upstream: the bridge skips the queue for these paths with --upstream-ignore-path '.*\\.(js|css)$'"
        in "\n".join(warnings)
    )


def test_every_key_that_does_not_carry_over_is_one_warning_line_saying_why() -> None:
    models, warnings = imported()
    assert models["sdxl"]["spec"]["image"] == "set-me/sd-server"
    assert models["sdxl"]["spec"]["args"] == ["--listen-ip", "0.0.0.0", "--listen-port", "10001"]
    assert models["sdxl"]["spec"]["readinessPath"] == "/sdapi/v1/options"
    keys = [w.split(":", 1)[0] for w in warnings]
    for key in ("logLevel", "logTimeFormat", "logToStdout", "metricsMaxInMemory", "captureBuffer",
                "sendLoadingState", "includeAliasesInList", "unloadTimeout", "apiKeys", "hooks",
                "groups", "upstream",
                "models.qwen-7b.concurrencyLimit", "models.qwen-7b.name",
                "models.qwen-7b.description", "models.qwen-7b.unlisted", "models.qwen-7b.cmdStop",
                "models.qwen-7b.metadata", "models.qwen-7b.unloadTimeout", "models.sdxl.proxy"):  # fmt: skip
        assert keys.count(key) == 1, (key, warnings)
    assert keys.count("models.sdxl.cmd") == 2, "no image; its loopback address"
    assert all(len(w.split(": ", 1)[1]) > 10 for w in warnings), "each says why"
    # filters carry over (issue 33): stripParams from llama-swap's comma-separated string, setParams as is.
    assert models["qwen-7b"]["spec"]["filters"] == {"stripParams": ["temperature", "top_p"], "setParams": {"top_k": 40}}
    # ttl carries over (issue 33): the model's own, else globalTTL, whose 0 is llama-swap's "never".
    assert models["qwen-7b"]["spec"]["ttlSeconds"] == 60
    assert "ttlSeconds" not in models["sdxl"]["spec"] and not [k for k in keys if "ttl" in k.lower()]


@pytest.mark.parametrize(
    ("own", "default", "expected", "warned"),
    [(None, 300, 300, False), (30, 300, 30, False), (0, 300, None, False), (None, None, None, False),
     (10**9, None, 604800, False), ("5m", None, None, True), (-1, None, None, True)],
)  # fmt: skip
def test_ttl_and_global_ttl_become_ttl_seconds(own: object, default: object, expected: int | None, warned: bool):
    model: dict[str, object] = {"cmd": "llama-server --port ${PORT} -m /srv/models/a.gguf"}
    if own is not None:
        model["ttl"] = own
    config: dict[str, object] = {"models": {"a": model}}
    if default is not None:
        config["globalTTL"] = default
    [manifest], warnings = convert(config, {"llama-server": "img"})
    assert manifest["spec"].get("ttlSeconds") == expected
    assert any(w.startswith("models.a.ttl") for w in warnings) == warned, warnings


def test_the_command_prints_manifests_and_warns_on_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELS_DIR", "/srv/models")
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    args = cli(str(CONFIG), "--image", "/app/llama-server=ghcr.io/ggml-org/llama.cpp:server-cuda",
               "--expand-env", "MODELS_DIR", "--runtime-class", "nvidia")  # fmt: skip
    assert run(args) == 0
    out, err = capsys.readouterr()
    models = list(yaml.safe_load_all(out))
    assert [d["metadata"]["name"] for d in models] == ["qwen-7b", "qwen-coder-7b", "sdxl"]
    assert all(m["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia" for m in models)
    *warnings, mounts, note = err.splitlines()
    assert all(line.startswith("warning: ") for line in warnings) and "concurrencyLimit" in err
    # hostPath weights: Pod Security baseline (the chart's default) refuses them, and the user is told.
    assert mounts.startswith("note: the models mount host paths (/srv/models)") and "privileged" in mounts
    # What the user runs to make the Secret: the names, read from their shell, never the values.
    assert note.startswith("note: create the Secret in the backend pods' namespace") and note.endswith(
        'kubectl create secret generic llama-swap-env -n gpulane-system-backends --from-literal=HF_TOKEN="$HF_TOKEN"'
    )
    assert HF_TOKEN not in out + err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("just: text\n", "not a llama-swap configuration: it has no 'models' mapping"),
        ("models: [a, b]\n", "not a llama-swap configuration"),
        ("models: {m: {proxy: x}}\n", "models.m: cmd is required"),
        ("macros: {PORT: 1}\nmodels: {m: {cmd: x}}\n", "PORT is a reserved macro name"),
        ("models: {m: {cmd: 'x ${env.NOT_SET_HERE}'}}\n", "${env.NOT_SET_HERE} is not set in the environment"),
        ("models: {m: {cmd: x, proxy: 'http://h:${env.P}'}}\n", "${env.P} in an address: give --expand-env P"),
        ("models: {m: {cmd: 'docker run --rm'}}\n", "the docker run line names no image"),
        ("models: [\n", "while parsing"),
    ],
)
def test_a_file_that_is_not_a_llama_swap_configuration_fails_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    (path := tmp_path / "config.yaml").write_text(text)
    assert run(cli(str(path), "--expand-env", "NOT_SET_HERE")) == 1
    out, err = capsys.readouterr()
    assert out == "" and says in err, err


def test_a_bad_image_mapping_is_refused() -> None:
    lines: list[str] = []
    assert run(cli(str(CONFIG), "--image", "nothing"), warn=lines.append) == 2
    assert lines == ["error: --image 'nothing' is not PROGRAM=IMAGE"]


def test_commands_split_like_a_shell_without_their_comments() -> None:
    assert command_words("# first\n/app/x --a 'b c'   # trailing\n--d") == ["/app/x", "--a", "b c", "--d"]
    with pytest.raises(NotLlamaSwap):
        convert({"models": {"m": {"cmd": ""}}}, {})


def one(cmd: str, *, expanded: frozenset[str] = frozenset(), runtime_class: str | None = None,
        roots: tuple[str, ...] = (), **raw: Any) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    environ = Environment({"SHM": "/dev/shm", "TOKEN": "tok-value-42"}, expanded)
    [manifest], warnings = convert({"models": {"m": {"cmd": cmd, **raw}}}, {}, environ, runtime_class, roots)
    return manifest["spec"], warnings


def mounted(spec: dict[str, Any]) -> list[str]:
    template = spec.get("template", {}).get("spec", {})
    paths = [v["hostPath"]["path"] for v in template.get("volumes", [])]
    mounts = [m["mountPath"] for c in template.get("containers", []) for m in c.get("volumeMounts", [])]
    assert paths == mounts and all(
        m["readOnly"] for c in template.get("containers", []) for m in c.get("volumeMounts", [])
    )
    return paths


@pytest.mark.parametrize(
    ("cmd", "roots", "paths"),
    [
        ("x -m /srv/models/a.gguf --mmproj=/srv/models/b.gguf", (), ["/srv/models"]),
        ("x --ckpt-dir /data/ckpt --vae /data/ckpt/sub/vae.safetensors", (), ["/data/ckpt"]),
        ("x -m /srv/models/qwen/a.gguf --lora /srv/loras/l.gguf", ("/srv",), ["/srv"]),
        ("x -m /srv/models/a.gguf --chat-template-file /app/t.jinja", ("/srv/models",), ["/srv/models"]),
        ("x --api-key ${env.TOKEN} --port 8080", (), []),
    ],
    ids=["files-of-one-dir", "dir-and-a-file-in-it", "one-root", "outside-the-root", "no-path"],
)
def test_host_paths_in_a_cmd_are_mounted_read_only_at_the_same_place(
    cmd: str, roots: tuple[str, ...], paths: list[str]
) -> None:
    spec, warnings = one(cmd, roots=roots)
    assert mounted(spec) == paths
    assert spec["args"] == command_words(cmd.replace("${env.TOKEN}", "$(TOKEN)"))[1:], "the command is unchanged"
    for path in paths:
        assert any(f"{path} is mounted read-only from the host" in w for w in warnings), warnings
    if roots and "/app/t.jinja" in cmd:
        assert any("/app/t.jinja is under no --weights-root: taken to be in the image" in w for w in warnings)


def test_a_cmd_path_in_the_hosts_own_places_is_not_mounted() -> None:
    spec, warnings = one("x --config /etc/server.conf -m /srv/m.gguf")
    assert mounted(spec) == ["/srv"]
    assert any("/etc/server.conf: mounting /etc refused" in w for w in warnings), warnings


@pytest.mark.parametrize("root", ["relative/dir", "/", "/var/run"])
def test_a_weights_root_that_is_not_a_place_for_weights_is_refused(root: str) -> None:
    lines: list[str] = []
    assert run(cli(str(CONFIG), "--weights-root", root), warn=lines.append) == 1
    assert f"--weights-root {root.rstrip('/') or '/'}: an absolute path that is not the host's own" in lines[0]


@pytest.mark.parametrize(
    ("cmd", "args"),
    [
        ("/bin/llama-server -m x.gguf --host 127.0.0.1", ["-m", "x.gguf", "--host", "0.0.0.0"]),
        ("/bin/llama-server --host=localhost", ["--host=0.0.0.0"]),
        ("whisper-server -m w.bin", ["-m", "w.bin", "--host", "0.0.0.0"]),
        ("/opt/sd-server -l 127.0.0.2 -m sd.gguf", ["-l", "0.0.0.0", "-m", "sd.gguf"]),
        ("sd-server -m sd.gguf", ["-m", "sd.gguf", "--listen-ip", "0.0.0.0"]),
        (
            "python3 -m sglang.launch_server --model-path q",
            ["-m", "sglang.launch_server", "--model-path", "q", "--host", "0.0.0.0"],
        ),
        ("vllm serve q --host ::1", ["serve", "q", "--host", "0.0.0.0"]),
    ],
    ids=["llama-server", "inline", "whisper-default", "sd-short", "sd-default", "sglang-default", "any-ipv6"],
)
def test_a_server_bound_to_loopback_is_bound_to_every_address_with_a_warning(cmd: str, args: list[str]) -> None:
    spec, warnings = one(cmd)
    assert spec["args"] == args
    assert [w for w in warnings if "0.0.0.0" in w], warnings


@pytest.mark.parametrize("cmd", ["/bin/llama-server --host 0.0.0.0", "vllm serve q", "/bin/x --host 10.0.0.5"])
def test_a_reachable_address_or_an_unknown_servers_default_is_left_alone(cmd: str) -> None:
    spec, warnings = one(cmd)
    assert spec["args"] == cmd.split()[1:] and not [w for w in warnings if "0.0.0.0" in w]


def test_a_docker_run_lines_loopback_argument_is_rewritten_too() -> None:
    spec, warnings = one("docker run img:1 --host 127.0.0.1 --port 8080")
    assert spec["template"]["spec"]["containers"][0]["args"] == ["--host", "0.0.0.0", "--port", "8080"]
    assert any("--host 127.0.0.1" in w for w in warnings)


def test_every_model_gets_the_runtime_class() -> None:
    spec, _ = one("/bin/llama-server --host 0.0.0.0", runtime_class="nvidia")
    assert spec["template"] == {"spec": {"runtimeClassName": "nvidia"}}
    spec, _ = one("docker run img:1", runtime_class="nvidia")
    assert spec["template"]["spec"]["runtimeClassName"] == "nvidia"


def test_env_in_a_command_a_macro_or_a_docker_line_is_read_from_the_secret_and_never_written() -> None:
    spec, warnings = one("x --api-key ${env.TOKEN} --shm ${env.SHM}", expanded=frozenset({"SHM"}))
    assert spec["args"] == ["--api-key", "$(TOKEN)", "--shm", "/dev/shm"]  # Kubernetes fills $(TOKEN) in
    ref = {"secretKeyRef": {"name": "llama-swap-env", "key": "TOKEN"}}
    assert spec["template"]["spec"]["containers"] == [{"name": "backend", "env": [{"name": "TOKEN", "valueFrom": ref}]}]
    assert "tok-value-42" not in yaml.safe_dump(spec)
    assert any("${env.TOKEN} is read from Secret llama-swap-env (key TOKEN)" in w for w in warnings)

    spec, warnings = one("docker run -e KEY=${env.TOKEN} img:1")
    assert spec["template"]["spec"]["containers"][0]["env"] == [{"name": "KEY", "valueFrom": ref}]
    assert any("${env.TOKEN} is read from Secret" in w for w in warnings)
    spec, _ = one("docker run -e KEY=${env.TOKEN} -e AUTH=Bearer_${env.TOKEN} img:1")
    [container] = spec["template"]["spec"]["containers"]
    assert container["env"] == [
        {"name": "TOKEN", "valueFrom": ref},  # defined first: AUTH's $(TOKEN) refers to it
        {"name": "KEY", "valueFrom": ref},
        {"name": "AUTH", "value": "Bearer_$(TOKEN)"},
    ]


def test_an_env_entry_of_the_secret_alone_reads_it_under_its_own_name() -> None:
    spec, _ = one("x", env=["API_KEY=${env.TOKEN}", "PLAIN=1"])
    assert spec["env"] == [{"name": "PLAIN", "value": "1"}]
    assert spec["template"]["spec"]["containers"][0]["env"] == [
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "llama-swap-env", "key": "TOKEN"}}}
    ]


@pytest.mark.parametrize(
    "volume", ["/:/host", "/var/run/docker.sock:/var/run/docker.sock", "/run/containerd:/c", "/etc/../etc:/e:ro",
               "/proc:/p", "/var/lib/kubelet/pods:/k"],
)  # fmt: skip
def test_a_docker_lines_mount_of_the_hosts_own_paths_is_refused_with_a_warning(volume: str) -> None:
    spec, warnings = one(f"docker run -v {volume} -v /srv/models:/models:ro img:1")
    assert spec["template"]["spec"]["volumes"] == [{"name": "vol-0", "hostPath": {"path": "/srv/models"}}]
    assert any(f"volume {volume!r} refused" in w for w in warnings), warnings


def test_values_print_the_charts_models_and_a_lane_on_the_node(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELS_DIR", "/srv/models")
    assert run(cli(str(CONFIG), "--expand-env", "MODELS_DIR", "--values", "--node", "gpu-0")) == 0
    values = yaml.safe_load(capsys.readouterr().out)
    assert [m["name"] for m in values["models"]] == ["qwen-7b", "qwen-coder-7b", "sdxl"]
    assert values["models"][0]["spec"]["port"] == 10001
    assert values["lanes"] == [{"name": "gpu-0", "spec": {"nodeName": "gpu-0"}}]
    assert run(cli(str(CONFIG), "--expand-env", "MODELS_DIR", "--node", "GPU_Box.1")) == 0
    first, *models = yaml.safe_load_all(capsys.readouterr().out)
    assert first == {"apiVersion": "gpulane.io/v1alpha1", "kind": "GpuLane", "metadata": {"name": "gpu-box.1"},
                     "spec": {"nodeName": "GPU_Box.1"}}  # fmt: skip
    assert len(models) == 3


def test_filters_leave_gpulanes_own_fields_alone_and_say_so() -> None:
    model = {"cmd": "llama-server --port ${PORT}",
             "filters": {"stripParams": "model, temperature,priority", "setParams": {"priority": 1, "seed": 7},
                         "other": 1}}  # fmt: skip
    [manifest], warnings = convert({"models": {"a": model}}, {"llama-server": "img"})
    assert manifest["spec"]["filters"] == {"stripParams": ["temperature"], "setParams": {"seed": 7}}
    where = sorted(w.split(":", 1)[0] for w in warnings if w.startswith("models.a.filters"))
    assert where == ["models.a.filters.other", "models.a.filters.setParams", "models.a.filters.stripParams"]
    GpuModelSpec.model_validate(manifest["spec"])  # what the importer writes, the CRD's model takes
