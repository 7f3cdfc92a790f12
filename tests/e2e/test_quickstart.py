"""The first day on a GPU box (issue 33), as docs/quickstart-gpu.md tells it: its shell blocks run in order on
the real node gpu-0, then the real ``openai`` client calls the bridge on the node's address.

A llama-swap configuration as users write it (llama-server bound to loopback, its weights in a host
directory named in the ``cmd``, a token from the environment, a ``ttl``) is imported with ``--values``,
installed with the chart and its single-node profile, and the imported model, the real llama-server built
for the suite, reads its weights from the hostPath and answers; ``ttl`` gives the GPU back and the next call
loads it again. The doc's commands run as written, with the substitutions its introduction names (the
doc's namespace, weights directory, llama.cpp's image, node name and ttl; ``sudo`` dropped; ``k3s ctr`` the
local node's ctr). Blocks marked ``dry-run`` are applied with ``--dry-run=server``; those marked ``not
tested here`` are skipped, and say why in the doc.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import yaml
from kubernetes import client

from .support import REPO, Cluster, localcluster, wait_until
from .test_real_backends import CONTEXT, Llama, llama  # noqa: F401  (the module's llama-server fixture)
from .tiny_gguf import write_tiny_model

pytestmark = pytest.mark.e2e("gpu-0")

DOC = REPO / "docs" / "quickstart-gpu.md"
BLOCK = re.compile(r"<!-- quickstart: (run|dry-run|not tested here[^>]*) -->\n```sh\n(.*?)```", re.S)
DOC_NAMESPACE = "gpulane-system"
DOC_WEIGHTS = "/srv/models"
DOC_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-cuda"
WEIGHTS_FILE = "qwen2.5-0.5b-instruct-q4_k_m.gguf"
APP_KEY = "sk-app-change-this-0002"  # the doc's keys.yaml
TOKEN = "hf_quickstart_token_value_77"
RELEASE = "gpulane"


Section = tuple[str, list[tuple[str, str]]]


def sections() -> list[Section]:
    """The doc's sections (its ## headings) and each one's marked shell blocks, in order: (mode, text)."""
    found = []
    for part in re.split(r"^## ", DOC.read_text(), flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        found.append((title, [(m[1], m[2]) for m in BLOCK.finditer(body)]))
    return found


def script(blocks: list[tuple[str, str]], substitutions: dict[str, str]) -> str:
    """The blocks to run, as one bash script: run blocks as written, dry-run blocks' applies server-side."""
    lines = ["set -euxo pipefail"]
    for mode, text in blocks:
        if mode.startswith("not tested"):
            continue
        for old, new in substitutions.items():
            text = text.replace(old, new)
        if mode == "dry-run":
            text = re.sub(r"^kubectl apply (.*)$", r"kubectl apply --dry-run=server \1", text, flags=re.M)
        lines.append(text)
    return "\n".join(lines) + "\n"


@dataclass
class Box:
    """Where the doc's commands run: the release's namespace, the working directory, the doc's words as the
    local cluster says them, and the shell's environment."""

    namespace: str
    dir: Path
    substitutions: dict[str, str]
    env: dict[str, str]


@pytest.fixture
def box(cluster: Cluster, llama: Llama, tmp_path: Path) -> Iterator[Box]:  # noqa: F811
    """The doc's working directory, its substitutions and its environment: the repository's files it names,
    a tiny GGUF under the doc's weights file name, and ``k3s ctr`` as the local node's ctr."""
    for name in ("charts", "deploy", "examples", "hack", ".venv"):
        (tmp_path / name).symlink_to(REPO / name)
    weights = tmp_path / "models"
    weights.mkdir()
    weights.chmod(0o755)
    vocabulary = localcluster.llama_server.built_dir() / localcluster.llama_server.VOCAB
    write_tiny_model(vocabulary, weights / WEIGHTS_FILE, seed=3, context=CONTEXT)
    shims = tmp_path / "shims"
    shims.mkdir()
    ctr = " ".join(localcluster.node.ctr_command(cluster.bindir))
    (shims / "k3s").write_text(f'#!/bin/sh\n[ "$1" = ctr ] || exit 64\nshift\nexec {ctr} -n k8s.io "$@"\n')
    (shims / "k3s").chmod(0o755)
    namespace = f"qs-{uuid.uuid4().hex[:6]}"
    # A fresh box has no GpuPolicy; the release creates "default" (another test's would stop the install).
    cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")
    substitutions = {
        DOC_NAMESPACE: namespace,  # gpulane-system-backends becomes <namespace>-backends with it
        DOC_WEIGHTS: str(weights),
        DOC_IMAGE: llama.image,
        "$(hostname)": localcluster.GPU_NODE,
        "ttl: 60": "ttl: 6",
        "sudo ": "",
    }
    env = {**cluster.env(), "PATH": f"{shims}:{cluster.bindir}:{REPO / '.venv' / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
           "KUBECONFIG": str(cluster.kubeconfig), "HF_TOKEN": TOKEN}  # fmt: skip
    try:
        yield Box(namespace, tmp_path, substitutions, env)
    finally:
        cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "120s", check=False)
        cluster.kubectl("delete", "namespace", namespace, f"{namespace}-backends", "--ignore-not-found",
                        "--wait=false")  # fmt: skip


