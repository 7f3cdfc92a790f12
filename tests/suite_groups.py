"""The suite's groups: which cluster an end-to-end test runs on, and how ``pytest -n N`` shares the tests out.

Every end-to-end test names its group with its ``e2e`` marker (docs/development.md, "Groups"):

- ``e2e("gpu-0")``, the serial group: the tests that run real pods on the real node gpu-0, or stop, shake or
  take the host of the cluster that has it (the chart, the demo, chaos, the host given back). They run one
  at a time, in collection order, on worker gw0 (or in the only process without ``-n``).
- ``e2e("kwok")``, the parallel groups: every other worker starts a cluster of its own (its own etcd,
  apiserver, scheduler, controller-manager and kwok; every node a kwok node) and its own operator, on ports
  of its own. Nothing these tests do reaches another group: the GpuPolicy ``default``, webhook and policy
  configurations, the operator's restarts and kills all stay in their worker's cluster. A module is the
  unit a worker takes, so a module's fixtures start once.

A test that needs the cluster but names no group, or an unknown one, stops the run at collection.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

SERIAL, PARALLEL = "gpu-0", "kwok"
GROUPS = (SERIAL, PARALLEL)
SERIAL_WORKER = "gw0"
# The units a worker takes whole: the serial group is one; each module of the parallel groups is one; any
# other test (a unit test) is its own.
SERIAL_UNIT = "serial:gpu-0"
PARALLEL_UNIT = "kwok:"

# Port bases of the parallel groups' clusters: the session cluster has 16000, the lifecycle and host tests
# start theirs at 27000, 28000 and 29000. Group n (worker gwn) takes 16000 + 1000 * n.
CLUSTER_BASE, CLUSTER_STRIDE, MAX_WORKERS = 16_000, 1_000, 11
# Ports that a worker's tests hand to the processes they start (free_port), below the kernel's ephemeral
# range (32768 and up), so that no outgoing connection of another group takes one between pick and bind.
PORT_BLOCKS_FROM, PORT_BLOCK = 30_000, 250


def worker() -> str:
    """This process's xdist worker id (gw0, gw1, ...); gw0 without ``-n``."""
    return os.environ.get("PYTEST_XDIST_WORKER", SERIAL_WORKER)


def worker_index(name: str | None = None) -> int:
    name = name or worker()
    index = int(name.removeprefix("gw"))
    if index >= MAX_WORKERS:
        raise pytest.UsageError(f"at most {MAX_WORKERS} workers (-n): worker {name}'s ports would meet fixed ones")
    return index


def has_own_cluster() -> bool:
    """Whether this worker runs a parallel group on a cluster of its own (every worker but gw0)."""
    return worker() != SERIAL_WORKER


def yield_to_the_serial_group(config: pytest.Config) -> None:
    """A worker of the parallel groups runs, and starts its cluster's processes, at a lower CPU priority (nice
    ``GPULANE_TEST_NICE``, default 5): the serial group is the run's critical path and the parallel workers have
    time to spare (docs/development.md), so on a machine short of cores they give way to it. A worker is known by
    what xdist gave it, not by the environment, which a run started from inside a test inherits."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and workerinput["workerid"] != SERIAL_WORKER:
        os.nice(int(os.environ.get("GPULANE_TEST_NICE", "5")))


def own_cluster(state_root: Path) -> dict[str, Any]:
    """Where this worker's own cluster lives and listens: keyword arguments of ``localcluster.up``."""
    from gpulane_cluster import Ports  # hack/, on sys.path once the e2e support is imported

    index = worker_index()
    return {
        "state_dir": state_root / f"e2e-{worker()}",
        "ports": Ports.from_base(CLUSTER_BASE + CLUSTER_STRIDE * index),
        "real_node": False,
    }


def group_of(item: pytest.Item) -> str | None:
    """The group an item names with its closest ``e2e`` marker; None without the marker."""
    marker = item.get_closest_marker("e2e")
    if marker is None:
        return None
    return marker.args[0] if len(marker.args) == 1 and not marker.kwargs else repr(marker.args)


