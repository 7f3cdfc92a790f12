"""The admission webhook on the real apiserver: caps, trusted tier and member, policy validation, and
failing closed. Callers are impersonated with ``kubectl --as`` / ``--as-group``.

The webhook configurations select this test's namespace by a label, so other tests never call it.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulane.admission import cel
from gpulane.admission.configuration import webhook_configurations
from gpulane.api.contract import AUTHOR, AUTHOR_GROUPS, FINALIZER

from .operator_support import API, GROUP, VERSION, OperatorProcess, WebhookProcess, World, free_port, tls_ready
from .support import REPO, Cluster, ServingCert, make_serving_cert, wait_until

pytestmark = pytest.mark.e2e("kwok")

USERS_GROUP = "gpulane-e2e-submitters"
# The e2e operator runs with the local cluster's admin credentials: this is its username.
OPERATOR_USER = "gpulane-admin"
BRIDGE = "bridge"
HOLD = "gpulane.io/e2e-hold"  # a finalizer of the test's own


@contextlib.contextmanager
def callers_installed(world: World) -> Iterator[str]:
    """Labels this test's namespace with a unique tag (yielded), gives the impersonated callers and the
    bridge's ServiceAccount the right to submit GpuJobs, and creates a model; all removed afterwards,
    with the GpuPolicy."""
    tag = f"t{uuid.uuid4().hex[:6]}"  # a letter first: YAML must never read it as a number
    name = f"gpulane-e2e-{tag}"
    cluster = world.cluster
    cluster.kubectl("label", "namespace", world.namespace, f"gpulane.io/admission-test={tag}")
    cluster.kubectl("create", "serviceaccount", BRIDGE, "-n", world.namespace)
    rbac = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [{"apiGroups": ["gpulane.io"], "resources": ["gpujobs", "gpuchains"],
                    "verbs": ["create", "get", "list", "update", "patch", "delete"]},
                   {"apiGroups": ["gpulane.io"], "resources": ["gpujobs/status"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "Group", "name": USERS_GROUP, "apiGroup": "rbac.authorization.k8s.io"},
                      {"kind": "ServiceAccount", "name": BRIDGE, "namespace": world.namespace}]},
    ]  # fmt: skip
    world.apply(*rbac)
    world.model("sdxl")
    try:
        yield tag
    finally:
        for kind in ("clusterrolebinding", "clusterrole"):
            cluster.kubectl("delete", kind, name, "--ignore-not-found")
        cluster.kubectl("delete", "gpupolicy", "default", "--ignore-not-found")


@contextlib.contextmanager
def admission_installed(world: World, port: int, tls: ServingCert, operators: tuple[str, ...] = ()) -> Iterator[None]:
    """Webhook configurations calling 127.0.0.1:port for this test's namespace only, with its callers;
    with ``operators``, the status writes of anyone else go through the webhook too."""
    with callers_installed(world) as tag:
        name = f"gpulane-e2e-{tag}"
        configs = webhook_configurations(
            url=f"https://127.0.0.1:{port}",
            ca_pem=tls.ca_pem,
            namespace_selector={"gpulane.io/admission-test": tag},
            name=name,
            operators=operators,
        )
        world.apply(*configs)
        try:
            yield
        finally:
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                world.cluster.kubectl("delete", kind, name, "--ignore-not-found")


@pytest.fixture
def admission(cluster: Cluster, world: World, tmp_path: Path) -> Iterator[WebhookProcess]:
    """``gpulane webhook`` as its own process, installed for this test's namespace."""
    tls = make_serving_cert(directory=tmp_path)
    hook = WebhookProcess(cluster, tmp_path, tls, "--operator-user", OPERATOR_USER).start()
    try:
        with admission_installed(world, hook.port, tls, operators=(OPERATOR_USER,)):
            yield hook
    finally:
        hook.stop()


