"""Every call gpulane makes to the Kubernetes API goes through ``Kube``.

One place means one counter of writes per kind (reported as a metric and by the benchmarks), one request
timeout, and one translation of API errors into the three outcomes the operator acts on: done, gone
(404) and conflict (409, or a failed JSON-patch test). Calls are made with the official client's
asyncio flavour (``kubernetes.aio``) on the caller's event loop: no threads.
"""

from __future__ import annotations

import collections
import json
import logging
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes.aio import client, config
from kubernetes.aio.client.exceptions import ApiException
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from gpulane import __version__
from gpulane.api.contract import EXECUTOR_LABEL, Body
from gpulane.api.resources import GROUP, VERSION
from gpulane.api.times import format_micro_time, format_time

Patch = Body | list[Body]

STATUS_WRITE_KINDS = {"gpulanes": "lane-status", "gpumodels": "model-status", "gpupolicies": "policy-status"}


def refusal_message(err: ApiException) -> str:
    """What the apiserver said when it refused a request: its Status message, else the HTTP reason."""
    try:
        message = json.loads(err.body or "{}").get("message")
    except ValueError:
        message = None
    return str(message or err.reason)


class Gone(Exception):
    """The object does not exist (any more)."""


class Conflict(Exception):
    """The object changed under us: a resourceVersion conflict or a failed JSON-patch ``test``."""


class Fenced(Exception):
    """This replica may not write: it does not (surely) hold the operator's Lease."""


# A call that takes longer is abandoned (TimeoutError): the caller's retry sees fresh state.
REQUEST_TIMEOUT = 10.0
LIST_PAGE = 500  # objects per page of a list


def backoff(
    log: logging.Logger,
    failed: str,
    *,
    initial: float,
    max_backoff: float,
    reason: Callable[[BaseException | None], str] | None = None,
) -> AsyncRetrying:
    """Retries of a call that must succeed sooner or later (a list at start, a watch's list, an outcome):
    any error, forever, waiting exponentially longer with jitter so that a down apiserver is not hammered.
    Each retry is logged as ``<failed> (<reason>); retrying in <s>s``; ``reason`` defaults to ``why``."""

    def before_sleep(state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        log.warning("%s (%s); retrying in %.1fs", failed, (reason or why)(err), state.upcoming_sleep)

    return AsyncRetrying(
        wait=wait_exponential_jitter(multiplier=initial, max=max_backoff, jitter=initial),
        retry=retry_if_exception_type(Exception),
        before_sleep=before_sleep,
    )


def _admission_refused(err: ApiException) -> bool:
    message = refusal_message(err)
    return "denied request" in message or "admission webhook" in message


async def write_outcome(kube: Kube, namespace: str, name: str, patch: Patch, log: logging.Logger) -> None:
    """An executor's outcome (a JSON patch that tests phase Running), written until it lands: a 429, a 5xx, a
    timeout, a restarting apiserver or an admission that cannot decide yet is tried again with backoff. A
    Conflict (no longer Running: a deadline or a cancel ended it first) or Gone means that outcome stands."""
    async for attempt in backoff(log, f"writing the outcome of {namespace}/{name} failed", initial=0.2,
                                 max_backoff=10.0):  # fmt: skip
        with attempt:
            try:
                await kube.patch_job_status(namespace, name, patch)
            except (Conflict, Gone):
                return


def why(err: BaseException | None) -> str:
    """An error in one line: its type, and its message when it has one (a TimeoutError has none)."""
    if isinstance(err, ApiException):  # its str() is the whole response, headers and all
        return f"HTTP {err.status} {err.reason}"
    text = str(err).strip().splitlines()[0] if err is not None and str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


async def configuration(kubeconfig: str | None = None) -> client.Configuration:
    """In-cluster configuration when running in a pod, else the kubeconfig (``$KUBECONFIG`` or the default)."""
    conf = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=conf)  # type: ignore[no-untyped-call]
    conf.connection_pool_maxsize = 32
    # aiohttp's trust_env reads ~/.netrc and the proxy variables in a thread on every request: 43% of a
    # status patch's CPU (bench/client.py). Like the sync client, gpulane takes a proxy from the kubeconfig.
    conf.client_session_kwargs = {"trust_env": False}
    return conf


async def load_client(kubeconfig: str | None = None) -> client.ApiClient:
    return client.ApiClient(await configuration(kubeconfig))


