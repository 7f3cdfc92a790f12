"""An incoming OpenAI call, read and judged before anything is created: its route, model and mode.

Everything that can refuse a call is decided here or in ``keys.py``, before any response header is
sent: once a 200 event stream has started, a 4xx is no longer possible.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

# Routed by the JSON body's "model" field.
JSON_PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/images/generations",
    "/v1/audio/speech",
    "/v1/responses",
)
# Routed by the multipart form's "model" field.
MULTIPART_PATHS = ("/v1/audio/transcriptions", "/v1/images/edits")
# The "model" part of a multipart form: its header lines (never empty), a blank line, then its value.
_MODEL_FIELD = re.compile(rb'name="model"\r\n(?:[^\r\n]+\r\n)*\r\n([^\r\n]*)\r\n')


class CallError(Exception):
    """A call refused before any GpuJob exists; rendered in OpenAI's error format."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, retry_after: int | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.kind, self.code, self.param, self.retry_after = status, kind, code, param, retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True, slots=True)
class Call:
    path: str
    model: str
    stream: bool
    body: bytes
    content_type: str


def read_call(path: str, content_type: str, body: bytes, max_bytes: int) -> Call:
    """The call's route, model and streaming mode, or a CallError saying what is wrong with it."""
    if len(body) > max_bytes:
        raise CallError(413, f"request body of {len(body)} bytes is over the limit of {max_bytes}", code="too_large")
    if path in MULTIPART_PATHS:
        if not content_type.startswith("multipart/form-data"):
            raise CallError(400, f"{path} takes multipart/form-data")
        match = _MODEL_FIELD.search(body)
        if match is None or not match[1].strip():
            raise CallError(400, "the form has no 'model' field", param="model")
        return Call(path, match[1].strip().decode(errors="replace"), False, body, content_type)
    if path not in JSON_PATHS:
        raise CallError(404, f"unknown endpoint {path}", code="unknown_url")
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
    return Call(path, model, stream, body, "application/json")