def policy(world: World, mode: str = "cap") -> None:
    """Alice and bob are ordinary users (default cap 0); artists may use 100 and get tier pro; the
    bridge's ServiceAccount is trusted and may go up to 1000."""
    admission = {
        "mode": mode,
        "defaultCap": 0,
        "rules": [
            {"name": "artists", "groups": ["artists"], "maxPriority": 100, "tier": "pro"},
            {"name": "bridge", "serviceAccounts": [f"{world.namespace}/{BRIDGE}"], "maxPriority": 1000},
        ],
        "trusted": {"serviceAccounts": [f"{world.namespace}/{BRIDGE}"]},
    }
    world.apply({"apiVersion": API, "kind": "GpuPolicy", "metadata": {"name": "default"},
                 "spec": {"admission": admission}})  # fmt: skip


def submit(world: World, name: str, *as_: str, check: bool = True, **spec: Any) -> Any:
    doc = world.job_doc(name, world.name("sdxl"), **spec)
    return world.cluster.kubectl("apply", "-f", "-", *as_, input=yaml.safe_dump(doc), check=check)


ALICE = ("--as", "alice", "--as-group", USERS_GROUP)


def test_an_untrusted_users_priority_is_capped_with_a_warning(world: World, admission: WebhookProcess) -> None:
    policy(world)
    proc = submit(world, "greedy", *ALICE, priority=1000)
    assert "priority 1000 capped to 0 for user alice (rule: default cap)" in proc.stderr
    job = world.get("greedy")
    assert job["spec"]["priority"] == 0
    assert job["metadata"]["annotations"]["gpulane.io/requested-priority"] == "1000"
    assert (job["spec"]["member"], job["spec"]["tier"]) == ("alice", "free")
    alias = submit(world, "alias", *ALICE, priority="batch")
    assert alias.stderr == "" and world.get("alias")["spec"]["priority"] == -100


def finalizer_writers(job: dict[str, Any]) -> list[str]:
    """The field managers that wrote a job's finalizers (its managedFields): none for admission's mutation."""
    fields = job["metadata"].get("managedFields") or []
    return [m["manager"] for m in fields if "f:finalizers" in (m.get("fieldsV1") or {}).get("f:metadata", {})]


def test_a_job_is_born_with_the_operators_finalizer_and_the_operator_never_writes_it(
    world: World, operator: OperatorProcess, admission: WebhookProcess
) -> None:
    """Admission adds the finalizer on create (review.finalizers_on_create), so the operator has no write to make
    for it when the job nears the head or is dispatched. A job deleted while it waits is let go at once, and one
    that ran has the finalizer taken off when it ends, as before."""
    policy(world)
    world.lane()
    submit(world, "first", *ALICE)
    submit(world, "queued", *ALICE)
    assert world.get("queued")["metadata"]["finalizers"] == [FINALIZER]
    world.wait_phase("first", "Running")
    assert world.wait_phase("queued", "Pending").get("positionExact") is True  # where the finalizer used to be added
    for name in ("first", "queued"):
        job = world.get(name)  # admission's own change is nobody's in managedFields; an operator's patch would be
        assert FINALIZER in job["metadata"]["finalizers"] and not finalizer_writers(job), (name, job["metadata"])
    world.cluster.kubectl("delete", "gpujob", "queued", "-n", world.namespace, "--wait=false")
    wait_until(lambda: [j for j in world.jobs() if j["metadata"]["name"] == "queued"] == [], what="queued gone")
    world.complete("first")
    wait_until(lambda: not world.get("first")["metadata"].get("finalizers"), what="the finalizer off the ended job")


