"""llama-swap's front door, for the ``llama-swap`` baseline: its per-model admission cap.

llama-swap v250 (commit 0bdb3720, ``internal/router/scheduler/fifo.go``) refuses a request with
HTTP 429 and ``Retry-After: 1`` once its model has ``concurrencyLimit`` (default 10) admitted,
unfinished requests: queued, waiting on a swap, or in the backend, the loaded model included.
Which admitted request runs next is the ranking's business (``make_ranking("llama-swap")``);
this module only decides who gets in.
"""

from __future__ import annotations

from collections import deque
from typing import Literal

from pydantic import Field

from gpulane.core.policy import CamelModel

# What a client does with a 429: resubmit as soon as the model has room, or give the job up.
Clients = Literal["retry", "reject"]


class LlamaSwapModel(CamelModel):
    concurrency_limit: int = Field(ge=1, strict=True)


class LlamaSwapConfig(CamelModel):
    """The llama-swap baseline's settings in a scenario (``llamaSwap:``); other policies ignore them."""

    concurrency_limit: int = Field(default=10, ge=1, strict=True)
    models: dict[str, LlamaSwapModel] = Field(default_factory=dict)
    clients: Clients = "retry"

    def limit(self, model: str) -> int:
        override = self.models.get(model)
        return self.concurrency_limit if override is None else override.concurrency_limit


class AdmissionCap:
    """Admitted, unfinished requests per model, and the refused jobs whose clients retry.

    Retrying clients are served in the order they were refused: a freed place goes straight to
    the first of them, so a request arriving at that instant cannot overtake a client that was
    already retrying. (Real clients poll every ``Retry-After`` second; this is that race won
    in order, at once.)
    """

    def __init__(self, config: LlamaSwapConfig) -> None:
        self.config = config
        self._admitted: dict[str, int] = {}
        self._retrying: dict[str, deque[str]] = {}

    def admit(self, job: str, model: str) -> bool:
        """Admit ``job``, or refuse it (429); a refused job of a retrying client waits for a place."""
        if self._admitted.get(model, 0) < self.config.limit(model):
            self._admitted[model] = self._admitted.get(model, 0) + 1
            return True
        if self.config.clients == "retry":
            self._retrying.setdefault(model, deque()).append(job)
        return False

    def release(self, model: str) -> str | None:
        """A request for ``model`` finished. Returns the retrying job that takes its place, if any."""
        retrying = self._retrying.get(model)
        if retrying:
            return retrying.popleft()  # the place passes on: the admitted count stays
        self._admitted[model] -= 1
        return None
