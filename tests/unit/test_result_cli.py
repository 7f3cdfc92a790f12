"""``gpulane result JOB``: a job's answer from its ConfigMap, or streamed from the bridge's ``/results`` endpoint
and checked against the size and SHA-256 the job recorded.

The command runs as it does for a user (``gpulane.cli.main``, a real kubeconfig, the real kubernetes client),
in a thread, against two local servers: an apiserver that answers only the reads the command makes (a
GpuJob, a ConfigMap) and the bridge's real ``ResultReader`` over a real ``ResultStore`` in a temporary
directory, whose token and access reviews are stubbed as in test_bridge_results.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes import client

from gpulane.api.contract import BRIDGE_AUDIENCE
from gpulane.api.resources import GROUP, VERSION
from gpulane.bridge.results import ResultReader, ResultStore
from gpulane.cli import main
from gpulane.executor.manifests import BINARY_KEY, RESULT_KEY
from gpulane.kube.client import Gone

NS = "team-a"
ANSWER = b"a rendered video \x00\xff\x10"  # not UTF-8: the bytes must come back as they are
SHA = hashlib.sha256(ANSWER).hexdigest()
FOLDER = f"{NS}/film-12345678"
# Who holds which token, for the bridge's TokenReview; each may get the jobs of the namespaces in its groups.
TOKENS = {"reader-token": ("reader", [NS]), "kube-token": ("me", [NS]), "stranger-token": ("stranger", ["team-b"])}


class Apiserver:
    """The Kubernetes API reads of ``gpulane result``, and the Authorization header each one came with."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.config_maps: dict[str, dict[str, Any]] = {}
        self.authorizations: list[str | None] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/gpujobs/{{name}}", self.get_job)
        app.router.add_get("/api/v1/namespaces/{ns}/configmaps/{name}", self.get_config_map)
        return app

    async def get_job(self, request: web.Request) -> web.Response:
        return self._get(request, self.jobs, "gpujobs")

    async def get_config_map(self, request: web.Request) -> web.Response:
        return self._get(request, self.config_maps, "configmaps")

    def _get(self, request: web.Request, objects: dict[str, dict[str, Any]], kind: str) -> web.Response:
        self.authorizations.append(request.headers.get("Authorization"))
        key = f"{request.match_info['ns']}/{request.match_info['name']}"
        if key not in objects:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                      "message": f'{kind} "{request.match_info["name"]}" not found'}  # fmt: skip
            return web.json_response(status, status=404)
        return web.json_response(objects[key])


class BridgeKube:
    """What the bridge asks the apiserver while serving ``/results``: who holds a token, whether they may get
    the job, and the job (the same objects the apiserver above serves)."""

    def __init__(self, jobs: dict[str, dict[str, Any]]) -> None:
        self.jobs = jobs
        self.tokens: list[str] = []

    async def authenticate(self, token: str, audience: str) -> tuple[str, list[str]] | None:
        assert audience == BRIDGE_AUDIENCE
        self.tokens.append(token)
        return TOKENS.get(token)

    async def may_read_jobs(self, user: str, groups: list[str], namespace: str, name: str | None = None) -> bool:
        return namespace in groups

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.jobs[f"{namespace}/{name}"]
        except KeyError:
            raise Gone(name) from None