def test_a_chain_is_admitted_as_its_authors_and_its_steps_carry_that(
    world: World, operator: OperatorProcess, admission: WebhookProcess
) -> None:
    """docs/chains.md, Admission: alice's chain asking for 1000 is capped to her 0 and counts against her; the
    operator creates its step with what the chain now says, which the webhook lets through as the
    operator's chain step. Alice writing the chain's label on a job of her own gains nothing."""
    policy(world)
    chain = {"apiVersion": API, "kind": "GpuChain", "metadata": {"name": "film", "namespace": world.namespace},
             "spec": {"model": world.name("sdxl"), "priority": 1000, "count": 2}}  # fmt: skip
    proc = world.cluster.kubectl("apply", "-f", "-", *ALICE, input=yaml.safe_dump(chain))
    assert "priority 1000 capped to 0 for user alice" in proc.stderr
    spec = world.custom.get_namespaced_custom_object(GROUP, VERSION, world.namespace, "gpuchains", "film")["spec"]
    assert (spec["priority"], spec["member"], spec["tier"]) == (0, "alice", "free")
    step = wait_until(lambda: world.get("film-0"), what="the chain's first step")
    assert (step["spec"]["priority"], step["spec"]["member"], step["spec"]["tier"]) == (0, "alice", "free")
    forged = submit(world, "forged", *ALICE, check=False, member="bob")
    assert forged.returncode != 0 and "may not submit as member 'bob'" in forged.stderr
    labelled = world.job_doc("labelled", world.name("sdxl"), member="bob", priority=1000)
    labelled["metadata"]["labels"] = {"gpulane.io/chain": "film"}
    refused = world.cluster.kubectl("apply", "-f", "-", *ALICE, input=yaml.safe_dump(labelled), check=False)
    assert refused.returncode != 0 and "may not submit as member 'bob'" in refused.stderr, "a label is no way in"


def test_a_chains_next_step_is_judged_again_once_the_rule_that_granted_it_is_gone(
    world: World, operator: OperatorProcess, admission: WebhookProcess
) -> None:
    """Issue 34's L2: dora, an artist, may ask for 100 and tier pro; her chain's first step gets both. The
    artists rule is removed: her next step is capped to her default 0 and tier free, said in a StepJudged
    Event. The chain records its author whatever the manifest says, and nobody rewrites it afterwards."""
    policy(world)
    world.lane()
    dora = ("--as", "dora", "--as-group", USERS_GROUP, "--as-group", "artists")
    chain = {"apiVersion": API, "kind": "GpuChain",
             "metadata": {"name": "film", "namespace": world.namespace, "annotations": {AUTHOR: "admin"}},
             "spec": {"model": world.name("sdxl"), "priority": 100, "count": 2}}  # fmt: skip
    world.cluster.kubectl("apply", "-f", "-", *dora, input=yaml.safe_dump(chain))
    stored = world.custom.get_namespaced_custom_object(GROUP, VERSION, world.namespace, "gpuchains", "film")
    assert stored["metadata"]["annotations"][AUTHOR] == "dora", "the author is who created it"
    assert "artists" in json.loads(stored["metadata"]["annotations"][AUTHOR_GROUPS])
    world.wait_phase("film-0", "Running")
    first = world.get("film-0")["spec"]
    assert (first["priority"], first["tier"], first["member"]) == (100, "pro", "dora")

    admission_rules = {"mode": "cap", "defaultCap": 0, "rules": []}  # the artists rule is gone
    world.apply({"apiVersion": API, "kind": "GpuPolicy", "metadata": {"name": "default"},
                 "spec": {"admission": admission_rules}})  # fmt: skip
    forged = world.cluster.kubectl("annotate", "gpuchain", "film", "-n", world.namespace, f"{AUTHOR}=admin",
                                   "--overwrite", *dora, check=False)  # fmt: skip
    assert forged.returncode != 0 and "cannot change: a chain's steps are judged as its author's" in forged.stderr
    generation = world.custom.get_cluster_custom_object(GROUP, VERSION, "gpupolicies", "default")["metadata"][
        "generation"
    ]
    wait_until(lambda: world.cluster_status("gpupolicies", "default").get("observedGeneration") == generation,
               what="the operator read the new policy")  # fmt: skip
    world.complete("film-0")
    second = wait_until(lambda: world.get("film-1"), what="the chain's second step")["spec"]
    assert (second["priority"], second["tier"], second["member"]) == (0, "free", "dora")
    selector = "involvedObject.name=film,involvedObject.kind=GpuChain,reason=StepJudged"
    [judged] = wait_until(lambda: world.core.list_namespaced_event(world.namespace, field_selector=selector).items,
                          what="a StepJudged Event on the chain")  # fmt: skip
    assert judged.type == "Warning" and "priority 100 capped to 0 for user dora" in judged.message


