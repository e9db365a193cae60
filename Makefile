# Set-up and checks. Each target creates .venv and installs what it needs, once.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# A CPU build of torch 2.13.0 lies on these machines; any other version pulls CUDA builds.
TORCH := torch==2.13.0

.PHONY: test demo soak lint clean

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip >$(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	@$(PY) -m pip install -q $(TORCH) >>$(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	@$(PY) -m pip install -q -e '.[dev,s3,torch]' >>$(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	@$(PY) -m pip check >>$(VENV)/install.log 2>&1 || (cat $(VENV)/install.log; exit 1)
	@touch $(STAMP)

lint: $(STAMP)
	@$(PY) -m ruff check -q .
	@$(PY) -m mypy --no-error-summary

test: $(STAMP) lint
	@$(PY) -m pytest

demo: $(STAMP)
	@$(VENV)/bin/lakestream demo

# The full reliability matrix: more seeds, trials and faults; its tally goes to
# bench/results/reliability.json and RELIABILITY.md.
soak: $(STAMP)
	@start=$$(date +%s); \
	LAKESTREAM_SOAK=1 LAKESTREAM_RELIABILITY_REPORT=bench/results/reliability.json \
		$(PY) -m pytest -q tests/reliability \
		tests/producers/test_crash.py::test_killed_at_every_failpoint_then_restarted \
		tests/producers/test_hostcommit.py::test_a_host_committer_killed_at_every_failpoint_loses_and_duplicates_nothing \
		tests/producers/test_storeruns.py::test_pooling_hosts_killed_at_every_failpoint_lose_and_duplicate_nothing && \
	$(PY) -m bench.reliability_report $$(( $$(date +%s) - start ))

clean:
	rm -rf $(VENV) build *.egg-info
