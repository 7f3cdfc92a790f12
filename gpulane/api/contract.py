"""The names that gpulane's components agree on: labels, annotations and the finalizer.

The operator, the bridge, the webhook and the chart read and write these on shared objects, so they
live beside the resource models rather than inside any one component.
"""

from __future__ import annotations

from typing import Any

# A Kubernetes object, or a merge patch, as the plain JSON that every component reads and writes.
Body = dict[str, Any]

# On every GpuJob the operator dispatches: the lane's accounting must see the job leave.
FINALIZER = "gpulane.io/lane-accounting"

# Annotation naming the Lease (``namespace/name``) of whoever executes a job: when it expires, the
# operator fails the job with DataPlaneLost.
EXECUTOR_LEASE = "gpulane.io/executor-lease"
# The label on executors' Leases, so the operator watches only those.
EXECUTOR_LABEL = "gpulane.io/executor"
EXECUTOR_SELECTOR = f"{EXECUTOR_LABEL}=true"

# On the bridge's GpuJobs: which replica proxies the call, and which API key made it.
REPLICA_LABEL = "gpulane.io/bridge-replica"
# The audience of the tokens the bridge takes (``kubectl create token NAME --audience gpulane-bridge``): a token
# bound to it is no key to the apiserver, so a caller who sends one to the bridge gives nothing else away.
BRIDGE_AUDIENCE = "gpulane-bridge"
# The bridge's /unload (an admin key's) is this Lease in its namespace, renewed at each request; the operator
# honours it only in the namespace its --unload-namespace names.
UNLOAD_LEASE = "gpulane-unload"
API_KEY_LABEL = "gpulane.io/api-key"

# Set by the webhook when it capped a priority: what the caller asked for.
REQUESTED_PRIORITY = "gpulane.io/requested-priority"
# Set by admission on a GpuChain's create: its author's user name and groups (a JSON list), so that the operator
# judges each step again as the author's, against the rules of the day. Nobody may change them.
AUTHOR = "gpulane.io/author"
AUTHOR_GROUPS = "gpulane.io/author-groups"

# Backend pods: who manages them, which lane and model they serve.
MANAGED_BY = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"
LANE_LABEL = "gpulane.io/lane"
MODEL_LABEL = "gpulane.io/model"
# On a server pod that holds several models: the preset the server reads, projected into it as a file.
SERVER_PRESET = "gpulane.io/server-preset"
BACKEND_SELECTOR = f"{MANAGED_BY}=gpulane,{COMPONENT_LABEL}=backend"
