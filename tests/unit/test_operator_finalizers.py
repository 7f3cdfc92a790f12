"""Dropping the operator's finalizer: a JSON patch that tests the list it saw, so a finalizer somebody else added
meanwhile is never removed with it."""

import asyncio
import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpulane.api.contract import FINALIZER

from .test_operator_controller import NS, World, job_body


def test_a_finalizer_list_that_changed_meanwhile_is_read_again_and_only_ours_dropped() -> None:
    async def scenario() -> None:
        w = World()
        body = job_body("j")
        body["metadata"]["finalizers"] = [FINALIZER, "example.com/keep"]
        w.kube.put("gpujobs", body)
        mark = len(w.kube.calls)
        await w.ctl.writes.drop_finalizer(NS, "j", [FINALIZER])  # the list as the operator last saw it
        assert w.kube.job("j")["metadata"]["finalizers"] == ["example.com/keep"]
        calls = [c.verb for c in w.kube.calls[mark:] if c.target == f"gpujobs/{NS}/j"]
        assert calls == ["patch_job", "get_job", "patch_job"]  # the test failed, the list was read again

    asyncio.run(scenario())


def test_a_job_gone_meanwhile_ends_the_drop_quietly() -> None:
    async def scenario() -> None:
        w = World()
        await w.ctl.writes.drop_finalizer(NS, "never-there", [FINALIZER])
        assert [c.verb for c in w.kube.calls if c.target == f"gpujobs/{NS}/never-there"] == ["patch_job"]

    asyncio.run(scenario())


def test_a_drop_refused_while_the_apiserver_restarts_is_tried_again_until_it_lands() -> None:
    """After an apiserver restart its admission policies refuse writes for a while (a 422: "failed to configure
    policy"); nothing would ask for the drop again, so the job's deletion hung until the operator restarted."""

    async def scenario() -> None:
        w = World()
        body = job_body("j")
        body["metadata"]["finalizers"] = [FINALIZER]
        w.kube.put("gpujobs", body)
        refusals = [2]

        def refuse(verb: str, target: str, patch: Any) -> None:
            if verb == "patch_job" and refusals[0]:
                refusals[0] -= 1
                message = "ValidatingAdmissionPolicy 'gpulane-job-rules' denied request: failed to configure policy"
                err = ApiException(status=422, reason="Unprocessable Entity")
                err.body = json.dumps({"kind": "Status", "message": message})
                raise err

        w.kube.before_write = refuse
        await w.ctl.writes.drop_finalizer(NS, "j", [FINALIZER])
        assert w.kube.job("j")["metadata"].get("finalizers") == [], "dropped at the third try"
        assert [c.verb for c in w.kube.calls if c.target == f"gpujobs/{NS}/j"] == ["patch_job"] * 3

    asyncio.run(scenario())
