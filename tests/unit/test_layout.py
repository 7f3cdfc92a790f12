"""The package's shape, as the architecture promises it (docs/architecture.md): checked from the imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpulane"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the gpulane modules it imports (at any level, type-checking imports included)."""
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpulane"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("gpulane")}
        out[name] = {m for m in found if m in modules and m != name}
    return out


def test_no_module_outside_the_operator_imports_it():
    offenders = {
        (name, target)
        for name, targets in _imports().items()
        for target in targets
        if target.startswith("gpulane.operator") and not name.startswith("gpulane.operator")
    }
    assert offenders == set()


def test_the_core_imports_only_the_core():
    offenders = {
        (name, target)
        for name, targets in _imports().items()
        if name.startswith("gpulane.core")
        for target in targets
        if not target.startswith("gpulane.core")
    }
    assert offenders == set()


def test_there_are_no_import_circles():
    graph = _imports()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_outside_the_core_the_dispatcher_is_read_only_through_its_public_reads():
    """The core is the one holder of what runs where: the shells read it through ``lane_state``, ``on_lane``,
    ``placed``, ``pending``, ``score``... and never reach into its lanes, ranking or model catalog."""
    internals = {"lanes", "ranking", "models", "history", "_effects"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "core"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in internals:
                owner = node.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name == "dispatcher":
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} dispatcher.{node.attr}")
    assert offenders == []


def test_the_controller_is_a_router_of_a_few_hundred_lines():
    assert len((PACKAGE / "operator" / "controller.py").read_text().splitlines()) < 400


def test_no_room_is_handed_the_controller():
    """Each room gets its ports (the reads it needs, the effects it asks for), never ``self``: a room that held the
    controller could reach any part of it."""
    tree = ast.parse((PACKAGE / "operator" / "controller.py").read_text())
    offenders = [
        f"controller.py:{node.lineno} {ast.unparse(node.func)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) != "setattr"
        for arg in [*node.args, *(k.value for k in node.keywords)]
        if isinstance(arg, ast.Name) and arg.id == "self"
    ]
    assert offenders == []


def test_simulate_loads_none_of_the_cluster_libraries():
    """``gpulane simulate`` imports only the core: kopf, kubernetes and aiohttp stay unloaded."""
    probe = (
        "import sys\n"
        "from gpulane.cli import build_parser\n"
        "build_parser('simulate')\n"
        "print(','.join(sorted(m for m in ('kopf', 'kubernetes', 'aiohttp') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_each_field_of_a_jobs_view_has_one_writer():
    """Where a job is (JobTable's moves), what its object says (JobWrites, once a write landed; ``observe``
    for what an event tells) and whether an end is in flight (the controller) are each written in one module."""
    from dataclasses import fields

    from gpulane.operator.job_table import JobView

    owners = {
        **dict.fromkeys(("state", "decision", "dispatched_at", "started_at", "woke_at"), "operator/job_table.py"),
        **dict.fromkeys(("api_phase", "conditions", "written", "announced"), "operator/job_writes.py"),
        **dict.fromkeys(("finalizers", "executor_lease"), "operator/job_table.py"),  # JobView.observe
        "ending": "operator/controller.py",
    }
    names = {f.name for f in fields(JobView)}
    writers: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if not isinstance(t, ast.Attribute) or t.attr not in names:
                        continue
                    owner = getattr(t.value, "id", "")
                    # ``self``: JobView's own methods (another class's attribute of the same name elsewhere)
                    if owner in ("view", "v") or (owner == "self" and path.name == "job_table.py"):
                        writers.setdefault(t.attr, set()).add(str(path.relative_to(PACKAGE)))
    assert {field: sorted(paths) for field, paths in writers.items()} == {field: [owners[field]] for field in writers}
    assert set(writers) == set(owners)  # every owned field is written somewhere, so the table above is alive