def test_the_examples_pass_admission_as_a_plain_user_and_every_job_names_its_request(
    world: World, admission: WebhookProcess
) -> None:
    """examples/ as alice applies them (server-side dry run: the webhook's answer, nothing stored), into
    this test's namespace and onto its model."""
    policy(world)
    docs = [
        d
        for name in ("02-film.yaml", "03-image.yaml")
        for d in yaml.safe_load_all((REPO / "examples" / name).read_text())
    ]
    for doc in docs:
        doc["metadata"]["namespace"] = world.namespace
        doc["spec"]["model"] = doc["spec"]["request"]["body"]["model"] = world.name("sdxl")
    proc = world.cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", *ALICE,
                                 input=yaml.safe_dump_all(docs))  # fmt: skip
    admitted = json.loads(proc.stdout)["items"]
    assert len(admitted) == len(docs) == 6
    assert {j["spec"]["member"] for j in admitted} == {"alice"}  # the webhook's, from the caller
    assert {j["spec"]["tier"] for j in admitted} == {"free"}
    image = next(j for j in admitted if j["metadata"]["name"] == "bobs-image")
    assert image["spec"]["priority"] == 0  # alice's cap, with a warning
    assert "capped" in proc.stderr
    assert all(j["spec"]["request"]["path"].startswith("/v1/") for j in admitted)  # an executor can run each


def test_in_reject_mode_an_over_cap_job_is_refused(world: World, admission: WebhookProcess) -> None:
    policy(world, mode="reject")
    proc = submit(world, "greedy", *ALICE, priority=1000, check=False)
    assert proc.returncode != 0
    assert "priority 1000 is above the cap 0 of user alice (rule: default cap)" in proc.stderr
    assert world.cluster.kubectl("get", "gpujob", "greedy", "-n", world.namespace, check=False).returncode != 0


def test_a_user_in_a_higher_group_gets_the_higher_cap_and_its_tier(world: World, admission: WebhookProcess) -> None:
    policy(world)
    proc = submit(world, "art", "--as", "bob", "--as-group", USERS_GROUP, "--as-group", "artists", priority=1000)
    assert "capped to 100 for user bob (rule: artists)" in proc.stderr
    spec = world.get("art")["spec"]
    assert (spec["priority"], spec["tier"], spec["member"]) == (100, "pro", "bob")


def test_only_trusted_identities_set_tier_and_member(world: World, admission: WebhookProcess) -> None:
    policy(world)
    tier = submit(world, "vip", *ALICE, tier="max", check=False)
    assert tier.returncode != 0 and "may not choose tier 'max'" in tier.stderr
    member = submit(world, "impostor", *ALICE, member="carol", check=False)
    assert member.returncode != 0 and "may not submit as member 'carol'" in member.stderr
    bridge = f"system:serviceaccount:{world.namespace}:{BRIDGE}"
    submit(world, "for-carol", "--as", bridge, member="carol", tier="max", priority=100)
    spec = world.get("for-carol")["spec"]
    assert (spec["member"], spec["tier"], spec["priority"]) == ("carol", "max", 100)


