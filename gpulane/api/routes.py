"""What gpulane routes, as llama-swap (v250, ``internal/server/server.go``) routes it: each path, where
the call names its model, and the path the model server gets. docs/bridge.md has the whole table, with
llama-swap's routes that gpulane answers itself or leaves out.

One table for every way a call reaches a model: the bridge's calls, a GpuJob's ``spec.request`` and a
chain's steps (the CRD's rule and admission check them against it, and the executor sends them by it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

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


# A job's request path: segments of plain characters, so no '.', '..' or empty segment (a client would
# resolve it into another path than the one judged), no query and no fragment.
PLAIN_PATH = r"^(/[A-Za-z0-9_~-][A-Za-z0-9_.~-]*)+$"
JobMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
JOB_METHODS: tuple[str, ...] = get_args(JobMethod)
# /upstream/<model>/<path>: a model segment and at least one segment of the server's path.
UPSTREAM_PATH = r"^/upstream/[^/]+/.+$"


def fixed_routes() -> list[str]:
    """Every fixed route as ``METHOD path``: what a job's request may name besides /upstream."""
    return sorted(f"{method} {path}" for method, path in TABLE)


def routed_for_jobs(method: str, path: str) -> bool:
    """Whether a job's request may name ``method path``: as the CRD's rule says (``api.resources.ROUTE_RULE``)."""
    if path.startswith(UPSTREAM):
        return re.match(UPSTREAM_PATH, path) is not None
    return (method, path) in TABLE


def job_route(method: str, path: str, model: str) -> Route:
    """The route of a job's request for ``model``, or a ValueError saying why it has none."""
    found = route(method, path)
    if found is None or not routed_for_jobs(method, path):
        raise ValueError(f"{method} {path} is not a route gpulane sends: use one of the bridge's routes "
                         "(docs/bridge.md) or /upstream/<model>/<path>")  # fmt: skip
    if found.model_from == "path" and found.model != model:
        raise ValueError(f"{path} reaches another model's server: a job of {model} uses /upstream/{model}/<path>")
    return found
