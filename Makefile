# gpulane: the two commands that matter are `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lock test unit lint crds chart demo simulate bench bench-operator bench-chaos plots clean browser screenshots
.DEFAULT_GOAL := help

help:
	@echo "make demo      - set up the local cluster with the real node gpu-0, install the chart, play a film against"
	@echo "                 interactive calls live, and compare with FIFO and strict priority (docs/demo.md)"
	@echo "make simulate  - the film-versus-interactive simulation: the policy comparison table, in a second"
	@echo "make test      - install everything needed, lint, and run the whole suite (unit + e2e)"
	@echo "make lint      - ruff, and mypy (strict on every package of gpulane)"
	@echo "make install   - create .venv and install gpulane with its dev extras, pinned by requirements.lock"
	@echo "make lock      - refresh requirements.lock within pyproject.toml's ranges (pip-compile)"
	@echo "make crds      - regenerate crds/, the chart's values schema and the admission policies (CEL) from gpulane/"
	@echo "make chart     - lint the chart and package it into dist/gpulane-<version>.tgz"
	@echo "make bench     - dispatcher and simulator benchmarks (figures go to docs/benchmarks.md)"
	@echo "make bench-operator - on the local cluster: dispatch latency, 5,000 jobs, swaps on the real node, admission, bridge"
	@echo "make bench-chaos - 16 minutes of faults (leader, pods, apiserver, etcd, webhook, kubelet, containerd); docs/reliability.md"
	@echo "make plots     - regenerate the scenario plots in docs/img/"
	@echo "make tools     - build the local control plane's and the real node's binaries once (see docs/development.md)"
	@echo "make images    - the pause, Python base and gpulane images for the real node, without a registry"
	@echo "make llama-server - llama.cpp's llama-server built into an image: the e2e suite's real model server"
	@echo "make cluster-up / cluster-status / cluster-down - the local cluster with the real GPU node gpu-0 (NODE=kwok: a kwok gpu-0)"
	@echo "make e2e       - only the end-to-end tests against the local control plane"
	@echo "make browser   - Debian's chromium for the web page's browser tests (apt-get; make test runs it)"
	@echo "make screenshots - the web page's screenshots in docs/img/, taken by its browser tests"

install: $(STAMP)
# pyproject.toml keeps open ranges; requirements.lock pins what is installed (here and in the image).
$(STAMP): pyproject.toml requirements.lock
	@command -v $(PY) >/dev/null || { echo "error: $(PY) not found; install Python 3.11 or run make PY=python3.x" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip
	$(BIN)/pip install -q -c requirements.lock -e '.[dev,plots]'
	@touch $@

# Refresh the pins within pyproject.toml's ranges (pip-tools' pip-compile), then `make install`.
lock: $(STAMP)
	$(BIN)/pip install -q pip-tools
	$(BIN)/pip-compile --quiet --upgrade --all-extras --strip-extras --no-emit-index-url --no-emit-find-links \
		--output-file requirements.lock pyproject.toml

include hack/cluster.mk

# The suite's groups side by side (docs/development.md, Groups): worker gw0 runs the serial group on the
# cluster with the real node gpu-0, each other worker the parallel groups on a kwok cluster of its own.
TEST_WORKERS ?= 3
test: lint tools llama-server browser
	$(BIN)/pytest -q -n $(TEST_WORKERS)

# Debian's Chromium for the web page's browser tests: Playwright drives it and never downloads a browser.
CHROMIUM ?= /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@test -x $(CHROMIUM) || { echo "installing Debian's chromium for the web page's browser tests"; \
		$(SUDO) apt-get install -y -q chromium >/dev/null || \
		{ $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q chromium >/dev/null; }; }

# The web page's screenshots in docs/img/ (docs/ui.md), taken by its browser tests on the local cluster.
screenshots: install tools browser
	GPULANE_SCREENSHOTS=$(CURDIR)/docs/img $(BIN)/pytest -q tests/e2e/test_ui.py

unit: install
	$(BIN)/pytest -q -m 'not e2e'

# The typed fakes' mypy run keeps a cache of its own: with the other run's options it would invalidate that
# cache, and each run would take 19 s instead of about 1 warm.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy gpulane
	$(BIN)/mypy --follow-imports=silent --cache-dir .mypy_cache/typed_fakes tests/unit/typed_fakes.py

HELM = $$(hack/tools/build.sh --bindir)/helm
# The chart linted and packaged into dist/ (gpulane-<version>.tgz), CRDs and dashboard included.
chart: tools
	@$(HELM) lint --strict charts/gpulane
	@$(HELM) package charts/gpulane --destination dist
crds: install
	$(BIN)/python -m gpulane.api.crd crds
	$(BIN)/python -m gpulane.api.values_schema charts/gpulane/values.schema.json
	$(BIN)/python -m gpulane.admission.cel

# The tools, the cluster and the images are steps of the demo itself, so that it can show their progress.
demo: install
	@$(BIN)/python hack/gpulane_demo.py

simulate: install
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
	$(BIN)/python bench/apiserver_writes.py

bench-chaos: install tools
	$(BIN)/python bench/chaos.py --minutes 16 --seed 1

SCENARIOS := $(wildcard scenarios/*.yaml)
plots: install
	@mkdir -p docs/img
	@for s in $(SCENARIOS); do \
		$(BIN)/gpulane simulate $$s --compare fifo,strict,llama-swap,gpulane,per-job-aging --plot docs/img/$$(basename $$s .yaml).png; \
	done
	$(BIN)/gpulane simulate scenarios/film-burst-vs-interactive.yaml --compare fifo,llama-swap,gpulane --plot docs/img/policies.png >/dev/null
	$(BIN)/python docs/diagrams/call_path.py docs/img/call-path.png

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