def test_unknown_models_and_malformed_requests_are_refused(world: World, admission: WebhookProcess) -> None:
    policy(world)
    doc = world.job_doc("nowhere", "no-such-model")
    proc = world.cluster.kubectl("apply", "-f", "-", *ALICE, input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0 and "no GpuModel named 'no-such-model'" in proc.stderr
    bad = submit(world, "bad-request", *ALICE, request={"path": "/v1/chat/completions", "body": {"model": "x"}},
                 check=False)  # fmt: skip
    assert bad.returncode != 0 and "must carry 'messages'" in bad.stderr


def test_a_broken_policy_is_refused_with_the_numbers(world: World, admission: WebhookProcess) -> None:
    doc = {"apiVersion": API, "kind": "GpuPolicy", "metadata": {"name": "default"}, "spec": {"bandSpacing": 20}}
    proc = world.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0
    assert "bandSpacing 20 is too small" in proc.stderr and "2 + 10 = 12" in proc.stderr
    rules = {"admission": {"rules": [{"name": "gods", "users": ["zeus"], "maxPriority": 5000}]}}
    doc["spec"] = rules
    proc = world.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0 and "rule 'gods': cap 5000 is outside priorityBounds [-1000, 1000]" in proc.stderr


def test_with_the_webhook_down_no_job_gets_in(world: World, admission: WebhookProcess) -> None:
    policy(world)
    admission.stop()
    proc = submit(world, "sneaky", *ALICE, priority=1000, check=False)
    assert proc.returncode != 0 and "failed calling webhook" in proc.stderr
    listed = world.cluster.kubectl("get", "gpujobs", "-n", world.namespace, "-o", "json")
    assert json.loads(listed.stdout)["items"] == []


def test_with_the_webhook_down_a_job_can_still_be_deleted(world: World, admission: WebhookProcess) -> None:
    """Removing a finalizer (as the operator does when a job is deleted) leaves the spec alone: the apiserver
    does not call the webhook for it (matchConditions), so it works while the webhook is down. A spec
    change does not."""
    policy(world)
    doc = world.job_doc("kept", world.name("sdxl"))
    doc["metadata"]["finalizers"] = [HOLD]
    world.cluster.kubectl("apply", "-f", "-", *ALICE, input=yaml.safe_dump(doc))
    admission.stop()
    kept = ("gpujob", "kept", "-n", world.namespace)
    spec_change = ("--type=merge", "-p", '{"spec":{"maxRunSeconds":120}}')  # a field that may change
    changed = world.cluster.kubectl("patch", *kept, *ALICE, *spec_change, check=False)
    assert changed.returncode != 0 and "failed calling webhook" in changed.stderr
    world.cluster.kubectl("delete", *kept, "--wait=false")
    world.cluster.kubectl("patch", *kept, *ALICE, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    wait_until(lambda: world.jobs() == [], what="the job deleted")


def test_with_the_webhook_down_a_running_job_still_ends_and_the_next_is_dispatched(
    world: World, admission: WebhookProcess
) -> None:
    """The status hook fails open: an executor's outcome lands while no webhook answers, so the lane frees
    and the queue moves on (with ``Fail`` the job would stay Running until the webhook came back)."""
    policy(world)
    world.lane()
    submit(world, "first")
    submit(world, "second")
    world.wait_phase("first", "Running")
    admission.stop()
    executor = ("--as", "batch-runner", "--as-group", USERS_GROUP)
    ended = status_patch(world, "first", *executor, phase="Succeeded", finishedAt="2026-12-02T00:00:00Z")
    assert ended.returncode == 0, ended.stderr
    assert world.wait_phase("second", "Running")["phase"] == "Running"


def status_patch(world: World, name: str, *as_: str, **fields: Any) -> Any:
    return _status_ops(
        world, name, [{"op": "add", "path": f"/status/{key}", "value": v} for key, v in fields.items()], *as_
    )


def _status_ops(world: World, name: str, ops: list[dict[str, Any]], *as_: str) -> Any:
    return world.cluster.kubectl("patch", "gpujob", name, "-n", world.namespace, "--subresource=status",
                                 "--type=json", "-p", json.dumps(ops), *as_, check=False)  # fmt: skip


def test_only_the_operator_writes_dispatch_fields_and_an_ended_job_stays_ended(
    world: World, admission: WebhookProcess
) -> None:
    """An executor's right to patch gpujobs/status is only the right to end a Running job: it cannot
    point the job at another endpoint, dispatch a waiting job, or bring a finished one back."""
    executor = ("--as", "batch-runner", "--as-group", USERS_GROUP)
    policy(world)
    world.lane()
    submit(world, "first")
    world.wait_phase("first", "Running")
    submit(world, "second")
    world.wait_phase("second", "Pending")

    # An outcome that also rewrites the dispatch (endpoint, lane and dispatchedAt are the CRD's, below).
    forged = status_patch(world, "first", *executor, phase="Succeeded", pod="gpulane-elsewhere")
    assert forged.returncode != 0, forged.stdout
    assert "gpujob-status-validate.gpulane.io" in forged.stderr, forged.stderr
    assert "may not change status.pod" in forged.stderr, forged.stderr
    jumped = status_patch(world, "second", *executor, phase="Running", lane="anything")
    assert jumped.returncode != 0 and "status of a Pending job" in jumped.stderr, jumped.stderr
    assert world.status("first")["endpoint"].startswith("http://") and world.status("second")["phase"] == "Pending"
    # Once written, a dispatch stays as it was, even for the operator's identity (the CRD's rules).
    for field, value in (
        ("lane", "other"),
        ("endpoint", "http://10.9.9.9:1"),
        ("dispatchedAt", "2026-01-01T00:00:00Z"),
    ):
        rewritten = status_patch(world, "first", **{field: value})
        assert rewritten.returncode != 0 and f"status.{field} is written once" in rewritten.stderr, rewritten.stderr
        removed = _status_ops(world, "first", [{"op": "remove", "path": f"/status/{field}"}])
        assert removed.returncode != 0 and f"status.{field} is written once" in removed.stderr, removed.stderr
    # Nor goes with the whole status (the status's own rules only judge a status that is still there).
    wiped = _status_ops(world, "first", [{"op": "remove", "path": "/status"}])
    assert wiped.returncode != 0 and "status cannot be removed once written" in wiped.stderr, wiped.stderr

    ended = status_patch(world, "first", *executor, phase="Succeeded", finishedAt="2026-12-02T00:00:00Z")
    assert ended.returncode == 0, ended.stderr
    world.wait_phase("second", "Running")  # the lane went to the next job
    # Neither an executor nor the operator's identity brings it back: the CRD's own rule refuses it before
    # any webhook is asked, so it holds with no webhook installed too.
    for who in (executor, ()):
        revived = status_patch(world, "first", *who, phase="Running")
        assert revived.returncode != 0, revived.stdout
        assert "status.phase is final once Succeeded, Failed or Cancelled" in revived.stderr, revived.stderr
    assert world.status("first")["phase"] == "Succeeded"


def test_the_operator_can_host_the_webhook(
    cluster: Cluster, world: World, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.stop()  # one operator at a time: this test runs its own, with --webhook
    tls = make_serving_cert(directory=tmp_path)
    port = free_port()
    serving = ["--webhook-host", "127.0.0.1", "--webhook-port", str(port)]
    files = ["--cert-file", str(tls.cert_file), "--key-file", str(tls.key_file)]
    hosted = OperatorProcess(cluster, tmp_path, "--webhook", *serving, *files).start()
    try:
        wait_until(lambda: tls_ready(port, tls), what="the hosted webhook's TLS port")
        with admission_installed(world, port, tls):
            policy(world)
            world.lane()
            proc = submit(world, "capped", *ALICE, priority=1000)
            assert "capped to 0" in proc.stderr
            running = world.wait_phase("capped", "Running")
            assert running["score"]["priority"] == 0
    finally:
        hosted.stop()


def test_in_policy_mode_the_apiserver_caps_defaults_and_refuses_with_no_webhook(world: World) -> None:
    """admission.mode policy: the rules as the apiserver's own MutatingAdmissionPolicy and
    ValidatingAdmissionPolicies (gpulane admission-policies), and no webhook process at all."""
    with callers_installed(world) as tag:
        name = f"gpulane-cel-{tag}"
        docs = cel.manifests(name, (OPERATOR_USER,), {"gpulane.io/admission-test": tag})
        try:
            policy(world)
            world.apply(*docs)
            greedy = yaml.safe_dump(world.job_doc("greedy", world.name("sdxl"), priority=1000))
            capped = wait_until(  # a server-side dry run is a real CREATE through admission, and stores nothing
                lambda: (
                    (p := world.cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", *ALICE,
                                                input=greedy, check=False)).returncode == 0
                    and json.loads(p.stdout)["spec"]["priority"] == 0
                    and json.loads(p.stdout)
                ),
                what="the admission policies to take effect",
            )  # fmt: skip
            assert capped["metadata"]["annotations"]["gpulane.io/requested-priority"] == "1000"
            assert (capped["spec"]["member"], capped["spec"]["tier"]) == ("alice", "free")
            assert capped["spec"]["maxRunSeconds"] == 3600  # the policy's runLimits.defaultSeconds
            # The validating policy takes effect on its own, maybe after the mutating one: until it refuses.
            impostor = yaml.safe_dump(world.job_doc("impostor", world.name("sdxl"), member="carol"))
            wait_until(
                lambda: world.cluster.kubectl("create", "--dry-run=server", "-f", "-", *ALICE, input=impostor,
                                              check=False).returncode,
                what="the validating policy to take effect",
            )  # fmt: skip
            submit(world, "modest", *ALICE, priority="batch")
            assert world.get("modest")["spec"]["priority"] == -100
            artist = submit(world, "art", "--as", "bob", "--as-group", USERS_GROUP, "--as-group", "artists",
                            priority=100)  # fmt: skip
            assert artist.returncode == 0 and world.get("art")["spec"]["tier"] == "pro"
            member = submit(world, "impostor", *ALICE, member="carol", check=False)
            assert member.returncode != 0 and "may not submit as member carol" in member.stderr
            bad = submit(world, "bad", *ALICE, request={"path": "/v1/embeddings", "body": {}}, check=False)
            assert bad.returncode != 0 and "spec.request.body must carry input for /v1/embeddings" in bad.stderr
            bridge = f"system:serviceaccount:{world.namespace}:{BRIDGE}"
            submit(world, "for-carol", "--as", bridge, member="carol", tier="max", priority=1000)
            trusted = world.get("for-carol")["spec"]
            assert (trusted["member"], trusted["tier"], trusted["priority"]) == ("carol", "max", 1000)
            # A GpuChain is capped and defaulted as its author's, as a job is (docs/chains.md, Admission).
            chain = {"apiVersion": API, "kind": "GpuChain", "metadata": {"name": "film", "namespace": world.namespace},
                     "spec": {"model": world.name("sdxl"), "priority": 1000, "count": 2}}  # fmt: skip
            made = json.loads(world.cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", *ALICE,
                                                    input=yaml.safe_dump(chain)).stdout)["spec"]  # fmt: skip
            assert (made["priority"], made["member"], made["tier"]) == (0, "alice", "free")
            # Status: only an executor's outcome of a Running job. Each policy takes effect on its own: wait for
            # this one too (a dry run stores nothing, so a forged write that got through meanwhile changes nothing).
            forged = wait_until(
                lambda: (p := world.cluster.kubectl(
                    "patch", "gpujob", "modest", "-n", world.namespace, "--subresource=status", "--type=merge",
                    "--dry-run=server", "-p", json.dumps({"status": {"phase": "Running", "lane": "elsewhere"}}),
                    "--as", bridge, check=False)).returncode and p.stderr,
                what="the status policy in effect",
            )  # fmt: skip
            assert "may not write the status of a" in forged and "only the operator does" in forged, forged
            # In reject mode an over-cap job is refused, not capped.
            policy(world, mode="reject")
            refused = wait_until(
                lambda: (p := submit(world, f"r{time.monotonic_ns()}", *ALICE, priority=1000, check=False)).returncode
                and p.stderr,
                what="the reject mode in effect",
            )  # fmt: skip
            assert "priority 1000 is above the cap 0 of user alice (rule: default cap)" in refused
        finally:
            for doc in docs:
                world.cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found")


def test_the_webhook_reloads_its_certificate_when_the_files_change(cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = make_serving_cert(directory=tmp_path / "first")
    hook = WebhookProcess(cluster, tmp_path, first).start()
    try:
        rotated = make_serving_cert(directory=tmp_path / "second")  # another CA, as after a rotation
        first.cert_file.write_bytes(rotated.cert_file.read_bytes())
        first.key_file.write_bytes(rotated.key_file.read_bytes())
        wait_until(lambda: tls_ready(hook.port, rotated), timeout=60, what="the webhook serving the new certificate")
    finally:
        hook.stop()
