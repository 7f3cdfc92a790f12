"""Unit tests of gpulane/bridge/catalog.py: aliases, useModelName and priority passthrough, alone and
through the bridge to an echoing backend."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from gpulane.api.resources import GpuModelSpec
from gpulane.bridge.calls import CallError, read_call
from gpulane.bridge.catalog import Catalog, ServedModel, outgoing, shaped

from .test_bridge_routes import AUTH, bridged

QWEN = ServedModel("qwen-7b", aliases=("gpt-4o", "qwen"), use_model_name="Qwen/Qwen2.5-7B-Instruct")
VLLM = ServedModel("vllm", aliases=("fast",), priority_passthrough="LowerFirst")
SGLANG = ServedModel("sglang", priority_passthrough="HigherFirst")


def gpumodel(name: str, **spec: object) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"image": "img", **spec}}


def test_a_gpumodel_gives_its_aliases_and_rewrites() -> None:
    body = gpumodel("q", aliases=["a", "b"], useModelName="served", priorityPassthrough="HigherFirst")
    assert ServedModel.of(body) == ServedModel("q", ("a", "b"), "served", "HigherFirst")
    broken = gpumodel("x", aliases="not a list")
    assert ServedModel.of(broken) == ServedModel("x"), "an invalid spec is served by its name alone"
    # ... but keeps its passthrough (review M2: the spec failing open let a caller's priority through).
    unchecked = gpumodel("v", aliases="not a list", priorityPassthrough="LowerFirst")
    assert ServedModel.of(unchecked) == ServedModel("v", priority_passthrough="LowerFirst")
    assert ServedModel.of(gpumodel("w", priorityPassthrough="Sideways")) == ServedModel("w")


@pytest.mark.parametrize(
    ("raw", "sent"),
    [
        (b'{"prompt": "x", "priority": -1000}', {"prompt": "x", "priority": -100}),
        (b'{"prompt": "x"}', {"prompt": "x", "priority": -100}),
        (b"not json", None),  # a form, bytes: passed as they are
        (b"[1, 2]", None),
    ],
)
def test_an_upstream_json_body_gets_the_effective_priority_too(raw: bytes, sent: object) -> None:
    """Review M2: /upstream/<model>/v1/chat/completions reaches the same server; its body's own priority
    must not jump the server's queue either."""
    call = read_call("/upstream/vllm/v1/chat/completions", "application/json", raw, 1000, "POST")
    body, target = outgoing(call, VLLM, 100)
    assert target == "/v1/chat/completions"
    assert (json.loads(body) if sent is not None else body) == (sent if sent is not None else raw)


def test_names_resolve_to_their_model_and_a_models_own_name_wins_over_an_alias() -> None:
    shadow = ServedModel("shadow", aliases=("qwen-7b", "only-mine"))
    catalog = Catalog([QWEN, VLLM, shadow])
    assert catalog.resolve("qwen-7b") is QWEN and catalog.resolve("gpt-4o") is QWEN
    assert catalog.resolve("fast") is VLLM and catalog.resolve("only-mine") is shadow
    assert "qwen" in catalog and "nope" not in catalog
    with pytest.raises(CallError) as err:
        catalog.resolve("nope")
    assert err.value.status == 404 and err.value.code == "model_not_found"


def test_an_alias_two_models_claim_is_refused_naming_both() -> None:
    catalog = Catalog([ServedModel("a", aliases=("chat",)), ServedModel("b", aliases=("chat",))])
    with pytest.raises(CallError) as err:
        catalog.resolve("chat")
    assert err.value.status == 400 and err.value.code == "ambiguous_model"
    assert "'chat' is an alias of a and b" in str(err.value)
    assert [e["id"] for e in catalog.listing(0)] == ["a", "b"], "an ambiguous alias is not listed"


def test_the_listing_has_each_model_then_each_alias_as_llama_swap_lists_them() -> None:
    entries = Catalog([VLLM, QWEN]).listing(1700000000)
    assert [(e["id"], e.get("aliasOf")) for e in entries] == [
        ("qwen-7b", None),
        ("vllm", None),
        ("fast", "vllm"),
        ("gpt-4o", "qwen-7b"),
        ("qwen", "qwen-7b"),
    ]
    assert all(e["object"] == "model" and e["created"] == 1700000000 for e in entries)


def _json_call(payload: dict[str, object]) -> object:
    return read_call("/v1/chat/completions", "application/json", json.dumps(payload).encode(), 10_000)


