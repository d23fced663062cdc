# ctxsim: `make demo` and `make test` are the whole set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SHARED ?= ../shared/traces

.PHONY: install demo test bench check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/ctxsim traces import traces/samples --out out/demo/compiled
	$(BIN)/ctxsim traces stats traces/samples --parquet out/demo/stats.parquet
	$(BIN)/ctxsim run traces/samples --out out/demo/run

test: $(STAMP)
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/pytest tests/bench --benchmark-only --benchmark-columns=min,median,mean,rounds -p no:randomly

check: $(STAMP)
	$(BIN)/ruff check simulator policies traces reports tests
	$(BIN)/ruff format --check simulator policies traces reports tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
