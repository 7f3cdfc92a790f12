"""The models the bridge serves, as the GpuModels describe them: the names a call may use (a model's own
and its aliases), and what the bridge changes in a call's body before the server gets it (the model's
``useModelName`` and ``priorityPassthrough``, docs/models.md#what-the-bridge-sends).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode

from pydantic import ValidationError

from gpulane.api.contract import Body
from gpulane.api.resources import OWN_FIELDS, GpuModelSpec, Ticket
from gpulane.api.shards import shard_of
from gpulane.bridge.calls import Call, CallError

PASSTHROUGH = ("LowerFirst", "HigherFirst")


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str  # the GpuModel's: what its jobs name
    aliases: tuple[str, ...] = ()
    use_model_name: str | None = None
    priority_passthrough: str | None = None  # "LowerFirst" (vLLM) or "HigherFirst" (SGLang)
    strip_params: tuple[str, ...] = ()  # filters.stripParams: fields removed from a call's JSON body
    set_params: tuple[tuple[str, Any], ...] = ()  # filters.setParams: fields set in it (model, priority never)
    ticket: Ticket | None = None  # the server answers with a ticket (bridge/tickets.py)
    shard: str | None = None  # the shard that serves it (gpulane.io/shard): its jobs are created there

    @classmethod
    def of(cls, body: Body) -> ServedModel:
        """From a GpuModel; one whose spec does not validate is still served by its name, as the operator
        decides whether it runs (its Accepted condition says why not)."""
        name, shard = body["metadata"]["name"], shard_of(body)
        raw = body.get("spec") or {}
        try:
            spec = GpuModelSpec.model_validate(raw)
        except ValidationError:  # its passthrough still holds: a caller's own priority must not reach the server
            passthrough = raw.get("priorityPassthrough") if isinstance(raw, dict) else None
            return cls(name, priority_passthrough=passthrough if passthrough in PASSTHROUGH else None, shard=shard)
        filters = spec.filters
        strip = tuple(filters.strip_params or ()) if filters else ()
        given = (filters.set_params or {}) if filters else {}
        put = tuple((k, v) for k, v in given.items() if k not in OWN_FIELDS)
        return cls(name, tuple(spec.aliases or ()), spec.use_model_name, spec.priority_passthrough, strip, put,
                   spec.ticket, shard)  # fmt: skip


class Catalog:
    """Names to models. A model's own name wins over another model's alias of the same text; an alias
    two models claim is ambiguous, and a call that uses it is refused, naming both."""

    def __init__(self, models: Iterable[ServedModel]) -> None:
        self.models = {m.name: m for m in models}
        self._aliases: dict[str, list[str]] = {}
        for model in self.models.values():
            for alias in model.aliases:
                if alias not in self.models and model.name not in self._aliases.setdefault(alias, []):
                    self._aliases[alias].append(model.name)

    @classmethod
    def of(cls, names: Iterable[str]) -> Catalog:
        """Models known by their names alone."""
        return cls(ServedModel(name) for name in names)

    def __contains__(self, name: object) -> bool:
        return name in self.models or name in self._aliases

    def resolve(self, name: str) -> ServedModel:
        """The model a call's ``name`` means, or a CallError (404 unknown, 400 ambiguous)."""
        if name in self.models:
            return self.models[name]
        claimed = sorted(self._aliases.get(name, ()))
        if len(claimed) == 1:
            return self.models[claimed[0]]
        if claimed:
            raise CallError(400, f"the model name {name!r} is an alias of {' and '.join(claimed)}; call one of them "
                            "by its own name", code="ambiguous_model", param="model")  # fmt: skip
        raise CallError(404, f"the model {name!r} does not exist", code="model_not_found", param="model")

    def listing(self, created: int) -> list[dict[str, Any]]:
        """``/v1/models``' entries: each model, then each of its aliases as an entry of its own, as llama-swap
        lists them with includeAliasesInList (an alias entry names its model in ``aliasOf``)."""
        entries: list[dict[str, Any]] = []
        for name in sorted(self.models):
            entries.append({"id": name, "object": "model", "created": created, "owned_by": "gpulane"})
        for alias, names in sorted(self._aliases.items()):
            if len(names) == 1:
                entries.append({"id": alias, "object": "model", "created": created, "owned_by": "gpulane",
                                "aliasOf": names[0]})  # fmt: skip
        return entries


def outgoing(call: Call, model: ServedModel, priority: int) -> tuple[bytes, str]:
    """The body and the path (with its query) that the model server gets for ``call``.

    A JSON body's ``model`` becomes the model's ``useModelName``, its ``filters`` apply (``shaped``), and
    with ``priorityPassthrough`` its ``priority`` becomes the call's effective priority (after any cap), in the
    server's sense: negated for LowerFirst servers, as is for HigherFirst ones. A caller's own ``priority``
    never reaches such a server, so it cannot jump the server's queue, not through /upstream either. A
    query's ``model`` parameter gets the ``useModelName`` too; forms otherwise pass as they are."""
    body, target = call.body, call.target
    reshapes = bool(model.priority_passthrough or model.strip_params or model.set_params)
    if call.source == "json" and (model.use_model_name or reshapes):
        payload = json.loads(body)  # read_call checked that it is a JSON object
        if model.use_model_name:
            payload["model"] = model.use_model_name
        body = json.dumps(shaped(payload, model, priority)).encode()
    elif call.source == "path" and reshapes and (payload := _json_object(body)) is not None:
        body = json.dumps(shaped(payload, model, priority)).encode()
    elif call.source == "query" and model.use_model_name:
        path, _, query = target.partition("?")
        pairs = [(k, model.use_model_name if k == "model" else v) for k, v in parse_qsl(query, keep_blank_values=True)]
        target = f"{path}?{urlencode(pairs)}"
    return body, target


def shaped(payload: dict[str, Any], model: ServedModel, priority: int) -> dict[str, Any]:
    """``payload`` as the server gets it: the model's ``filters`` (its ``stripParams`` removed, then its
    ``setParams`` set), and for a model with ``priorityPassthrough`` the ``priority`` in the server's sense
    (negated for LowerFirst), replacing whatever the caller put there."""
    out = {k: v for k, v in payload.items() if k not in model.strip_params} | dict(model.set_params)
    if model.priority_passthrough:
        out["priority"] = -priority if model.priority_passthrough == "LowerFirst" else priority
    return out


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None