def test_use_model_name_rewrites_the_json_model_and_the_query_model() -> None:
    body, target = outgoing(_json_call({"model": "gpt-4o", "messages": []}), QWEN, 50)  # type: ignore[arg-type]
    assert json.loads(body) == {"model": "Qwen/Qwen2.5-7B-Instruct", "messages": []}, "no priority without opt-in"
    assert target == "/v1/chat/completions"
    query = read_call("/sdapi/v1/loras", "", b"", 100, "GET", "model=qwen&refresh=1")
    assert outgoing(query, QWEN, 0)[1] == "/sdapi/v1/loras?model=Qwen%2FQwen2.5-7B-Instruct&refresh=1"


def test_an_untouched_call_passes_byte_for_byte() -> None:
    raw = b'{"model":"m",  "messages":[]}'
    call = read_call("/v1/chat/completions", "application/json", raw, 100)
    assert outgoing(call, ServedModel("m"), 100) == (raw, "/v1/chat/completions")


@pytest.mark.parametrize(("model", "priority", "sent"), [(VLLM, 100, -100), (VLLM, -50, 50), (SGLANG, 100, 100)])
def test_priority_passthrough_sends_the_effective_priority_in_the_servers_sense(
    model: ServedModel, priority: int, sent: int
) -> None:
    """vLLM serves lower values first, SGLang higher: gpulane's higher priority is served first by both. The
    caller's own "priority" in the body is replaced: it could otherwise jump the server's queue."""
    body, _ = outgoing(_json_call({"model": model.name, "priority": -1000}), model, priority)  # type: ignore[arg-type]
    assert json.loads(body)["priority"] == sent


def test_through_the_bridge_an_alias_queues_the_model_and_the_server_gets_its_own_name() -> None:
    async def scenario() -> None:
        async with bridged(Catalog([QWEN, ServedModel("m"), VLLM])) as (http, seen, queue):
            resp = await http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": []}, headers=AUTH)
            assert resp.status == 200, await resp.text()
            fast = {"model": "fast", "messages": [], "priority": -9999}
            urgent = {**AUTH, "X-LlamaSwap-Priority": "100"}
            assert (await http.post("/v1/chat/completions", json=fast, headers=urgent)).status == 200
            listed = await (await http.get("/v1/models", headers=AUTH)).json()
        assert [s.model for s in queue.submitted] == ["qwen-7b", "vllm"], "jobs name the GpuModel"
        assert json.loads(seen[0]["body"])["model"] == "Qwen/Qwen2.5-7B-Instruct"
        assert json.loads(seen[1]["body"]) == {"model": "fast", "messages": [], "priority": -100}
        assert {e["id"] for e in listed["data"]} == {"qwen-7b", "m", "vllm", "gpt-4o", "qwen", "fast"}

    asyncio.run(scenario())


def test_filters_strip_then_set_fields_and_never_touch_model_or_priority() -> None:
    """Issue 33, llama-swap's filters.stripParams and setParams: a model whose server must not get the callers'
    sampling knobs, and one that always runs with a given one. The operator's choice wins over the caller's."""
    given = {"top_k": 40, "model": "elsewhere", "priority": 9, "temperature": 0.2}
    spec = {"image": "i", "useModelName": "served", "priorityPassthrough": "LowerFirst",
            "filters": {"stripParams": ["temperature", "top_p"], "setParams": given}}  # fmt: skip
    model = ServedModel.of({"metadata": {"name": "m"}, "spec": spec})
    call = _json_call({"model": "m", "temperature": 1.5, "top_p": 0.1, "priority": -1000, "messages": []})
    body, _ = outgoing(call, model, 50)  # type: ignore[arg-type]
    assert json.loads(body) == {"model": "served", "messages": [], "temperature": 0.2, "top_k": 40, "priority": -50}
    assert shaped({"top_p": 1, "n": 2}, model, 0) == {"n": 2, "top_k": 40, "temperature": 0.2, "priority": 0}
    # A filter with nothing to change still passes an unfiltered model's call byte for byte.
    raw = b'{"model":"m",  "messages":[]}'
    assert outgoing(read_call("/v1/chat/completions", "application/json", raw, 100), ServedModel("m"), 1)[0] == raw


def test_a_filter_that_strips_gpulanes_own_fields_is_refused() -> None:
    with pytest.raises(ValidationError, match="stripParams: model, priority are gpulane's"):
        GpuModelSpec.model_validate({"image": "i", "filters": {"stripParams": ["priority", "model"]}})
