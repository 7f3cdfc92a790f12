"""The suite's groups (suite_groups.py): checked at collection, scheduled across ``pytest -n N`` workers."""

from __future__ import annotations

from typing import Any

import pytest
import suite_groups


def pytest_configure(config: pytest.Config) -> None:
    suite_groups.yield_to_the_serial_group(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite_groups.check_and_record(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n N`` with xdist's default distribution ("load") gets the groups' scheduler; an explicit other
    ``--dist`` is taken as asked (and a serial test on a worker with its own cluster then fails, saying so)."""
    if config.getvalue("dist") != "load":
        return None
    return suite_groups.make_scheduler(config, log)


def pytest_runtest_setup(item: pytest.Item) -> None:
    suite_groups.check_placement(item)