class Kube:
    def __init__(
        self, api: client.ApiClient, namespace: str, timeout: float = REQUEST_TIMEOUT, *, agent: str = "gpulane"
    ) -> None:
        # Who writes: the apiserver names a write's field manager (managedFields) after the user agent, and
        # its audit log shows it; the client's own ("OpenAPI-Generator/...") would name every component alike.
        api.user_agent = f"{agent}/{__version__}"
        self.api = api
        self.namespace = namespace  # where backend pods (and lane events) live
        self.timeout = timeout
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)
        self.writes: collections.Counter[str] = collections.Counter()
        self._instance = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self.on_write: Callable[[str], None] = lambda kind: None
        # With leader election: whether a write may be sent now, and how long it may take (leader.py).
        self.fence: Callable[[], bool] | None = None
        self.write_timeout = timeout

    async def close(self) -> None:
        await self.api.close()  # type: ignore[no-untyped-call]

    def _plain(self, obj: Any) -> Body:
        """The official client's model objects as the plain dicts the rest of gpulane reads."""
        body: Body = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return body

    async def _call(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self.timeout)
        try:
            return await fn(*args, **kwargs)
        except ApiException as err:
            if err.status == 404:
                raise Gone(str(err.reason)) from None
            if err.status == 409:
                raise Conflict(str(err.body or err.reason)) from None
            raise

    async def read(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """A read through one of the typed APIs (``self.custom``, ``self.core``) that ``Kube`` has no method for."""
        return await self._call(fn, *args, **kwargs)

    async def _write(self, kind: str, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        if self.fence is not None and not self.fence():
            raise Fenced(f"not writing ({kind}): this replica does not hold the operator's Lease")
        kwargs.setdefault("_request_timeout", self.write_timeout)
        tested = False
        if args and isinstance(args[-1], list):  # a JSON patch; the client would send a merge patch
            kwargs["_content_type"] = "application/json-patch+json"
            tested = any(op.get("op") == "test" for op in args[-1])
        self.writes[kind] += 1
        self.on_write(kind)
        try:
            return await self._call(fn, *args, **kwargs)
        except ApiException as err:
            # A JSON patch that does not apply is a 422, and the apiserver's message does not always say
            # why; with a `test` op in it, the tested state changed under us: someone else's write stands.
            # Unless admission refused it (a policy that cannot decide yet, after an apiserver restart, is a
            # 422 too): then nothing stands, and the write must be tried again.
            if tested and err.status == 422 and not _admission_refused(err):
                raise Conflict(str(err.body or err.reason)) from None
            raise

    # -- reads ----------------------------------------------------------------------------------

    async def list_cluster(self, plural: str, selector: str = "") -> list[Body]:
        """Every object of ``plural`` (matching the label ``selector``), ``LIST_PAGE`` at a time: each page gets
        the request timeout, so that 100,000 finished jobs with their stories never make one call that cannot
        end in time."""
        items: list[Body] = []
        page: dict[str, Any] = {"limit": LIST_PAGE, "label_selector": selector}
        while True:
            result = await self._call(self.custom.list_cluster_custom_object, GROUP, VERSION, plural, **page)
            items += result.get("items", [])
            page["_continue"] = (result.get("metadata") or {}).get("continue")
            if not page["_continue"]:
                return items

    async def list_jobs(self, selector: str = "") -> list[Body]:
        return await self.list_cluster("gpujobs", selector)  # all namespaces

    async def list_namespaced_jobs(self, namespace: str, selector: str) -> list[Body]:
        return await self.list_namespaced("gpujobs", namespace, selector)

    async def list_namespaced(self, plural: str, namespace: str, selector: str = "") -> list[Body]:
        result = await self._call(
            self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural, label_selector=selector
        )
        items: list[Body] = result.get("items", [])
        return items

    async def get_cluster(self, plural: str, name: str) -> Body:
        body: Body = await self._call(self.custom.get_cluster_custom_object, GROUP, VERSION, plural, name)
        return body

    async def get_job(self, namespace: str, name: str) -> Body:
        return await self.get_namespaced("gpujobs", namespace, name)

    async def get_namespaced(self, plural: str, namespace: str, name: str) -> Body:
        body: Body = await self._call(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, plural, name)
        return body

    async def get_config_map(self, namespace: str, name: str) -> Body:
        return self._plain(await self._call(self.core.read_namespaced_config_map, name, namespace))

    async def list_leases(self, selector: str) -> list[Body]:
        result = await self._call(self.coordination.list_lease_for_all_namespaces, label_selector=selector)
        return [self._plain(lease) for lease in result.items]

    async def get_pod(self, name: str, namespace: str | None = None) -> Body:
        pod = await self._call(self.core.read_namespaced_pod, name, namespace or self.namespace)
        body: Body = self._plain(pod)
        return body

    async def list_nodes(self) -> list[Body]:
        result = await self._call(self.core.list_node)
        return [self._plain(n) for n in result.items]

    async def list_pods(self, selector: str) -> list[Body]:
        result = await self._call(self.core.list_namespaced_pod, self.namespace, label_selector=selector)
        return [self._plain(p) for p in result.items]

    async def authenticate(self, token: str, audience: str) -> tuple[str, list[str]] | None:
        """Who holds a bearer token bound to ``audience`` (a TokenReview): (user, groups), or None if the
        apiserver refuses it, or it is not a token for ``audience``."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token, "audiences": [audience]}}  # fmt: skip
        result = await self._call(client.AuthenticationV1Api(self.api).create_token_review, review)
        status = result.status
        if not status or not status.authenticated or not status.user or audience not in (status.audiences or []):
            return None
        return str(status.user.username), list(status.user.groups or [])

    async def may_read_jobs(self, user: str, groups: list[str], namespace: str, name: str | None = None) -> bool:
        """Whether ``user`` may get GpuJob namespace/name, or without a name list the GpuJobs of ``namespace``
        (of every namespace when it is "") (a SubjectAccessReview)."""
        attributes = {"verb": "get" if name else "list", "group": GROUP, "resource": "gpujobs", "namespace": namespace}
        if name:
            attributes["name"] = name
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}}  # fmt: skip
        result = await self._call(client.AuthorizationV1Api(self.api).create_subject_access_review, review)
        return bool(result.status and result.status.allowed)

    # -- writes ---------------------------------------------------------------------------------

    async def patch_job_status(self, namespace: str, name: str, patch: Patch) -> Body:
        body: Body = await self._write(
            "job-status",
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            "gpujobs",
            name,
            patch,
        )
        return body

    async def patch_chain_status(self, namespace: str, name: str, patch: Patch) -> Body:
        body: Body = await self._write(
            "chain-status", self.custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace,
            "gpuchains", name, patch,
        )  # fmt: skip
        return body

    async def patch_job(self, namespace: str, name: str, patch: Patch) -> Body:
        return await self.patch_namespaced("gpujobs", namespace, name, patch, kind="job-metadata")

    async def patch_namespaced(self, plural: str, namespace: str, name: str, patch: Patch, kind: str = "") -> Body:
        """A patch of a namespaced object's metadata or spec (a GpuJob's finalizers, a shard's label)."""
        body: Body = await self._write(
            kind or f"{plural}-metadata", self.custom.patch_namespaced_custom_object, GROUP, VERSION, namespace,
            plural, name, patch,
        )  # fmt: skip
        return body

    async def patch_cluster_status(self, plural: str, name: str, patch: Patch) -> Body:
        body: Body = await self._write(
            STATUS_WRITE_KINDS[plural],
            self.custom.patch_cluster_custom_object_status,
            GROUP,
            VERSION,
            plural,
            name,
            patch,
        )
        return body

    async def create_job(self, manifest: Body) -> Body:
        namespace = manifest["metadata"]["namespace"]
        body: Body = await self._write(
            "job-create", self.custom.create_namespaced_custom_object, GROUP, VERSION, namespace, "gpujobs", manifest
        )
        return body

    async def delete_job(self, namespace: str, name: str, uid: str | None = None) -> None:
        """Delete a GpuJob; with ``uid``, only that one (another created under its name since is Conflict)."""
        options = {"preconditions": {"uid": uid}} if uid else None
        await self._write("job-delete", self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace,
                          "gpujobs", name, body=options)  # fmt: skip

    async def apply_lease(self, name: str, holder: str, duration: int, now: float) -> None:
        """Create or renew the Lease ``name`` in our namespace, held by ``holder``."""
        stamp = format_micro_time(now)
        spec = {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": stamp}
        try:
            await self._write("lease", self.coordination.patch_namespaced_lease, name, self.namespace, {"spec": spec})
        except Gone:
            meta = {"name": name, "labels": {EXECUTOR_LABEL: "true"}}
            body = {"metadata": meta, "spec": {**spec, "acquireTime": stamp}}
            await self._write("lease", self.coordination.create_namespaced_lease, self.namespace, body)

    async def delete_lease(self, name: str) -> None:
        await self._write("lease", self.coordination.delete_namespaced_lease, name, self.namespace)

    async def create_config_map(self, namespace: str, manifest: Body) -> None:
        await self._write("configmap", self.core.create_namespaced_config_map, namespace, manifest)

    async def create_pod(self, manifest: Body) -> Body:
        pod = await self._write("pod-create", self.core.create_namespaced_pod, self.namespace, manifest)
        created: Body = self._plain(pod)
        return created

    async def check_pod(self, manifest: Body) -> str | None:
        """The apiserver's verdict on a pod, without creating it (a server-side dry run through validation and
        admission): None if it would be created, else the apiserver's own message."""
        try:
            await self._call(self.core.create_namespaced_pod, self.namespace, manifest, dry_run="All")
        except ApiException as err:
            if err.status in (400, 403, 422):  # malformed, refused by admission (PodSecurity, say), invalid
                return refusal_message(err)
            raise
        return None

    async def delete_pod(self, name: str, uid: str) -> None:
        options = {"preconditions": {"uid": uid}}
        await self._write("pod-delete", self.core.delete_namespaced_pod, name, self.namespace, body=options)

    async def event(self, involved: Body, reason: str, message: str, *, warning: bool = False, now: float) -> None:
        """A core/v1 Event on ``involved``: in its namespace, or in ``default`` for a cluster-scoped object (a
        GpuLane), the one namespace the apiserver accepts for those."""
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        stamp = format_time(now)
        body = {
            "metadata": {"generateName": f"{meta['name'][:200]}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "gpulane-operator"},
            "reportingComponent": "gpulane.io/operator",
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self._write("event", self.core.create_namespaced_event, namespace, body)
