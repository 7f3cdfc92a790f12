# gpulane: the two commands that matter are `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test unit lint crds demo bench bench-operator bench-chaos plots clean
.DEFAULT_GOAL := help

help:
	@echo "make demo      - run the film-versus-interactive simulation and print the policy comparison"
	@echo "make test      - install everything needed, lint, and run the whole suite (unit + e2e)"
	@echo "make lint      - ruff, and mypy (strict on every package of gpulane)"
	@echo "make install   - create .venv and install gpulane with its dev extras"
	@echo "make crds      - regenerate crds/ from the models in gpulane/api/resources.py"
	@echo "make bench     - dispatcher and simulator benchmarks (figures go to docs/benchmarks.md)"
	@echo "make bench-operator - on the local cluster: dispatch latency, 5,000 jobs, swaps on the real node, admission, bridge"
	@echo "make bench-chaos - 16 minutes of faults (leader, pods, apiserver, etcd, webhook, kubelet, containerd); docs/reliability.md"
	@echo "make plots     - regenerate the scenario plots in docs/img/"
	@echo "make tools     - build the local control plane's and the real node's binaries once (see docs/development.md)"
	@echo "make images    - the pause, Python base and gpulane images for the real node, without a registry"
	@echo "make cluster-up / cluster-status / cluster-down - the local cluster with the real GPU node gpu-0 (NODE=kwok: a kwok gpu-0)"
	@echo "make e2e       - only the end-to-end tests against the local control plane"

install: $(STAMP)
$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "error: $(PY) not found; install Python 3.11 or run make PY=python3.x" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -e '.[dev,plots]'
	@touch $@

include hack/cluster.mk

test: lint tools
	$(BIN)/pytest -q

unit: install
	$(BIN)/pytest -q -m 'not e2e'

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy gpulane

crds: install
	$(BIN)/python -m gpulane.api.crd crds

demo: install
	$(BIN)/gpulane simulate scenarios/film-burst-vs-interactive.yaml --compare fifo,strict,llama-swap,gpulane,per-job-aging

bench: install
	$(BIN)/python bench/dispatch.py
	$(BIN)/python bench/simulator.py

bench-operator: install tools
	$(BIN)/python bench/operator.py latency
	$(BIN)/python bench/operator.py scale
	$(BIN)/python bench/operator.py swap
	$(BIN)/python bench/admission.py
	$(BIN)/python bench/bridge.py

bench-chaos: install tools
	$(BIN)/python bench/chaos.py --minutes 16 --seed 1

SCENARIOS := $(wildcard scenarios/*.yaml)
plots: install
	@mkdir -p docs/img
	@for s in $(SCENARIOS); do \
		$(BIN)/gpulane simulate $$s --compare fifo,strict,llama-swap,gpulane,per-job-aging --plot docs/img/$$(basename $$s .yaml).png; \
	done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
