# make run   - set up the environment and run the workflow on the default config
# make test  - set up the environment and run the test suite
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
CORES ?= all

.PHONY: setup run test report benchmark clean

setup: $(VENV)/.installed

# torch first and pinned: a looser spec would pull the CUDA build and several GB of packages.
$(VENV)/.installed: envs/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r envs/requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

run: setup
	$(VENV)/bin/snakemake --cores $(CORES)

test: setup
	$(PY) -m pytest

benchmark: setup
	$(PY) scripts/benchmark.py

clean:
	rm -rf data models features heads results logs benchmarks .snakemake
