"""The suite's groups (tests/suite_groups.py, docs/development.md): a small suite in pytester, with the root
conftest's own hooks, run with xdist workers; each test writes down which worker ran it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]
QUIET = ("-p", "no:hypothesispytest", "-p", "no:anyio", "-p", "no:cacheprovider")

RECORD = """
import os
from pathlib import Path

import pytest

def ran(name):
    with open(Path(__file__).parent / "ran.log", "a") as log:
        log.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {name} {os.nice(0)}\\n")
"""


def module(marker: str, stem: str, count: int, *, last: bool = False) -> str:
    lines = [RECORD, f"pytestmark = {marker}" if marker else ""]
    lines.append("@pytest.fixture(scope='module')\ndef once():\n    ran('setup')\n")
    for i in range(count):
        if last and i == count - 1:
            lines.append("@pytest.mark.last")
        lines.append(f"def test_{stem}{i}(once):\n    ran('{stem}{i}')\n")
    return "\n".join(lines)


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """The serial group (three tests, the last one ``last``), two modules of the parallel groups and plain tests."""
    pytester.makeini("[pytest]\nmarkers =\n    e2e(group): a cluster\n    last: last\n")
    (pytester.path / "suite_groups.py").write_text((TESTS / "suite_groups.py").read_text())
    last_hook = (
        "def pytest_collection_finish(session):\n"
        "    session.items.sort(key=lambda i: i.get_closest_marker('last') is not None)\n"
    )
    pytester.makeconftest((TESTS / "conftest.py").read_text() + "\n\n" + last_hook)
    pytester.makepyfile(
        test_serial=module('pytest.mark.e2e("gpu-0")', "serial", 3, last=True),
        test_kwok_a=module('pytest.mark.e2e("kwok")', "a", 3),
        test_kwok_b=module('pytest.mark.e2e("kwok")', "b", 3),
        test_plain=module("", "plain", 6),
    )
    pytester.syspathinsert()
    return pytester


def ran(suite: pytest.Pytester) -> list[tuple[str, str, str]]:
    """(worker, module, test) in the order each worker ran them."""
    out = []
    for line in (suite.path / "ran.log").read_text().splitlines():
        worker, name, _nice = line.split()
        out.append((worker, name))
    return [(w, n.rstrip("0123456789"), n) for w, n in out]


def test_the_serial_group_runs_on_gw0_in_order_and_each_parallel_module_on_one_other_worker(
    suite: pytest.Pytester,
) -> None:
    result = suite.runpytest_subprocess(*QUIET, "-n", "3")
    result.assert_outcomes(passed=15)
    record = ran(suite)
    serial = [(w, n) for w, stem, n in record if stem == "serial"]
    assert serial == [("gw0", "serial0"), ("gw0", "serial1"), ("gw0", "serial2")], record
    for stem in ("a", "b"):
        workers = {w for w, s, _ in record if s == stem}
        assert len(workers) == 1 and "gw0" not in workers, (stem, record)
    # Each parallel module is set up once, on its one worker.
    setups = [w for w, s, _ in record if s == "setup"]
    plain_workers = {w for w, s, _ in record if s == "plain"}
    assert len(setups) == 1 + 2 + len(plain_workers), record


def test_one_worker_runs_everything_and_the_serial_group_last(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(*QUIET, "-n", "1")
    result.assert_outcomes(passed=15)
    names = [n for _, s, n in ran(suite) if s != "setup"]
    assert names[-3:] == ["serial0", "serial1", "serial2"], names


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_few_unit_tests_alone_run_to_the_end(suite: pytest.Pytester, workers: str) -> None:
    """Unit tests are units of one test each; a worker runs a test only once it holds the next one, so a run
    of one module (`pytest -n 2 tests/unit/x.py`) hung when each worker started with a single unit."""
    result = suite.runpytest_subprocess(*QUIET, "-n", workers, "test_plain.py", timeout=50)
    result.assert_outcomes(passed=6)


def test_a_serial_test_given_to_another_worker_fails_loudly(suite: pytest.Pytester) -> None:
    """An explicit --dist (here each: every test on every worker) is taken as asked: gw1's serial tests must
    fail, saying why."""
    result = suite.runpytest_subprocess(*QUIET, "-n", "2", "--dist", "each")
    result.assert_outcomes(passed=27, errors=3)
    result.stdout.fnmatch_lines(["*is in the serial group (e2e('gpu-0')) but worker gw1 runs a kwok cluster*"])


@pytest.mark.parametrize(
    ("marker", "fixture", "message"),
    [
        ("pytest.mark.e2e", "", "e2e marker (), not one of 'gpu-0', 'kwok'"),
        ('pytest.mark.e2e("gpu")', "", "e2e marker gpu, not one of 'gpu-0', 'kwok'"),
        ("", "cluster", "uses the cluster but has no e2e marker"),
    ],
    ids=["no-group", "unknown-group", "no-marker"],
)
def test_a_test_that_names_no_group_stops_the_run(
    pytester: pytest.Pytester, marker: str, fixture: str, message: str
) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    e2e(group): a cluster\n")
    (pytester.path / "suite_groups.py").write_text((TESTS / "suite_groups.py").read_text())
    pytester.makeconftest(
        (TESTS / "conftest.py").read_text() + "\n\n@pytest.fixture\ndef cluster():\n    return 'a cluster'\n"
    )
    pytester.makepyfile(
        test_forgot=f"import pytest\n\npytestmark = {marker or '[]'}\n\ndef test_it({fixture}):\n    pass\n"
    )
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess(*QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*every end-to-end test names its group*", f"*test_forgot.py::test_it: {message}*"])


def test_the_parallel_workers_yield_the_cpu_to_the_serial_group(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The serial group is the run's critical path: the other workers, and what they start, run at a lower priority."""
    monkeypatch.setenv("GPULANE_TEST_NICE", "5")  # the default, whatever the run was given
    base = os.nice(0)
    result = suite.runpytest_subprocess(*QUIET, "-n", "3")
    result.assert_outcomes(passed=15)
    nice = {line.split()[0]: int(line.split()[2]) for line in (suite.path / "ran.log").read_text().splitlines()}
    assert nice["gw0"] == base and {nice[w] for w in nice if w != "gw0"} == {min(base + 5, 19)}, nice
