"""Creating a call's GpuJob through a brief outage: which failures are waited out, for how long.

An apiserver that restarts, an admission webhook whose pods are being replaced, an etcd leader election:
each refuses creates for seconds, and a caller should not see them as "gpulane is down". A create the
cluster refuses on the merits (a cap, a bad body, a quota, RBAC) is never retried: that answer would not
change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import ClientError
from kubernetes.aio.client.exceptions import ApiException

from gpulane.api.contract import Body
from gpulane.kube.client import Conflict, Kube, refusal_message, why

log = logging.getLogger(__name__)

PATIENCE_SECONDS = 30.0  # for a call without a queue timeout of its own
FIRST_PAUSE, LONGEST_PAUSE = 0.1, 2.0

# Told the job's name and why the cluster cannot take it yet, before each pause (a stream writes a comment).
Waiting = Callable[[str, str], Awaitable[None]]


# An admission policy the apiserver could not set up: its verdict is no verdict on the job. Seen for up to 30 s
# after an apiserver restart, until it finds the GpuPolicy CRD its policies take as their parameter.
UNCONFIGURED_POLICY = "failed to configure policy"


def transient(err: BaseException) -> bool:
    """The cluster cannot take the job now but may in a moment: the apiserver unreachable or too slow, busy
    (429), failing (5xx: a webhook it cannot call, "no endpoints available", storage initializing), or not
    yet able to run its admission policies."""
    if isinstance(err, ApiException):
        if err.status == 403:
            return UNCONFIGURED_POLICY in refusal_message(err)
        return err.status is not None and (err.status == 429 or err.status >= 500)
    return isinstance(err, OSError | TimeoutError | ClientError)


async def create_patiently(
    kube: Kube,
    manifest: Body,
    patience: float,
    waiting: Waiting | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Create ``manifest``, retrying transient failures with backoff for up to ``patience`` seconds.

    Raises at once on a refusal on the merits, and with the last error once patience runs out.
    """
    name = manifest["metadata"]["name"]
    deadline, pause, attempts = clock() + patience, FIRST_PAUSE, 0
    while True:
        try:
            await kube.create_job(manifest)
            return
        except Conflict:
            if attempts:  # an earlier attempt landed, and only its answer was lost (a timeout)
                return
            raise
        except Exception as err:
            if not transient(err) or clock() + pause > deadline:
                raise
            log.warning("creating %s failed (%s); retrying in %.1fs", name, why(err), pause)
            if waiting is not None:
                await waiting(name, why(err))
        await sleep(pause)
        pause, attempts = min(pause * 2, LONGEST_PAUSE), attempts + 1
