#!/usr/bin/env bash
# Delete the kind cluster made by create-cluster.sh (machines with Docker only; untested on CI here).
set -euo pipefail
NAME=${KIND_CLUSTER:-gpulane}
command -v kind >/dev/null 2>&1 || { echo "error: 'kind' not found" >&2; exit 1; }
kind delete cluster --name "$NAME"
