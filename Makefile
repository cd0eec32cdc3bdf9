# The two commands: `make demo` (end-to-end demo, writes a report) and `make test`.
# Each bootstraps a virtual environment in .venv from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.originlens-installed
TEST_STAMP := $(VENV)/.originlens-test-installed
# torch is pinned to the CPU wheel this machine class carries; every other package CI installs is pinned
# by requirements-ci.txt (constraints); the package itself accepts ranges (pyproject.toml).
TORCH_PIN ?= torch==2.13.0
CONSTRAINTS := -c requirements-ci.txt

.PHONY: demo test test-portable lint venv clean bench

$(STAMP): pyproject.toml requirements-ci.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q $(CONSTRAINTS) -e '.[dev,hf]'
	touch $(STAMP)

# the tests also check our SAEs / TL adapter against SAELens and TransformerLens themselves and the
# generic backend through nnsight (test-only extra [interop])
# and the spaCy annotator on a pipeline they build (extra [syntax]; no downloaded model needed)
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q $(CONSTRAINTS) -e '.[dev,hf,interop,syntax]'
	touch $(TEST_STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/originlens demo --out runs/demo

# guard-rails (CI runs them before the tests): lint, formatting and type checking, configured in pyproject.toml
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

test: $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 tests

# every benchmark at its quick size, each figure beside its floor (the guards make test checks and the
# reference floors it does not); `benchmarks/run_all.py --reference` runs the RESULTS.md sizes
# the numerical packages under torch's scalar kernels (ATEN_CPU_CAPABILITY=default) and one thread: the
# summation orders of another CPU, on this one (.ci/run runs it after `make test`)
NUMERICAL_TESTS := tests/test_portability.py tests/theory tests/stats tests/models tests/attribution tests/train tests/probes tests/tasks tests/sae
test-portable: $(TEST_STAMP)
	ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -q -n 2 $(NUMERICAL_TESTS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py --quick --reference

clean:
	rm -rf $(VENV) runs
