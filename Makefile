# The README's commands. Each creates .venv on first use and installs into it what it needs, no more:
# `make demo` the core (torch, accelerate, safetensors, numpy, tqdm), `make test` the `test` extra too.
PY      := .venv/bin/python
# torch==2.13.0 is the tested CPU build; TORCH= chooses another, options included (the README's CUDA line).
TORCH   ?= torch==2.13.0
# the newest releases of every dependency (but torch), for `make test-latest`
LATEST  := .venv-latest

.PHONY: demo test test-latest test-libraries constraints bench docs clean

# The tested set: every dependency at the version constraints.txt pins; a change of either file (or of setup.py: it
# ships the start-up hook) rebuilds the venv from nothing, so a release of a dependency never changes what runs.
# .venv/.torch: the venv with pip and torch; .venv/.core: cadence and its core dependencies (all the demo imports);
# .venv/.installed: the `test` extra on top. Each command installs only what it needs, and either may come first.
.venv/.torch: pyproject.toml constraints.txt setup.py
	rm -rf .venv
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
	$(PY) -m pip install -q $(TORCH)
	touch $@

.venv/.core: .venv/.torch
	$(PY) -m pip install -q -c constraints.txt -e .
	touch $@

.venv/.installed: .venv/.torch
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	touch $@

.venv/.docs: .venv/.torch
	$(PY) -m pip install -q -c constraints.txt -e ".[docs]"
	touch $@

demo: .venv/.core
	.venv/bin/cadence demo

test: .venv/.installed
	$(PY) -m pytest -q --durations=30  # the slowest tests listed: the suite must stay well inside CI's time

# The documentation site (mkdocs.yml), built into site/ offline: --strict fails on a broken link or anchor, a
# reference that cannot be found or a docstring that cannot be read. PYTHONPATH: this checkout's cadence documented.
docs: .venv/.docs
	PYTHONPATH=src NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# The suite on the newest release of everything: drift is seen here before it reaches the pinned set.
# A fresh venv each time: what a new user's `pip install` resolves to today.
test-latest:
	rm -rf $(LATEST)
	python3 -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
	$(LATEST)/bin/python -m pip install -q $(TORCH)
	$(LATEST)/bin/python -m pip install -q -e ".[test,docs]"
	$(LATEST)/bin/python -m pip list 2>/dev/null | grep -iE "^(transformers|accelerate|trl|sentence-transformers|datasets|peft) "
	$(LATEST)/bin/python -m pytest -q

# The library matrix: every trainer of TRL, sentence-transformers, setfit, GLiNER, PyLate and SpanMarker on
# transformers' Trainer and on cadence's, compared run against run (scripts/libraries/run.py says how). Libraries
# pinning other versions run in their own venvs, .venv-libs/NAME, built from libraries/NAME.txt (rebuilt when it
# changes); the table goes to docs/libraries-matrix.md and .json.
test-libraries: .venv/.installed
	$(PY) scripts/libraries/run.py --two-processes

# After `make test-latest` passes: its versions become the tested set.
constraints:
	test -x $(LATEST)/bin/python || { echo "run make test-latest first"; exit 2; }
	head -3 constraints.txt > constraints.new
	$(LATEST)/bin/python -m pip freeze 2>/dev/null | grep -viE "^(-e|cadence|torch==)" >> constraints.new
	mv constraints.new constraints.txt

bench: .venv/.installed
	$(PY) benchmarks/run_all.py

clean:
	rm -rf .venv $(LATEST) cadence_output site
