"""``gpulane result JOB``: the answer of a job the bridge executed (``spec.request``). A ConfigMap answer is
read with the caller's own kubeconfig; an answer on the results volume (``output: volume``) is streamed from
the bridge's ``/results`` endpoint with a Kubernetes bearer token, which the bridge checks may get the job,
and its size and SHA-256 are checked against the job's status.

The token is never the kubeconfig's own (possibly an admin's, valid at the apiserver): it is one given for
the bridge, bound to its audience, and it goes over plain http:// only when the user says so (``--insecure``),
as the bridge itself serves no TLS (put an Ingress or a mesh with TLS in front of it)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from kubernetes.aio.client.exceptions import ApiException

from gpulane.api.contract import BRIDGE_AUDIENCE, Body
from gpulane.explain.main import _kubeconfig, load
from gpulane.kube.client import Gone

CHUNK = 1 << 20


def result_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("job", help="NAME or NAMESPACE/NAME")
    r.add_argument("-n", "--namespace", default="default")
    r.add_argument("-o", "--output", metavar="FILE", help="write the answer here (default: standard output)")
    r.add_argument("--bridge", default=os.environ.get("GPULANE_BRIDGE_URL"),
                   help="the bridge's URL (http://HOST:8090), for answers on the results volume "
                   "(default: $GPULANE_BRIDGE_URL)")  # fmt: skip
    r.add_argument("--token", default=os.environ.get("GPULANE_TOKEN"),
                   help="a token of someone who may get the job, for the bridge's audience: "
                   f"`kubectl create token NAME --audience {BRIDGE_AUDIENCE}` (default: $GPULANE_TOKEN)")  # fmt: skip
    r.add_argument("--insecure", action="store_true",
                   help="send the token to an http:// bridge (plain text: anyone on the path can read it)")  # fmt: skip
    _kubeconfig(r)


class Failed(Exception):
    """What the user is told, and exit status 1."""


async def read(args: argparse.Namespace, namespace: str, name: str) -> tuple[Body, bytes | None]:
    """The job's result field, and its answer when a ConfigMap holds it (None: it is on the results volume)."""
    kube = await load(args)
    try:
        try:
            job = await kube.get_job(namespace, name)
        except Gone:
            raise Failed(f"no GpuJob {namespace}/{name}") from None
        result: Body | None = (job.get("status") or {}).get("result")
        if not result:
            phase = (job.get("status") or {}).get("phase") or "Pending"
            raise Failed(f"GpuJob {namespace}/{name} has no answer (yet): it is {phase}")
        if "volume" in result:
            return result, None
        try:
            config_map = await kube.get_config_map(namespace, result["configMap"])
        except Gone:
            raise Failed(f"ConfigMap {namespace}/{result['configMap']} is gone, and the job's answer with it") from None
        return result, from_config_map(config_map, namespace, result)
    finally:
        await kube.close()


def run_result(args: argparse.Namespace) -> int:
    namespace, _, name = args.job.rpartition("/")
    namespace = namespace or args.namespace
    try:
        result, answer = asyncio.run(read(args, namespace, name))
        with output(args.output) as out:
            if answer is None:
                fetch(args, namespace, name, result["volume"], out)
            else:
                out.write(answer)
    except ApiException as err:
        print(f"error: {namespace}/{name}: {err.status} {err.reason}", file=sys.stderr)
        return 1
    except Failed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # the bridge's errors are Failed: this is the answer's own file (or a closed pipe)
        print(f"error: the answer could not be written: {err}", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def output(path: str | None) -> Iterator[BinaryIO]:
    """Standard output, or FILE written whole or not at all: the answer goes to a file beside it, renamed
    over it once read and checked, and removed if anything failed (FILE, if it was there, left as it was)."""
    if not path:
        with os.fdopen(sys.stdout.fileno(), "wb", closefd=False) as out:
            yield out
        return
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with partial.open("wb") as out:
            yield out
        partial.replace(target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def from_config_map(config_map: Body, namespace: str, result: Body) -> bytes:
    key = result.get("key", "")
    binary = config_map.get("binaryData") or {}
    if key in binary:
        return base64.b64decode(binary[key])
    data = config_map.get("data") or {}
    if key not in data:  # not an empty answer: none at all
        raise Failed(f"ConfigMap {namespace}/{result['configMap']} has no key {key!r}: the job's answer is not there")
    return str(data[key]).encode()


def fetch(args: argparse.Namespace, namespace: str, name: str, volume: Body, out: BinaryIO) -> None:
    if not args.bridge:
        raise Failed("the answer is on the bridge's results volume: give --bridge URL (or $GPULANE_BRIDGE_URL)")
    if not args.token:
        raise Failed(f"the bridge needs a token: give --token (`kubectl create token NAME --audience "
                     f"{BRIDGE_AUDIENCE}`) or $GPULANE_TOKEN")  # fmt: skip
    if args.bridge.lower().startswith("http://") and not args.insecure:
        raise Failed(f"{args.bridge} is plain http: the token would cross the network readable; use https://, "
                     "or --insecure to send it anyway")  # fmt: skip
    token = args.token
    url = f"{args.bridge.rstrip('/')}/results/{namespace}/{name}"
    digest, size = hashlib.sha256(), 0
    try:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        resp = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as err:
        raise Failed(f"the bridge answered {err.code}: {err.read().decode(errors='replace')[:300]}") from None
    except (OSError, http.client.HTTPException, ValueError) as err:  # ValueError: a URL with no http://
        raise Failed(f"the bridge at {args.bridge} could not be read: {err}") from None
    with resp:
        while True:
            try:
                chunk = resp.read(CHUNK)
            except (OSError, http.client.HTTPException) as err:  # a chunked answer cut short is IncompleteRead
                size += len(err.partial) if isinstance(err, http.client.IncompleteRead) else 0
                raise Failed(f"the bridge at {args.bridge} broke off the answer after {size} bytes: {err!r}") from None
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)  # an error here is the answer's file's, not the bridge's
    if size != volume.get("bytes") or digest.hexdigest() != volume.get("sha256"):
        raise Failed(f"the answer read ({size} bytes, sha256 {digest.hexdigest()}) is not the one the job recorded "
                     f"({volume.get('bytes')} bytes, sha256 {volume.get('sha256')})")  # fmt: skip
    print(f"{namespace}/{name}: {size} bytes, sha256 {digest.hexdigest()} (as recorded)", file=sys.stderr)
