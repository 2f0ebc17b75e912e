# The two commands of the README. Each creates .venv on first use and installs into it.
PY      := .venv/bin/python
# torch==2.13.0 is the CPU build that lies on these machines' disk; set TORCH= to choose another.
TORCH   ?= torch==2.13.0

.PHONY: demo test bench clean

.venv/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

demo: .venv/.installed
	.venv/bin/cadence demo

test: .venv/.installed
	$(PY) -m pytest -q

bench: .venv/.installed
	$(PY) benchmarks/run_all.py

clean:
	rm -rf .venv cadence_output