class World:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp_path, self.monkeypatch = tmp_path, monkeypatch
        self.apiserver = Apiserver()
        self.bridge_kube = BridgeKube(self.apiserver.jobs)
        self.volume = tmp_path / "volume"
        self.volume.mkdir()
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.kubeconfig_token: str | None = "kube-token"
        self.bridge_app: web.Application | None = None  # else the real ResultReader
        self.insecure = True  # the test bridge is plain http: say so, as a user must

    def job(self, name: str, status: dict[str, Any] | None) -> None:
        body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuJob",
                                "metadata": {"name": name, "namespace": NS, "uid": "12345678-aaaa"}}  # fmt: skip
        if status is not None:
            body["status"] = status
        self.apiserver.jobs[f"{NS}/{name}"] = body

    def volume_job(self, name: str = "film", stored: bytes = ANSWER, size: int = len(ANSWER), sha: str = SHA) -> None:
        """A job whose answer is on the results volume: ``stored`` in the file, ``size`` and ``sha`` recorded."""
        (self.volume / FOLDER).mkdir(parents=True, exist_ok=True)
        (self.volume / FOLDER / "answer").write_bytes(stored)
        path = f"{FOLDER}/answer"
        self.job(name, {"phase": "Succeeded", "result": {"volume": {"path": path, "bytes": size, "sha256": sha},
                                                         "status": 200, "contentType": "audio/mpeg"}})  # fmt: skip

    def config_map_job(self, name: str, key: str, config_map: dict[str, Any]) -> None:
        cm = f"{name}-result-12345678"
        result = {"configMap": cm, "key": key, "status": 200, "contentType": "application/json"}
        self.job(name, {"phase": "Succeeded", "result": result})
        meta = {"name": cm, "namespace": NS}
        self.apiserver.config_maps[f"{NS}/{cm}"] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta,
            **config_map,
        }

    def _kubeconfig(self, server: str) -> Path:
        user = f"{{token: {self.kubeconfig_token}}}" if self.kubeconfig_token else "{}"
        path = self.tmp_path / "kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: here\n"
            f"clusters: [{{name: here, cluster: {{server: '{server}'}}}}]\n"
            f"users: [{{name: me, user: {user}}}]\n"
            "contexts: [{name: here, context: {cluster: here, user: me}}]\n"
        )
        return path

    def result(self, *args: str, env: dict[str, str] | None = None) -> int:
        """``gpulane result ARGS --kubeconfig ...`` with ``env`` set; ``{bridge}`` in an argument or in a
        variable's value is the bridge's URL."""

        async def scenario() -> int:
            bridge_app = self.bridge_app
            if bridge_app is None:
                bridge_app = web.Application()
                ResultReader(self.bridge_kube, ResultStore(self.volume)).add_routes(bridge_app)
            async with TestServer(self.apiserver.app()) as api, TestServer(bridge_app) as bridge:
                kubeconfig = self._kubeconfig(f"http://{api.host}:{api.port}")
                url = f"http://{bridge.host}:{bridge.port}"
                for var, value in (env or {}).items():
                    self.monkeypatch.setenv(var, value.format(bridge=url))
                argv = ["result", *(a.format(bridge=url) for a in args), *(["--insecure"] if self.insecure else [])]
                return await asyncio.to_thread(main, [*argv, "--kubeconfig", str(kubeconfig)])

        return asyncio.run(scenario())

    def files(self) -> list[str]:
        """Everything in the output directory, partial files included."""
        return sorted(p.name for p in self.out.iterdir())


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    for var in ("GPULANE_BRIDGE_URL", "GPULANE_TOKEN", "KUBECONFIG"):
        monkeypatch.delenv(var, raising=False)
    # load_kube_config sets the kubernetes client's default configuration: other tests must not see ours.
    monkeypatch.setattr(client.Configuration, "_default", client.Configuration._default)
    return World(tmp_path, monkeypatch)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ConfigMap answers: read with the kubeconfig's own credentials, no bridge needed.


def test_a_text_answer_is_read_from_its_config_map_to_standard_output(world: World, capfd: pytest.CaptureFixture[str]):
    world.config_map_job("chat", RESULT_KEY, {"data": {RESULT_KEY: '{"choices": ["héllo"]}'}})
    assert world.result("chat", "-n", NS) == 0
    out, err = capfd.readouterr()
    assert out == '{"choices": ["héllo"]}'
    assert err == ""
    assert world.apiserver.authorizations == ["Bearer kube-token", "Bearer kube-token"], "the job, then its ConfigMap"


