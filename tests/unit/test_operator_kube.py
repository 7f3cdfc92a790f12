"""Kube's mapping of the apiserver's refusals: a JSON patch whose ``test`` no longer holds is a Conflict,
whatever the 422's message says (seen in the chaos bench: a generic "error in our request")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpulane.kube.client import Conflict, Gone, Kube

TESTED = [
    {"op": "test", "path": "/status/phase", "value": "Running"},
    {"op": "replace", "path": "/status/phase", "value": "Succeeded"},
]


def refuse(status: int, body: str) -> Any:
    def fn(*args: Any, **kwargs: Any) -> None:
        err = ApiException(status=status, reason="Refused")
        err.body = body
        raise err

    return fn


def write(fn: Any, patch: Any) -> None:
    async def go() -> None:
        kube = Kube(client.ApiClient(), "ns", workers=1)
        try:
            await kube._write("job-status", fn, "ns", "job", patch)
        finally:
            kube.close()

    asyncio.run(go())


def test_a_failed_test_op_is_a_conflict_whatever_the_message():
    generic = '{"message":"the server rejected our request due to an error in our request","code":422}'
    with pytest.raises(Conflict):
        write(refuse(422, generic), TESTED)


def test_a_422_without_a_test_op_stays_an_error():
    with pytest.raises(ApiException):
        write(refuse(422, '{"message":"spec.x: Invalid value"}'), [{"op": "add", "path": "/x", "value": 1}])


def test_conflicts_and_missing_objects():
    with pytest.raises(Conflict):
        write(refuse(409, "conflict"), {"status": {}})
    with pytest.raises(Gone):
        write(refuse(404, "not found"), TESTED)
