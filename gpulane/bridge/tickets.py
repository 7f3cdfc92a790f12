"""Servers that answer with a ticket and work on (GpuModel ``spec.ticket``; ComfyUI's ``POST /prompt``):
the call is done when a poll of the ticket says so, not when the first answer arrives. The bridge and the
executor both wait here, so the job stays Running and holds its lane while the GPU still works.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import ClientSession

from gpulane.api.resources import Ticket

TICKET = "{ticket}"


class TicketError(Exception):
    """The work behind a ticket failed, or could not be followed; the message says which."""


@dataclass(frozen=True, slots=True)
class Settled:
    answer: bytes  # the last poll's answer: the call's result
    content_type: str


def issues_ticket(ticket: Ticket | None, method: str, target: str) -> bool:
    """Whether a call to the server's ``method target`` answers with a ticket."""
    return ticket is not None and method == "POST" and target.partition("?")[0] == ticket.path


def lookup(payload: object, dotted: str, ticket: str) -> Any:
    """The value at ``dotted`` (``{ticket}`` standing for the ticket in any segment) in ``payload``, or None.
    Segments are split before the ticket goes in, so a ticket with a '.' stays one segment."""
    for segment in dotted.split("."):
        if not isinstance(payload, dict):
            return None
        payload = payload.get(segment.replace(TICKET, ticket))
    return payload


def ticket_of(ticket: Ticket, first: bytes) -> str:
    """The ticket in the server's first answer, or a TicketError naming what was missing."""
    try:
        value = lookup(json.loads(first), ticket.field, "")
    except (ValueError, UnicodeDecodeError):
        raise TicketError(f"the server's answer is not JSON; it has no ticket at {ticket.field!r}") from None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value):
        raise TicketError(f"the server's answer has no ticket at {ticket.field!r}: {first[:200]!r}")
    return str(value)


async def settle(
    session: ClientSession,
    base: str,
    ticket: Ticket,
    first: bytes,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Settled:
    """Poll ``ticket.poll`` every ``intervalSeconds`` until its answer has ``doneField``; a TicketError when
    ``errorField`` holds one of ``errorValues``, when a poll fails, or after ``timeoutSeconds``."""
    ident = ticket_of(ticket, first)
    url = base.rstrip("/") + ticket.poll.replace(TICKET, quote(ident, safe=""))
    deadline = clock() + ticket.timeout_seconds
    while True:
        async with session.get(url) as resp:
            raw, status, content_type = await resp.read(), resp.status, resp.content_type
        if status >= 400:
            raise TicketError(f"polling {ticket.poll.replace(TICKET, ident)} answered {status}: {raw[:200]!r}")
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise TicketError(f"polling ticket {ident} answered something that is not JSON: {raw[:200]!r}") from None
        if ticket.error_field and (failed := lookup(payload, ticket.error_field, ident)) in ticket.error_values:
            raise TicketError(f"the server's work on ticket {ident} failed ({ticket.error_field}: {failed})")
        if lookup(payload, ticket.done_field, ident) is not None:
            return Settled(raw, content_type)
        if clock() >= deadline:
            raise TicketError(f"the server's work on ticket {ident} was not done after {ticket.timeout_seconds} s")
        await sleep(ticket.interval_seconds)
