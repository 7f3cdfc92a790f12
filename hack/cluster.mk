# Local control plane targets (issue 3; see docs/development.md).
#
#   make tools           build kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd, kwok
#                        and helm from the pinned Go modules in hack/tools/* (once; cached outside the repo)
#   make cluster-up      start etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok on
#                        127.0.0.1 with a fake GPU node gpu-0 (idempotent)
#   make cluster-status  show what is running
#   make cluster-down    stop exactly the processes cluster-up started and remove the state
#   make e2e             run only the end-to-end tests (starts a cluster if none is up)
#   make kind-up         (machines with Docker only) a kind cluster with a GPU-labelled node
#
# This file is included by the top-level Makefile, which defines BIN (the venv's bin directory) and the
# install target.

CLUSTER_PY = $(BIN)/python hack/gpulane_cluster.py

.PHONY: tools cluster-up cluster-down cluster-status e2e kind-up kind-down

tools:
	@hack/tools/build.sh >/dev/null
	@echo "tools: $$(hack/tools/build.sh --bindir)" >&2

cluster-up: install tools
	@$(CLUSTER_PY) up

cluster-down: install
	@$(CLUSTER_PY) down

cluster-status: install
	@$(CLUSTER_PY) status

e2e: install tools
	$(BIN)/pytest -q -m e2e tests/e2e

kind-up:
	hack/kind/create-cluster.sh

kind-down:
	hack/kind/delete-cluster.sh
