# One entry point per thing CI and people do. `make test` is exactly what CI runs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export SPARK_LOCAL_IP ?= 127.0.0.1
# The docs build imports the code it documents (this checkout's, not another install's); the
# banners MkDocs' plugins print about a future MkDocs 2 are off.
MKDOCS := PYTHONPATH=$(CURDIR) NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs
# The example pipelines, unless the environment names the user's own modules.
export SLUICE_PIPELINES ?= examples.clickstream,examples.clickstream_iceberg,examples.orders

.PHONY: install demo test test-fast faults lint docs docs-serve ui bench bench-e2e clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,examples]'
	rm -f $(VENV)/.installed-* && touch $@

## demo: set everything up on embedded defaults and run the clickstream example pipeline
demo: install
	$(BIN)/sluice demo clickstream

## test: the whole suite against a real Postgres, real local Spark, real Dagster; its files
## spread over TEST_WORKERS processes (pytest-xdist, a file's tests in one process; each process
## has its own database on the shared embedded server). TEST_WORKERS=0: one process
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

## test-fast: unit tests only (no Postgres, no Spark)
test-fast: install
	$(BIN)/python -m pytest tests/unit

## faults: exactly-once under SIGKILLed Spark workers, drivers, Dagster daemon; Postgres restarts;
## the S3 endpoint unreachable (landing and warehouse on the S3 test server); the CDC source
## (sink == table under a concurrent writer; Postgres crashed during the snapshot) and the Kafka
## source (output == produced, exactly once; the consumer group never ahead of Sluice); the
## error-injection matrix (tests/faults/test_errors_*.py), its `extended` cases included;
## then the `extended` cases outside tests/faults (the examples on S3 through the CLI, the
## external connector through the CLI, the continuous run under a real dagster-daemon)
faults: install
	$(BIN)/python -m pytest tests/faults -m faults -s
	$(BIN)/python -m pytest tests/examples tests/integration tests/dagster -m extended -s

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	PYTHONPATH=$(CURDIR) $(BIN)/lint-imports
	site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && $(MKDOCS) build --strict --quiet -d "$$site"

## docs: build the documentation site into site/ (strict: a broken link or reference fails)
docs: install
	$(MKDOCS) build --strict

## docs-serve: the documentation site on http://127.0.0.1:8000, rebuilt on every change
docs-serve: install
	$(MKDOCS) serve -a 127.0.0.1:8000

## ui: Dagster UI on 127.0.0.1:3000 with DAGSTER_HOME under .sluice/ (no telemetry, no dialog)
ui: install
	home=$$($(BIN)/sluice dagster-home) && DAGSTER_HOME=$$home $(BIN)/dagster dev \
		-h 127.0.0.1 -p 3000 -m dagster_project.definitions

bench: install
	$(BIN)/python bench/async_io.py
	$(BIN)/python bench/enumerator.py
	$(BIN)/python bench/checkpoint.py
	$(BIN)/python bench/s3_discovery.py

## bench-e2e: Sluice vs naive Spark vs a broadcast join vs pgbench, 1M events (ARGS=--quick)
bench-e2e: install
	$(BIN)/python bench/e2e.py $(ARGS)

clean:
	rm -rf $(VENV) .sluice data site .pytest_cache .mypy_cache .ruff_cache
