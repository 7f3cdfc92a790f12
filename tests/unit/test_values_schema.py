"""The chart's values.schema.json: its generated $defs are current with the models, and the conversion from
the CRDs' OpenAPI v3.0 to JSON Schema keeps each bound. Helm's refusals are tested in tests/e2e/test_chart.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpulane.api import values_schema

SCHEMA = Path(__file__).resolve().parents[2] / "charts" / "gpulane" / "values.schema.json"


def test_the_committed_schema_is_current() -> None:
    assert values_schema.main(["--check", str(SCHEMA)]) == 0, "run `make crds`"


def test_check_reports_drift_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "values.schema.json"
    shutil.copy(SCHEMA, copy)
    schema = json.loads(copy.read_text())
    del schema["$defs"]["GpuModelSpec"]["properties"]["port"]
    schema["$defs"]["mine"] = {"type": "string"}  # a hand-written definition
    copy.write_text(json.dumps(schema))
    assert values_schema.main(["--check", str(copy)]) == 1
    assert "make crds" in capsys.readouterr().err
    assert values_schema.main([str(copy)]) == 0
    written = json.loads(copy.read_text())
    assert written["$defs"]["GpuModelSpec"]["properties"]["port"]["minimum"] == 1
    assert written["$defs"]["mine"] == {"type": "string"}  # kept
    assert written["properties"] == schema["properties"]


def test_openapi_nodes_become_json_schema() -> None:
    node = {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
            "priority": {"x-kubernetes-int-or-string": True, "x-kubernetes-validations": [{"rule": "true"}]},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    assert values_schema.json_schema(node) == {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "priority": {"type": ["integer", "string"]},
            "free": {"type": "object"},
        },
        "additionalProperties": False,  # the apiserver would prune an unknown field without a word
    }


def test_an_object_that_keeps_unknown_fields_in_the_crd_takes_them_in_values() -> None:
    """A template's PodSpec and containers keep every Kubernetes field in the CRD: values must take them too
    (runtimeClassName, volumes, env from a Secret), or docs/models.md's own examples fail `helm install`."""
    node = {"type": "object", "properties": {"name": {"type": "string"}}, "x-kubernetes-preserve-unknown-fields": True}
    assert values_schema.json_schema(node)["additionalProperties"] is True
    schema = json.loads(SCHEMA.read_text())
    template = schema["$defs"]["GpuModelSpec"]["properties"]["template"]["properties"]
    assert template["spec"]["additionalProperties"] is True
    assert template["spec"]["properties"]["containers"]["items"]["additionalProperties"] is True
    assert template["metadata"]["additionalProperties"] is False, "a template's metadata stays closed"
