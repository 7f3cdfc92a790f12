"""Leader election among operator replicas, through a ``coordination.k8s.io`` Lease, with fenced writes.

The election is the official client's (``kubernetes.aio.leaderelection``: client-go's lease duration,
renew deadline and retry period). Two things it does not do are added here:

- **Fencing.** The library notices a lost Lease only when a renewal attempt returns, and its calls have
  no timeout, so a paused or partitioned leader could go on writing. Every write of this replica is
  therefore checked against a ``Fence``: writes are allowed only until ``renew deadline`` after the
  start of the last renewal that succeeded, and each write times out after ``lease duration - renew
  deadline``. So this replica has given up on every write before another may take the Lease (which
  needs ``lease duration`` without a renewal), on any clock that runs at the same rate. Giving up is the
  client's side only: the apiserver may still commit a write whose client timed out. What makes such a
  late write harmless is elsewhere: a backend pod's name is the lane's (a second pod of it cannot exist),
  and job status writes after dispatch are JSON patches that ``test`` the phase they expect.
- **Bounded calls that fail as failures.** The lock's reads and writes time out after the retry period,
  and any error of theirs (a refused connection while the apiserver restarts, a timeout) is a failed
  attempt. The library catches only ``ApiException``: anything else ended its task without calling
  ``onstopped_leading``, so a leader whose apiserver restarted stopped renewing, yet never stepped down
  or exited. Should the task end for any other reason while leading, the replica steps down all the same.
- **A create that works.** The library's ``LeaseLock.create`` passes ``pretty=True``, which the generated
  async API refuses, so the first replica could never create the Lease; and the lease duration must be
  whole seconds (it is written as ``int(str(duration))``).

A replica that loses the Lease stops: it closes the fence, and the process ends (the Deployment
restarts it as a standby). A standby never writes; when it wins the Lease it rebuilds its state from
the API exactly as a restarted operator does. A leader told to stop (a rollout, a drain) gives the Lease
up once its own work has stopped (``release``, client-go's ``ReleaseOnCancel``): a standby then takes it at
its next try instead of waiting out the lease duration.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubernetes.aio import client
from kubernetes.aio.client.api_client import ApiClient
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.leaderelection.electionconfig import Config
from kubernetes.aio.leaderelection.leaderelection import LeaderElection
from kubernetes.aio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.aio.leaderelection.resourcelock.leaselock import LeaseLock

if TYPE_CHECKING:
    from gpulane.kube.client import Kube

log = logging.getLogger(__name__)

LEASE_NAME = "gpulane-operator"


@dataclass(frozen=True, slots=True)
class Timing:
    """6 s, 4 s, 1 s (client-go's are 15, 10 and 2): a killed leader's standby leads within the lease duration
    and one try, so that dispatching resumes within 10 s; each write may take 2 s. The lease duration is whole
    seconds, as the Lease stores it (the library writes ``int(str(duration))``)."""

    lease_seconds: int = 6
    renew_deadline_seconds: float = 4.0
    retry_seconds: float = 1.0

    def check(self) -> None:
        if not (self.retry_seconds >= 1 and self.renew_deadline_seconds > 1.2 * self.retry_seconds):
            raise ValueError(
                f"the renew deadline ({self.renew_deadline_seconds:g}s) must be over 1.2 times the retry period "
                f"({self.retry_seconds:g}s), which must be at least 1s"
            )
        if self.lease_seconds <= self.renew_deadline_seconds:
            raise ValueError(
                f"the lease duration ({self.lease_seconds:g}s) must be longer than the renew deadline "
                f"({self.renew_deadline_seconds:g}s): the difference is the time a lost leader has to stop"
            )

    @property
    def write_timeout(self) -> float:
        """How long one write may take: it must end before another replica can take the Lease."""
        return self.lease_seconds - self.renew_deadline_seconds


class Fence:
    """Whether this replica may write now: only while the Lease is surely its own."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.until = float("-inf")

    def renewed(self, started: float, renew_deadline: float) -> None:
        self.until = max(self.until, started + renew_deadline)

    def close(self) -> None:
        self.until = float("-inf")

    def open(self) -> bool:
        return self.clock() < self.until


class FencedLeaseLock(LeaseLock):
    """The library's Lease lock, with a timeout on each call and the fence moved on by each renewal."""

    def __init__(self, name: str, namespace: str, identity: str, api: ApiClient, fence: Fence, timing: Timing) -> None:
        super().__init__(name, namespace, identity, api)
        self.fence, self.timing = fence, timing

    async def get(self, name: str, namespace: str):  # type: ignore[no-untyped-def]
        try:
            return await asyncio.wait_for(super().get(name, namespace), self.timing.retry_seconds)
        except Exception as err:  # the library reads a failure's ``reason`` and ``body``: an ApiException's
            failed = ApiException(status=0, reason=f"reading the Lease failed: {err!r}")
            return False, failed

    async def _held(self, call: Awaitable[bool]) -> bool:
        started = self.fence.clock()
        try:
            done = await asyncio.wait_for(call, self.timing.retry_seconds)
        except TimeoutError:
            log.warning("a Lease %s write timed out after %gs", self.name, self.timing.retry_seconds)
            return False
        except Exception as err:  # not an ApiException (the library catches those): the apiserver is away
            log.warning("a Lease %s write failed: %r", self.name, err)
            return False
        if done:
            self.fence.renewed(started, self.timing.renew_deadline_seconds)
        return done

    async def create(self, name: str, namespace: str, election_record: LeaderElectionRecord) -> bool:
        # Not the library's: it passes ``pretty=True``, which the generated async API refuses (it wants a
        # string), so its create never succeeds.
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=name), spec=self.update_lease(election_record))

        async def created() -> bool:
            try:
                await self.api_instance.create_namespaced_lease(namespace, body)
            except ApiException as err:
                log.warning("creating the Lease %s/%s failed: HTTP %s %s", namespace, name, err.status, err.reason)
                return False
            return True

        return await self._held(created())

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        return await self._held(super().update(name, namespace, updated_record))


