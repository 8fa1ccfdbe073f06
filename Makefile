# geo-ring: `make geo-ring` runs the default scenario live; `make test` runs the regression suite.
# Both set everything up on a fresh machine (a venv in .venv with torch 2.13.0 CPU and the project).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RESULTS := results
PYTEST_ARGS ?=
# the exact tier is simulated time, CPU only: one pytest worker per core (pytest-xdist); under `make test` it runs at
# SCHED_IDLE beside the fidelity tier (tests/tiers.py: on the core that tier leaves idle), and the kernel tier alone
EXACT_ARGS ?= -n auto --maxprocesses 8

.PHONY: all setup system-deps geo-ring docs test test-exact test-fidelity test-fast test-netem bench sweep report clean-net clean

all: test

# --no-compile: pip would byte-compile every file it installs (~35 s of a fresh install, most of torch and
# transformers never imported here); Python compiles a module when it is first imported, once.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e '.[test,docs]'
	touch $(STAMP)

setup: $(STAMP)

# System commands the suite calls (user-mode-linux, kmod, gcc, prometheus, iproute2); needs root.
system-deps:
	bash .ci/system-deps

geo-ring: $(STAMP)
	$(PY) -m testbed run geo-ring --phases plain,speculative,overlap --set decode.k=auto --json $(RESULTS)/geo-ring.json \
		--trace $(RESULTS)/geo-ring.trace.json

# The whole suite in three tiers (README): exact (simulated time, no root), fidelity (real time on the relay),
# kernel (netem natively where the kernel has sch_netem and we are root, else inside user-mode-linux, else a
# loud skip).
test: $(STAMP)
	$(PY) -m agents.zoo.train
	$(PY) -m tests.tiers --exact-args="$(EXACT_ARGS)" $(PYTEST_ARGS)
	$(PY) -m netem.suite $(PYTEST_ARGS)

test-exact: $(STAMP)
	$(PY) -m pytest -m exact $(EXACT_ARGS) $(PYTEST_ARGS)

test-fidelity: $(STAMP)
	$(PY) -m pytest -m fidelity $(PYTEST_ARGS)

test-fast: test-exact

test-netem: $(STAMP)
	$(PY) -m netem.suite $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link, anchor or docstring fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) -m testbed bench --shapers virtual,userspace,netem

sweep: $(STAMP)
	$(PY) -m testbed sweep geo-ring --k 2,4,6,8,12,16,21 --alpha 0.6,0.7,0.8,0.9 --rounds 40 \
		--set scale=0.5 --json $(RESULTS)/sweep.json

report: $(STAMP)
	$(PY) -m testbed report $(RESULTS) --out $(RESULTS)

clean-net: $(STAMP)
	$(PY) -m testbed clean

clean:
	rm -rf $(VENV) .cache $(RESULTS) *.egg-info .pytest_cache site
