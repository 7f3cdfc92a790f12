"""A job's ``spec.request`` (a GpuJob applied with kubectl, a chain's step) as the call the bridge would have
taken on the same route: one route table (``api/routes.py``), so the server gets what a caller of the bridge
would have sent, the model's filters, useModelName and priorityPassthrough included (``catalog.outgoing``).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from gpulane.api.routes import job_route
from gpulane.bridge.calls import Call, CallError, read_call

# A form route's file part, in a job's JSON body: {"dataBase64": ..., "filename": ..., "contentType": ...}.
FILE_DATA = "dataBase64"


def job_call(request: Mapping[str, Any], model: str, max_bytes: int) -> Call:
    """The call for a job of ``model``; a ValueError or CallError says why it cannot be sent. The body
    names the job's model: a JSON body's ``model``, a GET route's ``?model=``, a form's ``model`` field."""
    method, path = str(request.get("method", "POST")), str(request.get("path", ""))
    found = job_route(method, path, model)
    fields: dict[str, Any] = dict(request.get("body") or {})
    query, content_type, body = "", "", b""
    if found.model_from == "json":
        body, content_type = json.dumps({**fields, "model": model}).encode(), "application/json"
    elif found.model_from == "query":
        query = urlencode({**{k: _text(v) for k, v in fields.items()}, "model": model})
    elif found.model_from == "form":
        body, content_type = multipart({**fields, "model": model})
    elif fields:  # /upstream: the body as JSON, when there is one
        body, content_type = json.dumps(fields).encode(), "application/json"
    return read_call(path, content_type, body, max_bytes, method, query)


def multipart(fields: Mapping[str, Any]) -> tuple[bytes, str]:
    """A multipart/form-data body (RFC 7578): text fields, and files given as ``{"dataBase64": ...}`` with an
    optional ``filename`` and ``contentType``."""
    boundary = f"gpulane-{uuid.uuid4().hex}"
    parts = []
    for name, value in fields.items():
        disposition = f'form-data; name="{_quoted(name)}"'
        if isinstance(value, dict) and FILE_DATA in value:
            try:
                data = base64.b64decode(str(value[FILE_DATA]), validate=True)
            except (binascii.Error, ValueError):
                raise CallError(400, f"body.{name}.{FILE_DATA} is not base64") from None
            disposition += f'; filename="{_quoted(str(value.get("filename") or name))}"'
            kind = value.get("contentType") or "application/octet-stream"
            head = f"Content-Disposition: {disposition}\r\nContent-Type: {kind}"
        else:
            data, head = _text(value).encode(), f"Content-Disposition: {disposition}"
        parts.append(f"--{boundary}\r\n{head}\r\n\r\n".encode() + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", " ").replace("\n", " ")