def test_a_binary_answer_is_read_from_binary_data_byte_for_byte(world: World, capfd: pytest.CaptureFixture[str]):
    world.config_map_job("speech", BINARY_KEY, {"binaryData": {BINARY_KEY: base64.b64encode(ANSWER).decode()}})
    assert world.result(f"{NS}/speech", "-o", str(world.out / "speech.mp3")) == 0
    assert (world.out / "speech.mp3").read_bytes() == ANSWER
    assert world.files() == ["speech.mp3"], "no partial file stays beside it"
    assert capfd.readouterr() == ("", "")


def test_an_empty_text_answer_is_an_answer(world: World, capfd: pytest.CaptureFixture[str]):
    world.config_map_job("quiet", RESULT_KEY, {"data": {RESULT_KEY: ""}})
    assert world.result(f"{NS}/quiet", "-o", str(world.out / "quiet.json")) == 0
    assert (world.out / "quiet.json").read_bytes() == b""


def test_a_config_map_without_the_answers_key_fails(world: World, capfd: pytest.CaptureFixture[str]):
    """Not an empty answer written with exit status 0: the answer is missing."""
    world.config_map_job("chat", RESULT_KEY, {"data": {"something-else": "x"}})
    assert world.result(f"{NS}/chat", "-o", str(world.out / "chat.json")) == 1
    err = capfd.readouterr().err
    assert (
        err == f"error: ConfigMap {NS}/chat-result-12345678 has no key '{RESULT_KEY}': the job's answer is not there\n"
    )
    assert world.files() == []


def test_a_config_map_that_is_gone_fails_and_leaves_no_file(world: World, capfd: pytest.CaptureFixture[str]):
    world.config_map_job("chat", RESULT_KEY, {"data": {RESULT_KEY: "{}"}})
    world.apiserver.config_maps.clear()  # collected, say
    assert world.result(f"{NS}/chat", "-o", str(world.out / "chat.json")) == 1
    assert (
        capfd.readouterr().err == f"error: ConfigMap {NS}/chat-result-12345678 is gone, and the job's answer with it\n"
    )
    assert world.files() == [], "not an empty file, as if the answer were empty"


# Jobs with no answer to read.


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (None, "it is Pending"),
        ({"phase": "Dispatching"}, "it is Dispatching"),
        ({"phase": "Running", "lane": "gpu-0"}, "it is Running"),
        ({"phase": "Failed", "message": "the backend answered 500"}, "it is Failed"),
    ],
)
def test_a_job_without_an_answer_says_its_phase(
    world: World, capfd: pytest.CaptureFixture[str], status: dict[str, Any] | None, says: str
):
    world.job("film", status)
    assert world.result(f"{NS}/film", "-o", str(world.out / "film.out"), "--bridge", "{bridge}") == 1
    assert capfd.readouterr().err == f"error: GpuJob {NS}/film has no answer (yet): {says}\n"
    assert world.files() == []
    assert world.bridge_kube.tokens == [], "the bridge is not asked"


def test_a_job_that_does_not_exist(world: World, capfd: pytest.CaptureFixture[str]):
    assert world.result("ghost", "-n", NS, "-o", str(world.out / "ghost.out")) == 1
    assert capfd.readouterr().err == f"error: no GpuJob {NS}/ghost\n"
    assert world.files() == []


# Answers on the results volume, through the bridge.


def test_a_volume_answer_that_matches_is_written_whole(world: World, capfd: pytest.CaptureFixture[str]):
    world.volume_job()
    target = world.out / "film.mp3"
    assert world.result(f"{NS}/film", "-o", str(target), "--bridge", "{bridge}", "--token", "reader-token") == 0
    assert target.read_bytes() == ANSWER
    assert world.files() == ["film.mp3"]
    assert capfd.readouterr() == ("", f"{NS}/film: {len(ANSWER)} bytes, sha256 {SHA} (as recorded)\n")
    assert world.bridge_kube.tokens == ["reader-token"], "--token, not the kubeconfig's, goes to the bridge"


def test_a_volume_answer_goes_to_standard_output_without_a_file(
    world: World, capfdbinary: pytest.CaptureFixture[bytes]
):
    world.volume_job()
    assert world.result(f"{NS}/film", "--bridge", "{bridge}/", "--token", "reader-token") == 0  # a trailing /
    out, err = capfdbinary.readouterr()
    assert out == ANSWER
    assert err.endswith(b"(as recorded)\n")


