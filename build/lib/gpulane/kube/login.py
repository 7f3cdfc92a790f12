"""One login: kopf's watches and gpulane's own client use the same credentials, read once.

Importing this module registers kopf's login handler; the operator's handlers and the webhook's import it.
"""

from __future__ import annotations

from typing import Any

import kopf
from kubernetes.aio import client

from gpulane.kube.client import configuration


async def credentials(memo: kopf.Memo) -> client.Configuration:
    """The configuration of this process (``memo.kubeconfig``, else in-cluster, else ``$KUBECONFIG``)."""
    if memo.get("configuration") is None:
        memo.configuration = await configuration(memo.get("kubeconfig"))
    conf: client.Configuration = memo.configuration
    return conf


def connection_info(conf: client.Configuration) -> kopf.ConnectionInfo:
    token = conf.api_key.get("BearerToken") or conf.api_key.get("authorization")
    if token and token.lower().startswith("bearer "):
        token = token[len("bearer ") :]
    return kopf.ConnectionInfo(
        server=conf.host,
        ca_path=conf.ssl_ca_cert,
        insecure=not conf.verify_ssl,
        certificate_path=conf.cert_file,
        private_key_path=conf.key_file,
        token=token,
    )


@kopf.on.login()
async def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    return connection_info(await credentials(memo))
