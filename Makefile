# make run       - set up the environment and run the workflow on the default config
# make test      - set up the environment and run the fast tier of the tests (units and small
#                  integration tests, a few minutes): everything not marked slow or slurm
# make test-all  - every test: the fast tier, the end-to-end Snakemake runs (slow) and the SLURM
#                  run (slurm; skipped without a cluster), with the 25 slowest listed (CI runs it)
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: setup run test test-all report benchmark benchmark-serve serve clean

setup: $(VENV)/.installed

# torch first and pinned: a looser spec would pull the CUDA build and several GB of packages.
# Then the package with every extra, exactly as pyproject.toml declares it, at the versions
# pinned in envs/requirements.txt (constraints: they pin, they add nothing), through uv, a few
# times faster than pip (docs/results/setup-uv-vs-pip.txt). --compile-bytecode writes each
# module's bytecode as pip does: without it, where PYTHONDONTWRITEBYTECODE is set (containers, CI
# here), every process compiles torch and transformers anew when it imports them.
# uv reads UV_INDEX_URL, not pip.conf: behind a mirror set it, or
# `make setup INSTALL='.venv/bin/python -m pip install'`.
INSTALL ?= $(VENV)/bin/uv pip install --compile-bytecode --python $(PY)
$(VENV)/.installed: envs/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c envs/requirements.txt uv
	$(INSTALL) --quiet -c envs/requirements.txt -e '.[all]'
	touch $@

run: setup
	$(VENV)/bin/snakemake --cores all

# Two test processes (pytest-xdist), each test file wholly in one of them (its module fixtures run
# once): the end-to-end and SLURM tests spend much of their time waiting on subprocesses and the
# scheduler, which the other process fills (docs/testing.md has the times; xdist's own order of
# files, most tests first, measured fastest). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
PYTEST = $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test: setup
	$(PYTEST) -m "not slow and not slurm"

test-all: setup
	$(PYTEST) --durations=25

benchmark: setup
	$(PY) scripts/benchmark.py

# after `make run`: the HTTP service on the default run's bundle, and its benchmark
BUNDLE ?= bundles/minilm-l6/picked
serve: setup
	$(VENV)/bin/bertvision serve $(BUNDLE)

benchmark-serve: setup
	$(PY) scripts/benchmark_serve.py --bundle $(BUNDLE) --workers 1 2

# the Snakemake HTML report of the last `make run` (the summary page, tables, plots, provenance);
# a run of another config: snakemake --configfile ITS.yaml --report results/report.html
report: setup
	$(VENV)/bin/snakemake --report results/report.html

# every artifact folder (bertvision/layout.py ROOTS) and Snakemake's own records
clean:
	$(VENV)/bin/bertvision clean
	rm -rf .snakemake