def run_sections(box: Box, titles: list[Section], before: list[Section] | None = None) -> str:
    """Run the sections' blocks; the shell variables that ``before`` set (NODE=..., BOX=...) carry over, as
    in the one terminal the doc is read in."""
    earlier = [b for _, blocks in before or [] for b in blocks if b[0] == "run"]
    assigned = [("run", line) for _, text in earlier for line in re.findall(r"^[A-Z][A-Z_]*=.*$", text, re.M)]
    text = script([*assigned, *(b for _, blocks in titles for b in blocks)], box.substitutions)
    proc = subprocess.run(["bash", "-c", text], cwd=box.dir, env=box.env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, f"the quickstart's commands failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


@pytest.mark.timeout(1200)  # on a machine where `make test` did not build llama-server first: its build
def test_the_quickstart_is_the_first_day(
    cluster: Cluster, core_v1: client.CoreV1Api, api_client: client.ApiClient, box: Box, no_operator: None
) -> None:
    custom_objects = client.CustomObjectsApi(api_client)
    parts = sections()
    titles = [t for t, _ in parts]
    first, rest = parts[: titles.index("8. The GPU given back")], parts[titles.index("8. The GPU given back") :]
    assert [t for t, blocks in first if any(m == "run" for m, _ in blocks)], "the doc has no runnable block"
    out = run_sections(box, first)
    backends = f"{box.namespace}-backends"

    # Step 7's curl streamed an answer from llama-server, through the bridge on the node's address.
    assert "data: " in out and "data: [DONE]" in out, out[-2000:]
    node = core_v1.read_node(localcluster.GPU_NODE)
    address = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    bridge = openai.OpenAI(base_url=f"http://{address}:30890/v1", api_key=APP_KEY, max_retries=0, timeout=120)

    # The model as imported: its server bound where a pod is reached, its weights from the host directory,
    # its token from the Secret and in no manifest.
    model = custom_objects.get_cluster_custom_object("gpulane.io", "v1alpha1", "gpumodels", "qwen")
    assert TOKEN not in yaml.safe_dump(model) and "--host" in model["spec"]["args"]
    assert model["spec"]["args"][model["spec"]["args"].index("--host") + 1] == "0.0.0.0"
    [pod] = core_v1.list_namespaced_pod(backends, label_selector="gpulane.io/lane=gpu-0").items
    assert pod.spec.runtime_class_name == "nvidia" and pod.spec.node_name == localcluster.GPU_NODE
    assert [v.host_path.path for v in pod.spec.volumes if v.host_path] == [box.substitutions[DOC_WEIGHTS]]
    token = next(e for e in pod.spec.containers[0].env if e.name == "HF_TOKEN")
    assert token.value is None and token.value_from.secret_key_ref.name == "llama-swap-env"
    first_pod = pod.metadata.uid

    # An alias through the real client, streamed; then the model idle past its ttl gives the GPU back.
    hello = [{"role": "user", "content": "hello"}]
    stream = bridge.chat.completions.create(model="gpt-4o-mini", stream=True, max_tokens=8, messages=hello,
                                            extra_body={"ignore_eos": True})  # fmt: skip
    assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content) >= 1
    wait_until(lambda: not core_v1.list_namespaced_pod(backends, label_selector="gpulane.io/lane=gpu-0").items,
               timeout=90, what="the model's pod stopped after its ttl")  # fmt: skip

    def unloaded() -> dict[str, str] | None:
        lane = custom_objects.get_cluster_custom_object("gpulane.io", "v1alpha1", "gpulanes", "gpu-0")
        ready = next((c for c in (lane.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})
        return ready if ready.get("reason") == "NoModel" else None

    ready = wait_until(unloaded, timeout=30, what="the lane's Ready condition: NoModel after the ttl")
    assert ready["status"] == "False" and "ttlSeconds" in ready["message"], ready

    # The next call loads it again, in a new pod.
    answer = bridge.chat.completions.create(model="qwen", max_tokens=8, extra_body={"ignore_eos": True},
                                            messages=[{"role": "user", "content": "again"}])  # fmt: skip
    assert answer.choices[0].message.content
    [again] = core_v1.list_namespaced_pod(backends, label_selector="gpulane.io/lane=gpu-0").items
    assert again.metadata.uid != first_pod

    # Step 8 lists the ModelUnloaded Event and unloads with the admin key; step 9 dry-runs ComfyUI's film.
    out = run_sections(box, rest, before=first)
    assert "ModelUnloaded" in out and "OK" in out, out[-2000:]
    assert "gpumodel.gpulane.io/comfyui created (server dry run)" in out
    assert "gpuchain.gpulane.io/film created (server dry run)" in out
