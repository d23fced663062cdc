# ctxsim: `make demo` and `make test` are the whole set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
SHARED ?= ../shared/traces

.PHONY: install bytecode demo test bench check clean

# The main job needs the runtime dependencies only; tests, benchmarks and checks add the dev
# extras (pytest, hypothesis, ruff, mypy, Ray, Optuna) to the same environment.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(DEV_STAMP)

install: $(STAMP)

# Bytecode of the project's own modules: pip compiles what it installs, but an editable
# install is source, and where PYTHONDONTWRITEBYTECODE is set (as in many containers) every
# ctxsim process would compile about 60 modules again: 0.3-0.5 s of each command, of each
# sweep worker's fork server and of the suite's CLI tests. Python checks each file against
# its source, so an edited module is compiled afresh; this step skips what is current.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q simulator policies traces reports

demo: bytecode
	$(BIN)/ctxsim traces import traces/samples --out out/demo/compiled
	$(BIN)/ctxsim traces stats traces/samples --parquet out/demo/stats.parquet
	$(BIN)/ctxsim run traces/samples --out out/demo/run --policy claude-code \
	    --policy policies/variants/cc-buffer-8k.toml --policy codex --policy as-recorded

test: $(DEV_STAMP) bytecode
	$(BIN)/pytest

bench: $(DEV_STAMP) bytecode
	$(BIN)/pytest tests/bench --benchmark-only --benchmark-columns=min,median,mean,rounds -p no:randomly

check: $(DEV_STAMP)
	$(BIN)/ruff check simulator policies traces reports tests
	$(BIN)/ruff format --check simulator policies traces reports tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
	find simulator policies traces reports -name __pycache__ -prune -exec rm -rf {} +
