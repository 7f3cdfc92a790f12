"""`make demo`'s cold and warm times have one source, COLD_MINUTES and WARM_MINUTES in hack/localdemo/cli.py
(its notice says them): README.md and docs/demo.md must state the same figures."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "hack") not in sys.path:
    sys.path.insert(0, str(REPO / "hack"))

from localdemo.cli import COLD_MINUTES, WARM_MINUTES  # noqa: E402  (lives in hack/, which is not a package)

# The phrases that state the times, after line breaks are made spaces. README.md: "a cold `make demo` takes
# about N minutes" and "a warm `make demo` (...) takes about N minutes"; docs/demo.md's Times table: the time
# column of its rows "cold: ..." and "warm: ... cluster stopped".
STATED = {
    "README.md": {
        "cold": r"cold `make demo` takes about (\d+) minutes",
        "warm": r"warm `make demo` (?:\([^)]*\) )?takes about (\d+) minutes",
    },
    "docs/demo.md": {
        "cold": r"^\| cold: [^|]*\| about (\d+) minutes[ |(]",
        "warm": r"^\| warm: [^|]*cluster stopped \| about (\d+) minutes[ |(]",
    },
}


def stated(doc: str, which: str) -> list[int]:
    text = (REPO / doc).read_text()
    if doc == "README.md":
        text = " ".join(text.split())  # a phrase may be broken across lines
    return [int(n) for n in re.findall(STATED[doc][which], text, re.M)]


@pytest.mark.parametrize("doc", sorted(STATED))
def test_the_docs_state_the_cold_and_warm_demo_times_of_cli_py(doc: str) -> None:
    assert stated(doc, "cold") == [COLD_MINUTES], f"{doc}: the cold `make demo` time is not cli.py's COLD_MINUTES"
    assert stated(doc, "warm") == [WARM_MINUTES], f"{doc}: the warm `make demo` time is not cli.py's WARM_MINUTES"


def test_the_patterns_find_a_changed_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: the same docs with the cold time changed no longer agree with cli.py."""
    for doc in STATED:
        copy = tmp_path / doc
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text((REPO / doc).read_text().replace(f"about {COLD_MINUTES} minutes", "about 99 minutes"))
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert stated("README.md", "cold") == [99]
    assert stated("docs/demo.md", "cold") == [99]