def test_the_bridge_and_token_may_come_from_the_environment(world: World, capfd: pytest.CaptureFixture[str]):
    world.volume_job()
    world.kubeconfig_token = None
    env = {"GPULANE_BRIDGE_URL": "{bridge}", "GPULANE_TOKEN": "reader-token"}
    assert world.result(f"{NS}/film", "-o", str(world.out / "film.mp3"), env=env) == 0
    assert world.bridge_kube.tokens == ["reader-token"]
    assert (world.out / "film.mp3").read_bytes() == ANSWER
    assert capfd.readouterr().err.endswith("(as recorded)\n")


def test_the_kubeconfig_token_never_goes_to_the_bridge(world: World, capfd: pytest.CaptureFixture[str]):
    """Review M7: the kubeconfig's token (an admin's, say) is valid at the apiserver; it is never sent."""
    world.volume_job()
    assert world.kubeconfig_token == "kube-token"
    assert world.result(f"{NS}/film", "-o", str(world.out / "film.mp3"), "--bridge", "{bridge}") == 1
    assert capfd.readouterr().err == (
        "error: the bridge needs a token: give --token (`kubectl create token NAME --audience gpulane-bridge`)"
        " or $GPULANE_TOKEN\n"
    )
    assert world.bridge_kube.tokens == [] and world.files() == []


def test_a_token_goes_over_plain_http_only_when_the_user_says_so(world: World, capfd: pytest.CaptureFixture[str]):
    world.volume_job()
    world.insecure = False
    assert world.result(f"{NS}/film", "--bridge", "{bridge}", "--token", "reader-token") == 1
    err = capfd.readouterr().err
    assert err.startswith("error: http://127.0.0.1:") and "is plain http" in err and "--insecure" in err, err
    assert world.bridge_kube.tokens == [], "nothing was sent"


def test_a_volume_answer_needs_the_bridges_url(world: World, capfd: pytest.CaptureFixture[str]):
    world.volume_job()
    assert world.result(f"{NS}/film", "-o", str(world.out / "film.mp3"), "--token", "reader-token") == 1
    assert capfd.readouterr().err == (
        "error: the answer is on the bridge's results volume: give --bridge URL (or $GPULANE_BRIDGE_URL)\n"
    )
    assert world.files() == [], "no empty file"


def test_a_volume_answer_needs_a_token_when_the_kubeconfig_has_none(world: World, capfd: pytest.CaptureFixture[str]):
    world.volume_job()
    world.kubeconfig_token = None  # a user with a client certificate, say
    assert world.result(f"{NS}/film", "-o", str(world.out / "film.mp3"), "--bridge", "{bridge}") == 1
    assert capfd.readouterr().err.startswith("error: the bridge needs a token: give --token")
    assert world.files() == []
    assert world.bridge_kube.tokens == [], "nothing was sent without a token"


def test_a_size_mismatch_fails_and_leaves_no_file(world: World, capfd: pytest.CaptureFixture[str]):
    world.volume_job(size=len(ANSWER) + 1)  # the file was cut short, its checksum as recorded
    assert (
        world.result(f"{NS}/film", "-o", str(world.out / "film.mp3"), "--bridge", "{bridge}", "--token", "reader-token")
        == 1
    )
    assert capfd.readouterr().err == (
        f"error: the answer read ({len(ANSWER)} bytes, sha256 {SHA}) is not the one the job recorded "
        f"({len(ANSWER) + 1} bytes, sha256 {SHA})\n"
    )
    assert world.files() == []


