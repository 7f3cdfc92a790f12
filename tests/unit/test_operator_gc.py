"""The operator's tuning of Python's cyclic collector (gpulane/operator/main.py ``tune_gc``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpulane.operator.main import GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_imported_code_leaves_the_collections_and_young_ones_are_rarer(restored_gc: None) -> None:
    gc.unfreeze()
    _, middle, old = gc.get_threshold()
    tune_gc()
    assert gc.get_freeze_count() > 10_000  # the modules, classes and functions imported so far
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, middle, old)
    assert GC_YOUNG_THRESHOLD > 700  # CPython's default, which made collection 30% of a burst's CPU
