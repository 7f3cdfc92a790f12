"""The tests' in-memory fakes against the protocol they stand in for: ``make lint`` type-checks this file (mypy,
imports followed silently), so a fake that drifts from ``KubeClient`` fails there, and the tests hand it to the
operator's rooms without a ``type: ignore``."""

from __future__ import annotations

from gpulane.kube.protocol import KubeClient, Reviews
from gpulane.operator.controller import Controller
from gpulane.operator.settings import Settings

from .test_bridge_results import FakeKube as ResultsFake
from .test_operator_controller import SYSTEM, Clock, FakeKube
from .test_result_cli import BridgeKube


def operators_fake() -> KubeClient:
    return FakeKube(Clock())


def operator_on_the_fake() -> Controller:
    clock = Clock()
    return Controller(FakeKube(clock), Settings(namespace=SYSTEM), clock=clock)


def results_fakes() -> list[Reviews]:
    return [ResultsFake({}), BridgeKube({})]
