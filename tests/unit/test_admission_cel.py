"""The admission rules as CEL (gpulane/admission/cel.py): the committed manifests are current, and they are
built from the models. Whether the apiserver agrees with the webhook is tests/e2e/test_admission_policies.py's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpulane.admission import cel
from gpulane.api.resources import GpuJobStatus

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpulane" / "templates" / "admission-policies.yaml"


def test_the_committed_manifests_are_what_the_generator_writes() -> None:
    assert cel.main(["--check"]) == 0, "run `python -m gpulane.admission.cel` (make crds)"


def test_the_check_fails_on_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "admission-policies.yaml"
    stale.write_text("# an older rendering\n")
    monkeypatch.setattr(cel, "DEPLOY", stale)
    monkeypatch.setattr(cel, "REPO", tmp_path)
    assert cel.main(["--check"]) == 1


def test_every_policy_has_its_binding_and_only_the_job_rules_take_the_namespace_selector() -> None:
    docs = cel.manifests("x", ("system:serviceaccount:ops:op",), {"team": "a"})
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert kinds == [
        ("MutatingAdmissionPolicy", "x-job-defaults"),
        ("MutatingAdmissionPolicyBinding", "x-job-defaults"),
        ("ValidatingAdmissionPolicy", "x-job-rules"),
        ("ValidatingAdmissionPolicyBinding", "x-job-rules"),
        ("ValidatingAdmissionPolicy", "x-status-outcomes"),
        ("ValidatingAdmissionPolicyBinding", "x-status-outcomes"),
        ("ValidatingAdmissionPolicy", "x-policy-rules"),
        ("ValidatingAdmissionPolicyBinding", "x-policy-rules"),
    ]
    bindings = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"].endswith("Binding")}
    # Caps never lapse: without GpuPolicy default, creates are refused.
    for name in ("x-job-defaults", "x-job-rules"):
        assert bindings[name]["paramRef"] == {"name": "default", "parameterNotFoundAction": "Deny"}
        assert bindings[name]["matchResources"] == {"namespaceSelector": {"matchLabels": {"team": "a"}}}
    assert "matchResources" not in bindings["x-policy-rules"]  # GpuPolicies are cluster-scoped
    assert bindings["x-job-rules"]["validationActions"] == ["Deny"]
    status = next(
        d["spec"] for d in docs if d["metadata"]["name"] == "x-status-outcomes" and "validations" in d["spec"]
    )
    conditions = {c["name"]: c["expression"] for c in status["matchConditions"]}
    assert conditions["not-the-operator"] == '!(request.userInfo.username in ["system:serviceaccount:ops:op"])'
    # GpuChains are admitted as jobs are; the operator's chain steps pass as it made them.
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if not d["kind"].endswith("Binding")}
    for name in ("x-job-defaults", "x-job-rules"):
        assert policies[name]["matchConstraints"]["resourceRules"][0]["resources"] == ["gpujobs", "gpuchains"]
        # Not a match condition: each costs the apiserver an activation of its own per request.
        assert "matchConditions" not in policies[name]
        operators = policies[name]["variables"][0]
        assert operators == {"name": "operators", "expression": '["system:serviceaccount:ops:op"]'}
    assert policies["x-job-defaults"]["mutations"][0]["applyConfiguration"]["expression"].startswith(
        "variables.chainStep ? Object{} : "
    )
    # One validation: the apiserver evaluates each validation's messageExpression on every request.
    (rules,) = policies["x-job-rules"]["validations"]
    assert rules["expression"].startswith("(request.operation != 'UPDATE' || request.resource.resource != 'gpuchains'")
    assert ") && (variables.skip || (" in rules["expression"], "a chain's author holds whatever the spec does"


def test_folded_rules_hold_together_and_name_the_first_one_broken() -> None:
    rules = [{"expression": e, "messageExpression": m, "reason": "Forbidden"} for e, m in
             (("a > 1", "'small a'"), ("b", "'no b'"), ("c == 2", "'c is ' + string(c)"))]  # fmt: skip
    assert cel._folded(rules) == {
        "expression": "variables.skip || ((a > 1) && (b) && (c == 2))",
        "messageExpression": "!(a > 1) ? ('small a') : !(b) ? ('no b') : 'c is ' + string(c)",
        "reason": "Forbidden",
    }


def test_the_status_rule_names_every_status_field_but_the_outcomes() -> None:
    """A status field added to the model is guarded at once: only an executor's outcome fields are free."""
    text = yaml.safe_dump(cel.status_outcomes())
    for field in GpuJobStatus.model_fields.values():
        name = field.alias or ""
        guarded = f"'status.{name}'" in text
        assert guarded == (name not in {"phase", "finishedAt", "reason", "message", "result"}), name


def test_the_chart_installs_each_generated_policy_by_name() -> None:
    listed = re.search(r'range \$key := list ((?:"[a-z-]+" ?)+)', CHART.read_text())
    assert listed is not None
    assert re.findall(r'"([a-z-]+)"', listed[1]) == list(cel.specs())
    assert yaml.safe_load(cel.CHART_FILE.read_text().split("\n", 1)[1]) == cel.specs()


def test_the_cli_prints_the_manifests_for_another_operator(capsys: pytest.CaptureFixture[str]) -> None:
    from gpulane.cli import main

    assert main(["admission-policies", "--operator-user", "system:serviceaccount:a:b", "--name", "n"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert len(docs) == 8 and docs[0]["metadata"]["name"] == "n-job-defaults"
    assert "system:serviceaccount:a:b" in yaml.safe_dump(docs[4])
