"""The operator as one object: its client, its controller and chains, its health endpoint and its leadership,
composed in one place (``main.py`` builds it; kopf's startup starts it and its cleanup stops it).

The kopf handlers only route watch events to ``controller`` and ``chains``; everything that lives as long as
the process is here, with its order of start and stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable

from aiohttp import web
from kubernetes.aio import client

from gpulane.kube.client import Kube
from gpulane.kube.leader import Leadership
from gpulane.operator import collector, health, loop_lag
from gpulane.operator.chains import Chains
from gpulane.operator.controller import Controller
from gpulane.operator.settings import Settings

log = logging.getLogger(__name__)


def _exit() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # kopf's cleanup runs; the Deployment starts a standby again


class Operator:
    def __init__(self, settings: Settings, leadership: Leadership, host: str, port: int,
                 on_lost: Callable[[], None] = _exit) -> None:  # fmt: skip
        self.settings, self.leadership, self.host, self.port, self.on_lost = settings, leadership, host, port, on_lost
        self.kube: Kube | None = None
        self.controller: Controller | None = None
        self.chains: Chains | None = None
        self._health: web.AppRunner | None = None
        self._lag: asyncio.Task[None] | None = None
        self._untime: Callable[[], None] | None = None

    async def start(self, configuration: client.Configuration) -> None:
        """Build what is missing (kopf retries a failed startup: what a try made is kept), stand by until this
        replica leads, then rebuild the state from the API and start the controller's loops."""
        if self.controller is None:
            self.kube = Kube(client.ApiClient(configuration), self.settings.namespace, agent="gpulane-operator")
            ctl = self.controller = Controller(self.kube, self.settings)
            self.chains = Chains(ctl.kube, ctl.clock, ctl.spawn, lambda model: ctl.dispatcher.model(model).run_seconds,
                                 lambda: (ctl.observed.admission, ctl.dispatcher.policy),
                                 lambda chain: ctl.router.hand_over("gpuchains", chain))  # fmt: skip
        ctl = self.controller
        if self._health is None:
            self._health = await health.serve(self.host, self.port, ctl.metrics.registry, self.ready)
            self._lag = asyncio.create_task(loop_lag.probe(ctl.metrics.loop_lag.observe))
            pauses = ctl.metrics.collections
            self._untime = collector.time_collections(
                lambda gen, s: pauses.labels(str(gen)).observe(s),
                asyncio.get_running_loop(),
                frozen=ctl.metrics.freezes.inc,
                held=lambda: len(ctl.jobs),
            )
        assert self.kube is not None
        await self.leadership.win(self.kube, self._led)
        await ctl.rebuild()
        ctl.start()

    def _led(self, leads: bool) -> None:
        assert self.controller is not None
        self.controller.metrics.leader.set(1 if leads else 0)
        if self.leadership.election is not None:
            self.controller.metrics.leader_transitions.inc()
        if not leads:
            self.on_lost()

    def ready(self) -> bool:
        """The leader once its state is rebuilt and checked by a resync; a standby always (it stands by, as it
        should)."""
        ctl = self.controller
        return (ctl is not None and ctl.ready and ctl.synced) or self.leadership.standing_by

    async def stop(self) -> None:
        """Stop renewing the Lease (no write of ours starts from here), stop the controller, give the Lease up if
        this replica led, then close the client and the health endpoint."""
        await self.leadership.stop()
        if self.controller is not None and self.kube is not None:
            await self.controller.stop()
            await self.leadership.release(self.kube.api)
            await self.kube.close()
        if self._health is not None:
            await self._health.cleanup()
        if self._lag is not None:
            self._lag.cancel()
            await asyncio.gather(self._lag, return_exceptions=True)  # gone before the loop closes
        if self._untime is not None:
            self._untime()
