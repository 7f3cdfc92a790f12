"""The bridge's judgement of a call before anything is created: keys and identities, bodies and routes."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from gpulane.bridge.calls import CallError, read_call
from gpulane.bridge.keys import Denied, KeyRing, KeysError, KeysFile

from .helpers import until

APP = {"name": "app", "key": "sk-app-000000", "member": "app", "tier": "pro", "maxPriority": 100, "trusted": True,
       "tiers": ["free", "pro"]}  # fmt: skip
BOB = {"name": "bob", "sha256": hashlib.sha256(b"sk-bob-111111").hexdigest(), "member": "bob", "maxPriority": 0}


def ring(anonymous: dict | None = None) -> KeyRing:
    return KeyRing(KeysFile.model_validate({"keys": [APP, BOB], "anonymous": anonymous}))


def test_a_key_maps_to_its_member_tier_and_capped_priority():
    who = ring().identify("Bearer sk-bob-111111", {"X-LlamaSwap-Priority": "interactive"})
    assert (who.key, who.member, who.tier, who.priority, who.requested) == ("bob", "bob", "free", 0, 100)


@pytest.mark.parametrize(("header", "priority"), [(None, 0), ("garbage", 0), ("-100", -100), ("batch", -100),
                                                  ("99999999999999999999999", 100), ("  50 ", 50)])  # fmt: skip
def test_the_priority_header_is_parsed_leniently_and_capped(header, priority):
    headers = {} if header is None else {"X-LlamaSwap-Priority": header}
    assert ring().identify("Bearer sk-app-000000", headers).priority == priority


def test_only_trusted_keys_speak_for_their_users():
    who = ring().identify("Bearer sk-app-000000", {"X-LlamaSwap-Member": "carol", "X-LlamaSwap-Tier": "free"})
    assert (who.member, who.tier) == ("app/carol", "free")
    with pytest.raises(Denied) as err:
        ring().identify("Bearer sk-bob-111111", {"X-LlamaSwap-Member": "carol"})
    assert err.value.status == 403 and "may not set X-LlamaSwap-Member" in str(err.value)
    # Naming oneself is no escalation.
    assert ring().identify("Bearer sk-bob-111111", {"X-LlamaSwap-Member": "bob"}).member == "bob"


def test_a_trusted_key_gives_only_its_own_tiers_and_its_users_count_under_its_member():
    """Issue 16, item 11: trust is bounded by the key's settings, and a forwarded name cannot pose as
    another member (bob, or another application's users)."""
    with pytest.raises(Denied) as err:
        ring().identify("Bearer sk-app-000000", {"X-LlamaSwap-Tier": "max"})
    assert err.value.status == 403 and "may give its users only tier free, pro, not 'max'" in str(err.value)
    own = KeyRing(KeysFile.model_validate({"keys": [{**APP, "tiers": None}]}))
    assert own.identify("Bearer sk-app-000000", {"X-LlamaSwap-Tier": "pro"}).tier == "pro"
    with pytest.raises(Denied, match="only tier pro, not 'free'"):
        own.identify("Bearer sk-app-000000", {"X-LlamaSwap-Tier": "free"})
    assert ring().identify("Bearer sk-app-000000", {"X-LlamaSwap-Member": "bob"}).member == "app/bob"
    assert ring().identify("Bearer sk-app-000000", {"X-LlamaSwap-Member": "app"}).member == "app"
    for bad in ("x" * 127, "tab\there"):
        with pytest.raises(Denied) as err:
            ring().identify("Bearer sk-app-000000", {"X-LlamaSwap-Member": bad})
        assert err.value.status == 400


def test_unknown_and_missing_keys_are_refused_unless_anonymous_access_is_configured():
    for header in ("Bearer sk-wrong-key", "Basic abc", None):
        with pytest.raises(Denied) as err:
            ring().identify(header, {})
        assert err.value.status == 401
    anonymous = ring({"member": "guest", "maxPriority": -100}).identify(None, {"X-LlamaSwap-Priority": "100"})
    assert (anonymous.key, anonymous.member, anonymous.priority) == ("anonymous", "guest", -100)


def test_a_bad_keys_file_is_refused_with_where_and_why(tmp_path: Path):
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n- name: x\n  member: m\n")
    with pytest.raises(KeysError, match="give exactly one of 'key' and 'sha256'"):
        KeyRing.load(path)
    path.write_text("keys: [unclosed")
    with pytest.raises(KeysError, match="not YAML"):
        KeyRing.load(path)
    with pytest.raises(KeysError, match="No such file"):
        KeyRing.load(tmp_path / "absent.yaml")


def test_a_changed_keys_file_replaces_the_keys_and_a_broken_one_keeps_them(tmp_path: Path, caplog):
    """Issue 16, item 13: a revoked key stops working without a restart."""
    path = tmp_path / "keys.yaml"
    path.write_text("keys:\n- {name: a, key: sk-aaaa-0000, member: a}\n- {name: b, key: sk-bbbb-0000, member: b}\n")
    keys = KeyRing.load(path)

    def accepted(key: str) -> bool:
        try:
            keys.identify(f"Bearer {key}", {})
        except Denied:
            return False
        return True

    async def scenario() -> None:
        follower = asyncio.create_task(keys.follow(path, interval=0.01))
        path.write_text("keys:\n- {name: a, key: sk-aaaa-0000, member: a}\n")  # b is revoked
        await until(lambda: not accepted("sk-bbbb-0000"), "the revoked key refused")
        assert accepted("sk-aaaa-0000")
        path.write_text("keys: [unclosed")
        await until(lambda: any("not reloaded" in r.getMessage() for r in caplog.records), "the bad file logged")
        assert accepted("sk-aaaa-0000") and not accepted("sk-bbbb-0000")
        path.unlink()  # a Secret's files are swapped: absent for a moment
        path.write_text("keys:\n- {name: c, key: sk-cccc-0000, member: c}\n")
        await until(lambda: accepted("sk-cccc-0000"), "the new key accepted")
        follower.cancel()

    with caplog.at_level("INFO", logger="gpulane.bridge.keys"):
        asyncio.run(scenario())
    assert "reloaded" in caplog.text and "sk-" not in caplog.text  # keys are never logged


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_a_json_call_is_routed_by_its_model_and_mode():
    call = read_call("/v1/chat/completions", "application/json", body(model="m", stream=True), 1000)
    assert (call.model, call.stream) == ("m", True)


@pytest.mark.parametrize(
    ("path", "content", "status", "message"),
    [
        ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/chat/completions", b"[1, 2]", 400, "must be a JSON object"),
        ("/v1/chat/completions", body(messages=[]), 400, "'model' is required"),
        ("/v1/chat/completions", body(model=7), 400, "'model' is required"),
        ("/v1/chat/completions", body(model="m", stream="yes"), 400, "'stream' must be a boolean"),
        ("/v1/fine_tuning/jobs", body(model="m"), 404, "unknown endpoint"),
        ("/v1/chat/completions", b"x" * 2000, 413, "over the limit of 1000"),
    ],
)
def test_bad_calls_are_refused_with_openai_errors(path, content, status, message):
    with pytest.raises(CallError) as err:
        read_call(path, "application/json", content, 1000)
    assert err.value.status == status and message in str(err.value)
    assert set(err.value.body()["error"]) == {"message", "type", "param", "code"}


def form(*parts: tuple[str, bytes], boundary: str = "XyZ") -> bytes:
    """A multipart/form-data body; each part is (its Content-Disposition parameters, its content)."""
    out = b""
    for params, content in parts:
        out += f"--{boundary}\r\nContent-Disposition: form-data; {params}\r\n".encode()
        if "filename" in params:
            out += b"Content-Type: application/octet-stream\r\n"
        out += b"\r\n" + content + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def test_a_field_lookalike_inside_an_uploaded_file_is_not_the_model():
    """Issue 16, item 10: the form is parsed by its parts, not searched for the text name="model"."""
    trap = b'junk\r\nContent-Disposition: form-data; name="model"\r\n\r\nexpensive\r\nmore'
    body = form(('name="file"; filename="a.wav"', trap), ('name="model"', b"whisper"))
    call = read_call("/v1/audio/transcriptions", 'multipart/form-data; boundary="XyZ"', body, 10_000)
    assert call.model == "whisper"


def test_a_form_field_may_carry_headers_and_binary_content_around_it():
    audio = bytes(range(256)) * 4  # CRs and LFs in the file, but never a delimiter
    body = form(('name="file"; filename="x.wav"', audio), ('name="language"', b"en"), ('name="model"', b"whisper-1"))
    assert read_call("/v1/audio/transcriptions", "multipart/form-data; boundary=XyZ", body, 10_000).model == "whisper-1"


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        ("multipart/form-data", form(('name="model"', b"m")), "has no boundary"),
        ("multipart/form-data; boundary=XyZ", form(('name="model"', b"m" * 300)), "over 253 characters"),
        ("multipart/form-data; boundary=XyZ", form(('name="modelx"', b"m")), "no 'model' field"),
        ("multipart/form-data; boundary=XyZ", b'name="model"\r\n' * 5000, "no 'model' field"),
    ],
)
def test_a_bad_form_is_refused_saying_why(content_type: str, body: bytes, message: str):
    with pytest.raises(CallError, match=message) as err:
        read_call("/v1/images/edits", content_type, body, 1_000_000)
    assert err.value.status == 400


def test_multipart_calls_are_routed_by_their_model_field():
    form = (
        b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF\r\n--b--\r\n'
    )
    call = read_call("/v1/audio/transcriptions", "multipart/form-data; boundary=b", form, 10_000)
    assert (call.model, call.stream) == ("whisper", False)
    with pytest.raises(CallError, match="no 'model' field"):
        read_call("/v1/images/edits", "multipart/form-data; boundary=b", b"--b--\r\n", 10_000)
    with pytest.raises(CallError, match="takes multipart/form-data"):
        read_call("/v1/images/edits", "application/json", body(model="m"), 10_000)
