"""`gpulane import-llama-swap` (gpulane/importers/llama_swap.py) on a configuration in llama-swap's
documented format that uses every key (tests/unit/data/llama-swap-config.yaml)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulane.importers.llama_swap import NotLlamaSwap, command_words, convert, run

CONFIG = Path(__file__).parent / "data" / "llama-swap-config.yaml"
ENV = {"MODELS_DIR": "/srv/models"}
IMAGES = {"/app/llama-server": "ghcr.io/ggml-org/llama.cpp:server-cuda"}


def imported() -> tuple[dict[str, dict[str, Any]], list[str]]:
    manifests, warnings = convert(yaml.safe_load(CONFIG.read_text()), IMAGES, ENV)
    return {m["metadata"]["name"]: m for m in manifests}, warnings


def test_a_cmd_with_macros_becomes_the_serving_containers_command_and_args() -> None:
    models, _ = imported()
    spec = models["qwen-7b"]["spec"]
    assert spec["image"] == "ghcr.io/ggml-org/llama.cpp:server-cuda"  # --image /app/llama-server=...
    assert spec["command"] == ["/app/llama-server"]
    # ${PORT} is startPort; ${env.X}; comments dropped. Macros expand where they are defined, as llama-swap's
    # do: the global default_args took the global default_ctx, whatever the model's own default_ctx.
    assert spec["args"] == ["--port", "10001", "--model", "/srv/models/qwen2.5-7b.gguf", "--ctx-size", "4096",
                            "--temp", "0.7", "--parallel", "4", "--alias", "qwen-7b"]  # fmt: skip
    assert spec["port"] == 10001 and spec["readinessPath"] == "/health"
    assert spec["env"] == [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
                           {"name": "LLAMA_ARG_FLASH_ATTN", "value": "0.7"}]  # fmt: skip
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
    assert models["sdxl"]["spec"]["readinessPath"] == "/sdapi/v1/options"
    keys = [w.split(":", 1)[0] for w in warnings]
    for key in ("logLevel", "logTimeFormat", "logToStdout", "metricsMaxInMemory", "captureBuffer",
                "sendLoadingState", "includeAliasesInList", "globalTTL", "unloadTimeout", "apiKeys", "hooks",
                "groups", "upstream", "models.qwen-7b.ttl",
                "models.qwen-7b.filters", "models.qwen-7b.concurrencyLimit", "models.qwen-7b.name",
                "models.qwen-7b.description", "models.qwen-7b.unlisted", "models.qwen-7b.cmdStop",
                "models.qwen-7b.metadata", "models.qwen-7b.unloadTimeout", "models.sdxl.cmd",
                "models.sdxl.proxy"):  # fmt: skip
        assert keys.count(key) == 1, (key, warnings)
    assert all(len(w.split(": ", 1)[1]) > 10 for w in warnings), "each says why"


def test_the_command_prints_manifests_and_warns_on_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELS_DIR", "/srv/models")
    args = argparse.Namespace(config=CONFIG, image=["/app/llama-server=ghcr.io/ggml-org/llama.cpp:server-cuda"])
    assert run(args) == 0
    out, err = capsys.readouterr()
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out)] == ["qwen-7b", "qwen-coder-7b", "sdxl"]
    assert all(line.startswith("warning: ") for line in err.splitlines()) and "ttl" in err


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("just: text\n", "not a llama-swap configuration: it has no 'models' mapping"),
        ("models: [a, b]\n", "not a llama-swap configuration"),
        ("models: {m: {proxy: x}}\n", "models.m: cmd is required"),
        ("macros: {PORT: 1}\nmodels: {m: {cmd: x}}\n", "PORT is a reserved macro name"),
        ("models: {m: {cmd: 'x ${env.NOT_SET_HERE}'}}\n", "${env.NOT_SET_HERE} is not set in the environment"),
        ("models: {m: {cmd: 'docker run --rm'}}\n", "the docker run line names no image"),
        ("models: [\n", "while parsing"),
    ],
)
def test_a_file_that_is_not_a_llama_swap_configuration_fails_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    (path := tmp_path / "config.yaml").write_text(text)
    assert run(argparse.Namespace(config=path, image=[])) == 1
    out, err = capsys.readouterr()
    assert out == "" and says in err, err


def test_a_bad_image_mapping_is_refused() -> None:
    lines: list[str] = []
    assert run(argparse.Namespace(config=CONFIG, image=["nothing"]), warn=lines.append) == 2
    assert lines == ["error: --image 'nothing' is not PROGRAM=IMAGE"]


def test_commands_split_like_a_shell_without_their_comments() -> None:
    assert command_words("# first\n/app/x --a 'b c'   # trailing\n--d") == ["/app/x", "--a", "b c", "--d"]
    with pytest.raises(NotLlamaSwap):
        convert({"models": {"m": {"cmd": ""}}}, {})
