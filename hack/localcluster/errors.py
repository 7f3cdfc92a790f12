"""The one exception the cluster tooling raises, and the logger type every step takes."""

from __future__ import annotations

import sys
from collections.abc import Callable


class ClusterError(RuntimeError):
    """A failure to start, query or stop the local cluster; the message says what to look at."""


Log = Callable[[str], None]


def stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
