"""What the bridge routes, as llama-swap (v250, ``internal/server/server.go``) routes it: each path, where
the call names its model, and the path the model server gets. docs/bridge.md has the whole table, with
llama-swap's routes that gpulane answers itself or leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Where a route finds its model: the JSON body's "model", the multipart form's "model" field, the query's
# ``model`` parameter, or the path itself (/upstream/<model>/...).
ModelFrom = Literal["json", "form", "query", "path"]

# POST, the JSON body's "model": OpenAI's, Anthropic's messages, llama-server's own, image servers'.
JSON_ROUTES = (
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/embeddings",
    "/reranking",
    "/rerank",
    "/v1/rerank",
    "/v1/reranking",
    "/infill",
    "/completion",
    "/v1/audio/speech",
    "/v1/audio/voices",
    "/v1/images/generations",
    "/sdapi/v1/txt2img",
    "/sdapi/v1/img2img",
)
# POST, versionless aliases: the backend gets the path without its "/v".
VERSIONLESS_ROUTES = (
    "/v/chat/completions",
    "/v/responses",
    "/v/completions",
    "/v/messages",
    "/v/messages/count_tokens",
    "/v/embeddings",
    "/v/rerank",
    "/v/reranking",
)
# POST, multipart/form-data: the form's "model" field.
FORM_ROUTES = ("/v1/audio/transcriptions", "/v1/images/edits")
# GET, the query's "model" parameter.
QUERY_ROUTES = ("/v1/audio/voices", "/sdapi/v1/loras")
# Any method: /upstream/<model>/<path> reaches <path> on the model's server, queued like any call.
UPSTREAM = "/upstream/"


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    model_from: ModelFrom
    upstream: str  # the path the model server gets
    model: str | None = None  # named by the path (/upstream routes)


TABLE: dict[tuple[str, str], Route] = {
    **{("POST", p): Route("POST", "json", p) for p in JSON_ROUTES},
    **{("POST", p): Route("POST", "json", p.removeprefix("/v")) for p in VERSIONLESS_ROUTES},
    **{("POST", p): Route("POST", "form", p) for p in FORM_ROUTES},
    **{("GET", p): Route("GET", "query", p) for p in QUERY_ROUTES},
}


def route(method: str, path: str) -> Route | None:
    """The route of ``method path``, or None when the bridge does not route it."""
    if path.startswith(UPSTREAM):
        model, _, rest = path[len(UPSTREAM) :].partition("/")
        return Route(method, "path", "/" + rest, model) if model else None
    return TABLE.get((method, path))


def paths(method: str) -> list[str]:
    """The fixed paths routed for ``method`` (the /upstream prefix aside)."""
    return sorted(p for m, p in TABLE if m == method)
