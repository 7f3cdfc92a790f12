"""The ``last`` marker (conftest.py) holds however the session is started: whole suite, a file alone,
``--ff`` after a ``last`` test failed, ``--nf`` after one was edited, a plugin that reorders. Each case runs
a small suite in pytester with the e2e conftest's own hook; no cluster is needed."""

from __future__ import annotations

import os

import pytest

from . import conftest

pytest_plugins = ["pytester"]

# Not needed in there, and hypothesis's summary alone takes seconds per run.
QUIET = ("-p", "no:hypothesispytest", "-p", "no:anyio")

# Whoever reorders with -p: its hook is registered before the suite's conftest, so it runs after it.
REVERSE = """
def pytest_collection_modifyitems(items):
    items.reverse()
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """suite/: plain tests, a file of ``last`` tests (the newest file, one of which fails) and a file with
    both; its conftest imports the hook of tests/e2e/conftest.py."""
    pytester.makeini("[pytest]\nmarkers =\n    last: runs after every other test\n")
    suite = pytester.mkdir("suite")
    hook = conftest.pytest_collection_finish
    (suite / "conftest.py").write_text(f"from {hook.__module__} import {hook.__name__}  # noqa: F401\n")
    (suite / "test_a.py").write_text("def test_a1(): pass\n\ndef test_a2(): pass\n")
    (suite / "test_mixed.py").write_text(
        "import pytest\n\n@pytest.mark.last\ndef test_mixed_last(): pass\n\ndef test_mixed_plain(): pass\n"
    )
    (suite / "test_z.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.last\n\ndef test_z1(): assert 0\n\ndef test_z2(): pass\n"
    )
    for age, name in enumerate(("test_z.py", "test_mixed.py", "test_a.py")):  # test_z.py the newest
        os.utime(suite / name, (1e9 - age * 100, 1e9 - age * 100))
    pytester.makepyfile(reverse=REVERSE)
    pytester.syspathinsert()
    return pytester


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["suite/test_mixed.py"],
        ["suite/test_a.py", "suite/test_z.py"],
        ["--ff"],
        ["--ff", "suite/test_a.py", "suite/test_z.py"],
        ["--nf"],
        ["-p", "reverse"],
        ["-p", "reverse", "suite/test_a.py", "suite/test_z.py"],
    ],
    ids=["suite", "one-file", "two-files", "ff", "ff-two-files", "nf", "reorder", "reorder-two-files"],
)
def test_last_tests_run_after_all_others(suite: pytest.Pytester, args: list[str]) -> None:
    if {"--ff", "--nf"} & set(args):
        suite.inline_run(*QUIET)  # fills the cache: which tests failed (test_z1), which exist
    run = suite.inline_run(*QUIET, *args)
    ran = [r.nodeid.rpartition("::")[2] for r in run.getreports("pytest_runtest_logreport") if r.when == "call"]
    last = [name for name in ran if "last" in name or name.startswith("test_z")]
    assert ran and last, ran
    assert ran[-len(last) :] == last, f"a last test ran before another: {ran}"