def test_a_checksum_mismatch_fails_and_keeps_the_earlier_file(world: World, capfd: pytest.CaptureFixture[str]):
    changed = bytes([ANSWER[0] ^ 1]) + ANSWER[1:]  # the same size, one bit flipped on the volume
    world.volume_job(stored=changed)
    target = world.out / "film.mp3"
    target.write_bytes(b"an earlier answer")
    assert world.result(f"{NS}/film", "-o", str(target), "--bridge", "{bridge}", "--token", "reader-token") == 1
    assert capfd.readouterr().err == (
        f"error: the answer read ({len(ANSWER)} bytes, sha256 {hashlib.sha256(changed).hexdigest()}) is not the "
        f"one the job recorded ({len(ANSWER)} bytes, sha256 {SHA})\n"
    )
    assert target.read_bytes() == b"an earlier answer", "a wrong answer does not replace it"
    assert world.files() == ["film.mp3"]


def test_a_mismatch_on_standard_output_still_fails(world: World, capfdbinary: pytest.CaptureFixture[bytes]):
    world.volume_job(sha="0" * 64)
    assert world.result(f"{NS}/film", "--bridge", "{bridge}", "--token", "reader-token") == 1
    err = capfdbinary.readouterr().err
    assert err.startswith(b"error: the answer read (") and f"sha256 {'0' * 64})".encode() in err


@pytest.mark.parametrize(
    ("token", "code", "says"),
    [
        ("stranger-token", 403, "stranger may not get GpuJob team-a/film"),
        ("forged-token", 401, "the token was not accepted: it must be one for audience gpulane-bridge"),
    ],
)
def test_a_caller_the_bridge_refuses_gets_its_reason(
    world: World, capfd: pytest.CaptureFixture[str], token: str, code: int, says: str
):
    world.volume_job()
    assert world.result(f"{NS}/film", "-o", str(world.out / "film.mp3"), "--bridge", "{bridge}", "--token", token) == 1
    err = capfd.readouterr().err
    assert err.startswith(f"error: the bridge answered {code}: ") and says in err, err
    assert world.files() == []


def test_an_answer_missing_from_the_volume_is_a_404(world: World, capfd: pytest.CaptureFixture[str]):
    world.volume_job()
    (world.volume / FOLDER / "answer").unlink()  # the volume was replaced, say
    assert (
        world.result(f"{NS}/film", "-o", str(world.out / "film.mp3"), "--bridge", "{bridge}", "--token", "reader-token")
        == 1
    )
    err = capfd.readouterr().err
    assert err.startswith("error: the bridge answered 404: ") and "has no answer on the results volume" in err, err
    assert world.files() == []


@pytest.mark.parametrize("bridge", [f"http://127.0.0.1:{closed_port()}", "127.0.0.1:8090"], ids=["closed", "no-scheme"])
def test_a_bridge_that_cannot_be_read_is_said_so(world: World, capfd: pytest.CaptureFixture[str], bridge: str):
    """A closed port, and a URL without http:// (which urllib refuses with a ValueError, not an OSError)."""
    world.volume_job()
    assert (
        world.result(f"{NS}/film", "-o", str(world.out / "film.mp3"), "--bridge", bridge, "--token", "reader-token")
        == 1
    )
    err = capfd.readouterr().err
    assert err.startswith(f"error: the bridge at {bridge} could not be read: "), err
    assert "Traceback" not in err
    assert world.files() == []


def test_a_chunked_answer_cut_short_is_said_so(world: World, capfd: pytest.CaptureFixture[str]):
    """Through a proxy that re-chunks it, say: a cut-short chunked body raises IncompleteRead, not OSError."""

    async def cut_short(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(ANSWER[:5])
        assert request.transport is not None
        request.transport.abort()
        return resp

    world.volume_job()
    world.bridge_app = web.Application()
    world.bridge_app.router.add_get("/results/{namespace}/{name}", cut_short)
    assert (
        world.result(f"{NS}/film", "-o", str(world.out / "film.mp3"), "--bridge", "{bridge}", "--token", "reader-token")
        == 1
    )
    err = capfd.readouterr().err
    assert (
        err.startswith("error: the bridge at http://127.0.0.1:")
        and "broke off the answer after 5 bytes: IncompleteRead" in err
    ), err
    assert world.files() == []
