"""Dropping the operator's finalizer: a JSON patch that tests the list it saw, so a finalizer somebody else added
meanwhile is never removed with it."""

import asyncio

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
