"""The chart's ``values.schema.json``: hand-written, except the specs of the resources the chart creates.

``$defs`` GpuLaneSpec, GpuModelSpec and GpuPolicySpec are the CRDs' own schemas (``crd.structural_schema``)
turned into JSON Schema 2020-12, which Helm checks values against: a bad field in ``lanes``, ``models`` or
``policy.spec`` fails ``helm install`` with the field's path, instead of reaching the apiserver (or being
pruned there without a word). ``make crds`` writes them; ``--check`` is the drift test's.

    python -m gpulane.api.values_schema [--check] [FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpulane.api import crd, generated
from gpulane.api.kinds import KINDS

DEFAULT_FILE = Path("charts/gpulane/values.schema.json")
GENERATED = {k.spec.__name__: k for k in KINDS if k.kind in ("GpuLane", "GpuModel", "GpuPolicy")}


def json_schema(node: Any) -> Any:
    """One structural (OpenAPI v3.0) node as JSON Schema 2020-12. CEL rules stay with the apiserver; an
    object with known properties refuses others, which the apiserver would prune silently, unless the CRD
    keeps its unknown fields."""
    if isinstance(node, list):
        return [json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in (crd.VALIDATIONS, crd.PRESERVE, crd.INT_OR_STRING):
            continue
        if key == "properties":
            out[key] = {name: json_schema(child) for name, child in value.items()}
        elif key in ("default", "enum"):
            out[key] = value
        elif key in crd.EXCLUSIVE and value is True:  # v3.0's boolean form: the bound is in minimum/maximum
            out[key] = node[crd.EXCLUSIVE[key]]
        else:
            out[key] = json_schema(value)
    for key, bound in crd.EXCLUSIVE.items():
        if node.get(key) is True:
            out.pop(bound, None)
    if node.get(crd.INT_OR_STRING):
        out["type"] = ["integer", "string"]
    # A node that keeps unknown fields (a template's PodSpec and containers: every Kubernetes field) takes
    # them in values too; any other object with known properties refuses the rest.
    if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = bool(node.get(crd.PRESERVE))
    return out


def render(current: dict[str, Any]) -> dict[str, Any]:
    """The schema with its generated ``$defs`` replaced; every other part is kept as written."""
    defs = dict(current.get("$defs", {}))
    for name, kind in GENERATED.items():
        defs[name] = json_schema(crd.structural_schema(kind.spec))
    return {**current, "$defs": defs}


def dumps(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulane.api.values_schema", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if FILE is not up to date")
    parser.add_argument("file", nargs="?", default=DEFAULT_FILE, type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    path: Path = args.file
    wanted = dumps(render(json.loads(path.read_text())))
    remedy = "the generated $defs differ from the models; run `make crds`"
    return generated.sync({path: wanted}, check=args.check, remedy=remedy)


if __name__ == "__main__":
    sys.exit(main())
