"""The demo's release of the chart: policy, the lane on gpu-0, two models, the bridge with two API keys,
and admission (the apiserver's policies on this Kubernetes, or the webhook), all for one namespace that
admission alone selects (the cluster's other namespaces, a test's say, never meet its refusals)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .plan import KEYS, MODELS

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpulane"
NAMESPACE = RELEASE = "gpulane-demo"
SELECTOR = "gpulane.io/demo"
LANE = "gpu-0"
IMAGE = "gpulane.local/gpulane:dev"
BRIDGE_PORT = 8090
UI_PORT = 8092


class Tools:
    """kubectl and helm from the cluster's tools, with its admin kubeconfig."""

    def __init__(self, bindir: Path, kubeconfig: Path) -> None:
        self.bindir, self.kubeconfig = bindir, kubeconfig

    def run(self, tool: str, *args: str, stdin: str | None = None, check: bool = True) -> str:
        argv = [str(self.bindir / tool), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=600, check=False)
        if check and proc.returncode:
            raise RuntimeError(f"{tool} {' '.join(args)}: {(proc.stderr or proc.stdout).strip()}")
        return proc.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.run("kubectl", "get", *args, "-o", "json"))


def values(admin: str) -> dict[str, Any]:
    """The chart's values for the demo. The admin (kubectl's user) may set the film's member and tier."""
    models = [
        {
            "name": name,
            "spec": {
                "image": IMAGE,
                "args": [
                    "fake-backend",
                    "--host",
                    "0.0.0.0",
                    "--port",
                    "8000",
                    "--model",
                    name,
                    "--load-seconds",
                    f"{load:g}",
                    "--request-seconds",
                    f"{run:g}",
                ],
                "port": 8000,
                "readinessPath": "/health",
                "expectedLoadSeconds": round(load) + 4,  # the pod's own start on the node, measured
                "expectedRunSeconds": round(run),
            },
        }
        for name, (load, run) in MODELS.items()
    ]
    keys = [{"name": k.name, "key": k.key, "member": k.member, "tier": k.tier, "maxPriority": k.max_priority}
            for k in KEYS]  # fmt: skip
    return {
        "policy": {
            "spec": {
                "admission": {
                    "trusted": {"users": [admin]},
                    "rules": [{"name": "demo-admin", "users": [admin], "maxPriority": 100}],
                }
            }
        },
        "lanes": [{"name": LANE, "spec": {"nodeName": LANE}}],
        "models": models,
        "webhook": {"namespaceSelector": {SELECTOR: "true"}},
        "bridge": {
            "enabled": True,
            "port": BRIDGE_PORT,
            "executeNamespaces": [NAMESPACE],
            "keys": {"inline": {"keys": keys}},
        },
        "ui": {"enabled": True, "port": UI_PORT},
    }


def foreign(tools: Tools) -> list[str]:
    """Objects the release would create that exist outside it (from `kubectl apply -f examples/`, say)."""
    found = []
    # Full names: `gpulane` alone is also the category of every gpulane kind.
    kinds = [("gpulanes.gpulane.io", LANE), *(("gpumodels.gpulane.io", m) for m in MODELS)]
    for kind, name in [*kinds, ("gpupolicies.gpulane.io", "default")]:
        out = tools.run("kubectl", "get", kind, name, "-o", "json", "--ignore-not-found")
        if out.strip():
            owner = json.loads(out)["metadata"].get("annotations", {}).get("meta.helm.sh/release-name")
            if owner != RELEASE:
                found.append(f"{kind}/{name}")
    return found


def install(tools: Tools, work: Path, admin: str) -> None:
    # The chart's CRDs first, as docs/chart.md's upgrade says: Helm installs crds/ only once, never newer ones.
    crds = tools.run("helm", "show", "crds", str(CHART))
    tools.run("kubectl", "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=crds)
    names = [f"crd/{plural}.gpulane.io" for plural in ("gpujobs", "gpulanes", "gpumodels", "gpupolicies")]
    tools.run("kubectl", "wait", "--for=condition=Established", *names, "--timeout=60s")
    clash = foreign(tools)
    if clash:
        raise RuntimeError(
            f"{', '.join(clash)} already exist and are not the demo's; delete them (`kubectl delete -f "
            "examples/`, `kubectl delete gpupolicy default`) or start afresh with `make cluster-down`"
        )
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {SELECTOR: "true"}}}
    tools.run("kubectl", "apply", "-f", "-", stdin=json.dumps(namespace))
    (values_file := work / "values.yaml").write_text(yaml.safe_dump(values(admin)))
    tools.run("helm", "upgrade", "--install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_file),
              "--wait", "--timeout", "300s")  # fmt: skip


def remove(tools: Tools) -> None:
    """Uninstall the release and its namespace (the suite does this before it starts: the demo's operator
    would act on the tests' lanes)."""
    tools.run("helm", "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s", "--ignore-not-found")
    # The release's operator is gone, and with it whoever would take its finalizer off the demo's jobs: a
    # demo stopped mid-play (Ctrl-C, a killed test) left its namespace Terminating for good without this.
    for job in tools.run("kubectl", "get", "gpujobs", "-n", NAMESPACE, "-o", "name", "--ignore-not-found").split():
        tools.run("kubectl", "patch", job, "-n", NAMESPACE, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                  check=False)  # fmt: skip
    tools.run("kubectl", "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s")


def bridge_url(tools: Tools) -> str:
    service = tools.get("service", f"{RELEASE}-bridge", "-n", NAMESPACE)
    return f"http://{service['spec']['clusterIP']}:{BRIDGE_PORT}/v1"


def ui_url(tools: Tools) -> str:
    """The web page, on its Service's address (this host is the node: the address answers here)."""
    service = tools.get("service", f"{RELEASE}-ui", "-n", NAMESPACE)
    return f"http://{service['spec']['clusterIP']}:{UI_PORT}/"
