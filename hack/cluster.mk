# Local control plane targets (issue 3; see docs/development.md).
#
#   make tools           build kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd, kwok,
#                        helm, kubelet, kube-proxy and containerd (+ shim, ctr) from the pinned Go modules in
#                        hack/tools/* (once; cached outside the repo), after `make node-deps`
#   make node-deps       install the real node's Debian packages (runc, CNI plugins, mmdebstrap, nftables)
#   make images          the pause, Python base and gpulane images, without a registry (cached by content)
#   make llama-server    llama.cpp's llama-server built from source into an image (the e2e suite's real
#                        model server; about 6.5 min once, then cached by content)
#   make cluster-up      start etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok and the
#                        real GPU node gpu-0 (containerd + runc + kubelet + kube-proxy; root) (idempotent);
#                        NODE=kwok makes gpu-0 a kwok node instead, as GPULANE_NODE=kwok does
#   make cluster-status  show what is running
#   make cluster-down    stop exactly the processes cluster-up started and remove the state
#   make e2e             run only the end-to-end tests (starts a cluster if none is up)
#   make kind-up         (machines with Docker only) a kind cluster with a GPU-labelled node
#
# This file is included by the top-level Makefile, which defines BIN (the venv's bin directory) and the
# install target.

CLUSTER_PY = $(BIN)/python hack/gpulane_cluster.py
# `make cluster-up NODE=kwok`: gpu-0 is a kwok node (the default, NODE=real, is the real kubelet node).
CLUSTER_ENV = $(if $(NODE),GPULANE_NODE=$(NODE))

llama-server: install node-deps
	@$(CLUSTER_PY) llama-server >/dev/null

.PHONY: tools node-deps images llama-server cluster-up cluster-down cluster-status e2e kind-up kind-down

tools: node-deps
	@hack/tools/build.sh >/dev/null
	@echo "tools: $$(hack/tools/build.sh --bindir)" >&2

node-deps:
	@hack/node/deps.sh

images: install tools
	@$(CLUSTER_PY) images

cluster-up: install tools
	@$(CLUSTER_ENV) $(CLUSTER_PY) up

cluster-down: install
	@$(CLUSTER_PY) down

cluster-status: install
	@$(CLUSTER_PY) status

e2e: install tools llama-server
	$(BIN)/pytest -q -n $(TEST_WORKERS) -m e2e tests/e2e

kind-up:
	hack/kind/create-cluster.sh

kind-down:
	hack/kind/delete-cluster.sh