async def release(api: ApiClient, namespace: str, identity: str, timing: Timing, lease_name: str = LEASE_NAME) -> bool:
    """Give the Lease up if this replica still holds it: its holder is cleared, which a standby takes at its
    next try. Call it only once this replica's writes have stopped. The replace carries the Lease's
    resourceVersion, so a Lease another replica took meanwhile is never cleared."""
    leases = client.CoordinationV1Api(api)
    try:
        lease = await asyncio.wait_for(leases.read_namespaced_lease(lease_name, namespace), timing.retry_seconds)
        if lease.spec is None or lease.spec.holder_identity != identity:
            return False
        lease.spec.holder_identity = None
        lease.spec.renew_time = None
        await asyncio.wait_for(leases.replace_namespaced_lease(lease_name, namespace, lease), timing.retry_seconds)
    except Exception as err:  # the Lease then passes at its expiry, as after a kill
        log.warning("%s could not release the Lease %s/%s: %r", identity, namespace, lease_name, err)
        return False
    log.info("%s released the Lease %s/%s", identity, namespace, lease_name)
    return True


async def campaign(
    api: ApiClient,
    namespace: str,
    identity: str,
    timing: Timing,
    fence: Fence,
    on_lead: Callable[[], None],
    on_lost: Callable[[], None],
    lease_name: str = LEASE_NAME,
) -> asyncio.Task[None]:
    """Campaign for the Lease and return once this replica leads (``on_lead`` called). The returned task
    keeps renewing it; once a renewal fails for the renew deadline, it closes the fence and calls
    ``on_lost``."""
    lock = FencedLeaseLock(lease_name, namespace, identity, api, fence, timing)
    leading = asyncio.Event()

    async def started() -> None:
        log.info("%s leads (Lease %s/%s)", identity, namespace, lease_name)
        on_lead()
        leading.set()
        await asyncio.Event().wait()  # cancelled by the library when the Lease is lost

    async def stopped() -> None:
        if not leading.is_set():
            return  # stepped down already
        leading.clear()
        fence.close()
        log.error("%s lost the Lease %s/%s: it stops writing and exits", identity, namespace, lease_name)
        on_lost()

    async def elect() -> None:
        try:
            await LeaderElection(config).run()
        except asyncio.CancelledError:  # shutting down: stop writing, nothing more
            fence.close()
            raise
        except Exception:
            log.exception("the leader election of %s failed", identity)
        await stopped()  # however the election ended, a leader steps down

    config = Config(lock, timing.lease_seconds, timing.renew_deadline_seconds, timing.retry_seconds, started, stopped)
    task = asyncio.create_task(elect())
    waiting = asyncio.create_task(leading.wait())
    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if task.done():
        task.result()  # the election ended without leading: its error, if any
        raise RuntimeError("the leader election ended before this replica led")
    return task


@dataclass(frozen=True, slots=True)
class Election:
    """Where and as whom this replica campaigns."""

    namespace: str
    identity: str
    timing: Timing


class Leadership:
    """This replica's leadership, with one owner: the fence on its client's writes, the campaign, whether it leads
    now, and giving the Lease up when it stops. Without an election it leads from the start."""

    def __init__(self, election: Election | None, lease: str = LEASE_NAME) -> None:
        self.election, self.lease = election, lease
        self.leading = election is None
        self._renewing: asyncio.Task[None] | None = None

    @property
    def standing_by(self) -> bool:
        return not self.leading

    async def win(self, kube: Kube, on_change: Callable[[bool], None]) -> None:
        """Return once this replica leads; ``kube``'s writes are fenced by the Lease from now on. ``on_change``
        hears each change (True: it leads; False: it lost the Lease and must stop). A second call while
        campaigning or leading returns at once (kopf retries a failed startup)."""
        if self.election is None:
            on_change(True)
            return
        if self._renewing is not None:
            return
        election, fence = self.election, Fence()
        kube.fence, kube.write_timeout = fence.open, election.timing.write_timeout

        def changed(leads: bool) -> None:
            self.leading = leads
            on_change(leads)

        log.info("standing by for the Lease %s/%s as %s", election.namespace, self.lease, election.identity)
        self._renewing = await campaign(kube.api, election.namespace, election.identity, election.timing, fence,
                                        lambda: changed(True), lambda: changed(False), self.lease)  # fmt: skip

    async def stop(self) -> None:
        """Stop renewing (the fence closes: no write of ours starts from here). Call it before the work that
        writes stops, and ``release`` once it has."""
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)

    async def release(self, api: ApiClient) -> None:
        """Told to stop while leading: give the Lease up, so that a standby need not wait out its duration."""
        if self.election is not None and self.leading:
            election = self.election
            await release(api, election.namespace, election.identity, election.timing, self.lease)
