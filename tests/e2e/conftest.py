"""Fixtures for the end-to-end suite: a real local control plane (hack/gpulane_cluster.py).

- ``cluster`` (session): starts the cluster if none is running, reuses a running one. If it cannot start,
  every e2e test fails with the error and a pointer to the component logs; nothing is skipped. A cluster
  this session started is stopped at the end (set GPULANE_KEEP_CLUSTER=1 to keep it), unless another
  live pytest session still uses it: then the last of them stops it. A reused one is left running.
- ``kubeconfig``, ``api_client``, ``core_v1``: the admin kubeconfig and official-client handles.
- ``kubectl``, ``helm``: run the pinned binaries against the cluster (see ``Cluster.kubectl``).
- ``namespace``: a fresh namespace per test (its ``default`` ServiceAccount exists), deleted afterwards.

The binaries are built by ``make tools`` (``make test`` depends on it); without them the fixture fails
and says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from .operator_support import OPERATOR_NAMESPACE, OperatorProcess, World
from .support import REPO, Cluster, localcluster, wait_until

from localdemo import release as demo  # isort: skip  (hack/, put on sys.path by .support)
import suite_groups  # isort: skip  (tests/, put on sys.path by .support)

CRD_NAMES = [f"crd/{plural}.gpulane.io" for plural in ("gpujobs", "gpumodels", "gpulanes", "gpupolicies", "gpuchains")]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Tests marked ``last`` stop the session's cluster (test_host_given_back.py): they run after all others.

    Sorted once collection is over, not in ``pytest_collection_modifyitems``, where something could still
    reorder after this conftest: plugins registered before it (``-p``, or installed ones such as
    pytest-random-order), and the cache's ``--ff`` and ``--nf`` wrappers, which put failed or new (newest
    file first) tests ahead. A hook wrapper would not do either: wrappers nest by registration order, and
    this conftest is registered before the cache's plugins when a path under tests/e2e is named on the
    command line (a file run alone), after them otherwise. test_last_marker.py checks these cases.
    """
    session.items.sort(key=lambda item: item.get_closest_marker("last") is not None)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The serial group's cluster, with the real node gpu-0 (the one at the default state directory), or on a
    worker of the parallel groups that worker's own kwok cluster beside it (``suite_groups``)."""
    messages: list[str] = []
    own = suite_groups.own_cluster(localcluster.default_state_dir().parent) if suite_groups.has_own_cluster() else {}
    state_dir = own.get("state_dir") or localcluster.default_state_dir()
    try:
        info = localcluster.up(log=messages.append, user=os.getpid(), **own)
    except (localcluster.ClusterError, OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(
            "the local control plane could not be started (hack/gpulane_cluster.py up):\n"
            + "\n".join(messages)
            + f"\n{exc}\nBuild the tools with `make tools`; component logs are in {state_dir / 'logs'}",
            pytrace=False,
        )
    # A group's own cluster is its alone (one left by a killed run included): it always stops with the group.
    started = info.started or bool(own)
    yield Cluster(info, started)
    if os.environ.get("GPULANE_KEEP_CLUSTER"):
        started = False  # leave it running; `make cluster-down` stops it
    # Stops the cluster if this session started it and no other live session is still using it (the last
    # one to leave stops it then); a cluster that was already running is left as it was.
    localcluster.release(os.getpid(), started, log=lambda _msg: None, state_dir=state_dir)


@pytest.fixture(scope="session")
def kubeconfig(cluster: Cluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def api_client(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="session")
def core_v1(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def kubectl(cluster: Cluster) -> Callable[..., subprocess.CompletedProcess[str]]:
    return cluster.kubectl


@pytest.fixture
def helm(cluster: Cluster) -> Callable[..., subprocess.CompletedProcess[str]]:
    return cluster.helm


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core_v1: client.CoreV1Api) -> Iterator[str]:
    """A new namespace for one test, ready for pods (its default ServiceAccount exists)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"e2e-{stem}-{uuid.uuid4().hex[:5]}"
    core_v1.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"gpulane.dev/e2e": "true"}))
    )
    wait_until(
        lambda: core_v1.read_namespaced_service_account("default", name),
        timeout=60,
        what=f"ServiceAccount {name}/default",
    )
    yield name
    core_v1.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def crds(cluster: Cluster, core_v1: client.CoreV1Api) -> None:
    """gpulane's CRDs (from crds/, as committed) and the operator's namespace. A `make demo` left running
    goes first: its operator and webhook would act on this session's lanes and jobs."""
    if cluster.kubectl("get", "namespace", demo.NAMESPACE, "--ignore-not-found", "-o", "name").stdout.strip():
        demo.remove(demo.Tools(cluster.info.bindir, cluster.kubeconfig))
    cluster.kubectl("apply", "-f", str(REPO / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", *CRD_NAMES, "--timeout=60s")
    cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)


@pytest.fixture(scope="session")
def shared_operator(
    cluster: Cluster, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The session's one ``gpulane operator`` (started by ``operator``), as a cluster runs one for all its
    tenants. Tests stay apart by their own namespaces, nodes, lanes and models."""
    proc = OperatorProcess(cluster, tmp_path_factory.mktemp("operator"))
    yield proc
    proc.stop()


@pytest.fixture
def operator(shared_operator: OperatorProcess) -> OperatorProcess:
    """The shared operator, Ready. A test may kill, stop or restart it; the next test gets it running again.
    Its log is ``operator.log_path``."""
    if not shared_operator.running():
        shared_operator.start()
    return shared_operator


@pytest.fixture
def no_operator(shared_operator: OperatorProcess) -> None:
    """No operator on the host while the test runs (one that runs its own, e.g. the chart's)."""
    shared_operator.stop()


@pytest.fixture
def world(cluster: Cluster, api_client: client.ApiClient, namespace: str, operator: OperatorProcess) -> Iterator[World]:
    """The test's own GPU nodes, lanes, models and jobs; removed while the operator still runs."""
    w = World(cluster, api_client, namespace)
    yield w
    w.cleanup()
