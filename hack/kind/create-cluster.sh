#!/usr/bin/env bash
# Create a kind cluster for gpulane and make one worker the GPU node (machines with Docker only).
#
#   hack/kind/create-cluster.sh            # cluster "gpulane", GPU node = the first worker
#   KIND_CLUSTER=foo hack/kind/create-cluster.sh
#
# If the worker already advertises nvidia.com/gpu (a real GPU with the NVIDIA device plugin), it is left
# alone. Otherwise the script adds nvidia.com/gpu: 1 to the node's capacity with a status patch, so that
# the scheduler treats it as a one-GPU node (nothing will actually run on a GPU: for scheduling tests).
# Untested on gpulane's CI machines, which have no Docker engine; see docs/development.md.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAME=${KIND_CLUSTER:-gpulane}
KUBECTL=${KUBECTL:-kubectl}

for tool in kind docker "$KUBECTL"; do
  command -v "$tool" >/dev/null 2>&1 || { echo "error: '$tool' not found; the kind path needs kind, docker and kubectl" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "error: no Docker engine is reachable (docker info failed)" >&2; exit 1; }

if kind get clusters 2>/dev/null | grep -qx "$NAME"; then
  echo "kind cluster '$NAME' exists; reusing it" >&2
else
  kind create cluster --name "$NAME" --config "$HERE/cluster.yaml" --wait 120s
fi
CTX="kind-$NAME"
K=("$KUBECTL" --context "$CTX")

NODE=$("${K[@]}" get nodes -l gpulane.dev/gpu=true -o jsonpath='{.items[0].metadata.name}')
[[ -n "$NODE" ]] || { echo "error: no node labelled gpulane.dev/gpu=true" >&2; exit 1; }
"${K[@]}" label node "$NODE" gpulane.dev/gpu=true nvidia.com/gpu.present=true --overwrite >/dev/null

HAS=$("${K[@]}" get node "$NODE" -o jsonpath='{.status.capacity.nvidia\.com/gpu}')
if [[ -z "$HAS" ]]; then
  # Extended resources are advertised through the node status; the kubelet keeps a capacity it does
  # not manage, so the patch persists.
  "${K[@]}" patch node "$NODE" --subresource=status --type=json \
    -p '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"1"}]' >/dev/null
  echo "advertised nvidia.com/gpu: 1 on $NODE (simulated; no device plugin)" >&2
fi
for _ in $(seq 1 30); do
  [[ "$("${K[@]}" get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" == "1" ]] && break
  sleep 1
done
"${K[@]}" get node "$NODE" -o jsonpath='{.metadata.name}{" allocatable nvidia.com/gpu="}{.status.allocatable.nvidia\.com/gpu}{"\n"}'
echo "kubectl context: $CTX   (kind export kubeconfig --name $NAME)"
