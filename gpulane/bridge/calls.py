"""An incoming OpenAI call, read and judged before anything is created: its route, model and mode.

Everything that can refuse a call is decided here or in ``keys.py``, before any response header is
sent: once a 200 event stream has started, a 4xx is no longer possible.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesHeaderParser
from typing import Any
from urllib.parse import parse_qs

from gpulane.api.routes import ModelFrom, route
from gpulane.api.run_limits import MAX_RUN_SECONDS

# The longest "model" value taken from a form; a model name is a Kubernetes object name.
MAX_MODEL_FIELD = 253


# Each refusal's code, unless it says a more precise one: every error the bridge answers has a type and a code,
# as OpenAI's do (llama-swap's shed calls too: rate_limit_error), so that clients can branch on them.
CODES = {400: "invalid_request", 401: "invalid_api_key", 403: "permission_denied", 404: "not_found",
         413: "request_too_large", 429: "rate_limit_exceeded", 502: "backend_failed", 503: "unavailable"}  # fmt: skip


def kind_of(status: int) -> str:
    """The OpenAI error type of a refusal's status."""
    return {401: "authentication_error", 403: "permission_error"}.get(status, "invalid_request_error")


class CallError(Exception):
    """A call refused, or failed, in OpenAI's error format: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, retry_after: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.kind, self.param, self.retry_after = status, kind, param, retry_after
        self.code = code or CODES.get(status, "server_error" if status >= 500 else "invalid_request")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


QUEUE_TIMEOUT_HEADER = "X-Gpulane-Queue-Timeout"
MAX_RUN_HEADER = "X-Gpulane-Max-Run-Seconds"


def seconds_header(headers: Mapping[str, str], name: str) -> int | None:
    """A header of whole seconds from 1 to MAX_RUN_SECONDS, or None when it is absent."""
    raw = headers.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_RUN_SECONDS:
        wanted = f"a whole number of seconds from 1 to {MAX_RUN_SECONDS}"
        raise CallError(400, f"{name} must be {wanted}, got {raw[:40]!r}", param=name)
    return int(text)


def queue_timeout(headers: Mapping[str, str]) -> int | None:
    """The caller's ``X-Gpulane-Queue-Timeout``: how many seconds it waits for its job to start (the
    GpuPolicy's band default may be smaller; the smaller wins). None when the header is absent."""
    return seconds_header(headers, QUEUE_TIMEOUT_HEADER)


def max_run_seconds(headers: Mapping[str, str], ceiling: int) -> int:
    """The call's run limit: the bridge's ``--max-run-seconds``, lowered (never raised) by the caller's
    ``X-Gpulane-Max-Run-Seconds``. The GpuPolicy's runLimits.maxSeconds bounds both (the webhook caps it)."""
    asked = seconds_header(headers, MAX_RUN_HEADER)
    return ceiling if asked is None else min(asked, ceiling)


@dataclass(frozen=True, slots=True)
class Call:
    path: str
    model: str
    stream: bool
    body: bytes
    content_type: str
    method: str = "POST"
    upstream: str = ""  # the model server's path and query ("" is the caller's path)
    source: ModelFrom = "json"  # where the call named its model

    @property
    def target(self) -> str:
        return self.upstream or self.path


def read_call(path: str, content_type: str, body: bytes, max_bytes: int, method: str = "POST", query: str = "") -> Call:
    """The call's route, model and streaming mode, or a CallError saying what is wrong with it."""
    if len(body) > max_bytes:
        raise CallError(413, f"request body of {len(body)} bytes is over the limit of {max_bytes}", code="too_large")
    found = route(method, path)
    if found is None:
        raise CallError(404, f"unknown endpoint {method} {path}", code="unknown_url")
    if found.model_from == "path" and (why := unplain(found.upstream)):
        raise CallError(400, f"{method} {path}: {why}", code="bad_path")
    upstream = found.upstream + (f"?{query}" if query else "")
    if found.model_from in ("path", "query"):
        named = (found.model if found.model_from == "path" else parse_qs(query).get("model", [""])[0]) or ""
        if not named.strip():
            raise CallError(400, f"{method} {path} needs the model as ?model=...", param="model")
        # Passed through as they are: the server's answer is streamed back whatever it is.
        return Call(path, _bounded(named.strip()), False, body, content_type, method, upstream, found.model_from)
    if found.model_from == "form":
        if not content_type.startswith("multipart/form-data"):
            raise CallError(400, f"{path} takes multipart/form-data")
        field = form_field(content_type, body, "model")
        if field is None or not field.strip():
            raise CallError(400, "the form has no 'model' field", param="model")
        return Call(path, _bounded(field.strip()), False, body, content_type, method, upstream, "form")
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise CallError(400, f"the body is not valid JSON: {err}") from None
    if not isinstance(payload, dict):
        raise CallError(400, "the body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise CallError(400, "'model' is required and must be a string", param="model")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise CallError(400, "'stream' must be a boolean", param="stream")
    return Call(path, model, stream, body, "application/json", method, upstream)


def sent_headers(call: Call) -> dict[str, str]:
    """The headers the model server gets with ``call``: its body's type, and no compression to undo."""
    return {"Accept-Encoding": "identity", **({"Content-Type": call.content_type} if call.content_type else {})}


def unplain(path: str) -> str | None:
    """Why a decoded /upstream path is not passed on as it is, or None. The client sends the path the bridge
    judges (its ignored paths, the queue): a '.' or '..' segment or an empty one would be resolved further on
    (``/health/../v1/chat/completions`` reaching the server as ``/v1/chat/completions``), and a decoded '?'
    or '#' would be read as the query or a fragment."""
    if any(segment in (".", "..") for segment in path.split("/")) or "//" in path:
        return "a path with '.', '..' or empty segments is refused"
    if "?" in path or "#" in path:
        return "a path with an encoded '?' or '#' is refused"
    return None


def _bounded(model: str) -> str:
    if len(model) > MAX_MODEL_FIELD:
        raise CallError(400, f"the model name is over {MAX_MODEL_FIELD} characters", param="model")
    return model


def form_field(content_type: str, body: bytes, name: str) -> str | None:
    """The value of the text field ``name`` in a multipart/form-data ``body`` (RFC 7578), or None.

    The body is cut at its boundary lines (bytes.split: linear, in C), and only each part's own headers
    are parsed, so text inside an uploaded file that looks like a field is never taken for one.
    """
    header = Message()
    header["Content-Type"] = content_type
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise CallError(400, "the multipart Content-Type has no boundary")
    # Every delimiter is CRLF "--" boundary; the first may open the body without its CRLF.
    pieces = (b"\r\n" + body).split(b"\r\n--" + boundary.encode())
    for piece in pieces[1:]:  # pieces[0] is the preamble
        rest_of_line, _, part = piece.partition(b"\r\n")
        if rest_of_line.startswith(b"--"):
            break  # the closing delimiter
        head, blank, content = part.partition(b"\r\n\r\n")
        if not blank:
            continue
        headers = BytesHeaderParser().parsebytes(head + b"\r\n\r\n")
        disposition = Message()
        disposition["Content-Disposition"] = headers.get("Content-Disposition", "")
        if disposition.get_param("name", header="content-disposition") == name:
            return content.decode(errors="replace")
    return None