def check_and_record(items: Iterable[pytest.Item]) -> None:
    """Refuse the run if a test that uses the cluster names no known group; under xdist, write down each e2e
    test's unit for the controller's scheduler (units_file)."""
    wrong: list[str] = []
    units: dict[str, str] = {}
    for item in items:
        group = group_of(item)
        if group is None:
            if "cluster" in getattr(item, "fixturenames", ()):
                wrong.append(f"{item.nodeid}: uses the cluster but has no e2e marker")
            continue
        if group not in GROUPS:
            wrong.append(f"{item.nodeid}: e2e marker {group}, not one of {', '.join(map(repr, GROUPS))}")
            continue
        units[item.nodeid] = SERIAL_UNIT if group == SERIAL else PARALLEL_UNIT + item.nodeid.partition("::")[0]
    if wrong:
        raise pytest.UsageError(
            "every end-to-end test names its group, pytest.mark.e2e('gpu-0') or pytest.mark.e2e('kwok')"
            " (docs/development.md, Groups):\n  " + "\n  ".join(wrong)
        )
    if run := os.environ.get("PYTEST_XDIST_TESTRUNUID"):
        path = units_file(run, worker())
        path.with_suffix(".tmp").write_text(json.dumps(units))
        path.with_suffix(".tmp").replace(path)


def units_file(run: str, worker_id: str) -> Path:
    """Where a worker leaves its tests' units for the controller. xdist's own groups (``--dist loadgroup``
    with ``xdist_group``) cannot carry them: xdist 3.8 renames the test ids through an attribute that pytest 9.2
    no longer reads, so every test stays a unit of its own."""
    return Path(tempfile.gettempdir()) / f"gpulane-suite-units-{run}-{worker_id}.json"


def check_placement(item: pytest.Item) -> None:
    """Fail a serial-group test that a worker with its own kwok cluster was given (a scheduler bug)."""
    if group_of(item) == SERIAL and has_own_cluster():
        pytest.fail(
            f"{item.nodeid} is in the serial group (e2e('gpu-0')) but worker {worker()} runs a kwok cluster of its"
            f" own: run it with -n N and xdist's default distribution, whose scheduler (tests/suite_groups.py) gives"
            f" the serial group to {SERIAL_WORKER}",
            pytrace=False,
        )


_next_port: dict[str, int] = {}


def free_port() -> int:
    """A free TCP port on 127.0.0.1 from this worker's own block, so that two groups never pick the same one."""
    first = PORT_BLOCKS_FROM + PORT_BLOCK * worker_index()
    start = _next_port.get(worker(), 0)
    for step in range(PORT_BLOCK):
        offset = (start + step) % PORT_BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", first + offset))
            except OSError:
                continue
        _next_port[worker()] = offset + 1
        return first + offset
    raise RuntimeError(f"no free port in {first}-{first + PORT_BLOCK - 1} (worker {worker()})")


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The controller's scheduler for ``-n N``: gw0 takes the serial group first and then only
    tests that need no cluster; the other workers take the parallel groups' modules, most tests first, then
    the unit tests one by one. With one worker, it takes everything and the serial group last."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        units: dict[str, str]

        def _split_scope(self, nodeid: str) -> str:
            return self.units.get(nodeid, nodeid)

        def _fits(self, node: Any, scope: str) -> bool:
            if self.numnodes == 1:
                return True
            serial_worker = node.gateway.id == SERIAL_WORKER
            if scope == SERIAL_UNIT:
                return serial_worker
            return not (serial_worker and scope.startswith(PARALLEL_UNIT))

        def _order(self, scope: str, size: int) -> tuple[int, int]:
            if scope == SERIAL_UNIT:
                return (2 if self.numnodes == 1 else 0, 0)
            return (1, -size) if scope.startswith(PARALLEL_UNIT) else (1, 0)

        def schedule(self) -> None:
            assert self.collection_is_completed
            if self.collection is not None:
                for node in self.nodes:
                    self._reschedule(node)
                return
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = list(next(iter(self.registered_collections.values())))
            self.units = self._read_units()
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            for scope in sorted(units, key=lambda s: self._order(s, len(units[s]))):
                self.workqueue[scope] = units[scope]
            for node in self.nodes:
                self._assign_work_unit(node)
            # A worker runs a test only once it holds the next one (or is told to stop): one unit of a single
            # test would wait forever, so every worker starts with two units where it can.
            for node in self.nodes:
                self._reschedule(node)

        def _read_units(self) -> dict[str, str]:
            nodes = self.registered_collections
            files = [units_file(node.workerinput["testrunuid"], node.gateway.id) for node in nodes]
            try:
                units: dict[str, str] = json.loads(files[0].read_text())
            except OSError as err:
                raise pytest.UsageError(f"the workers left no units ({err}): is tests/conftest.py loaded?") from err
            finally:
                for path in files:
                    path.unlink(missing_ok=True)
            return units

        def _assign_work_unit(self, node: Any) -> None:
            scope = next((s for s in self.workqueue if self._fits(node, s)), None)
            if scope is None:
                node.shutdown()  # nothing left that this worker may run: it finishes what it holds
                return
            unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in unit.items() if not done])

    return GroupScheduling(config, log)
