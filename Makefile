# The two commands a newcomer needs:  make run   |   make test
# Both create the virtualenv (.venv) and install the project on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= $(firstword $(wildcard gateway.toml))
PYTEST_ARGS ?=

.PHONY: run test chat doctor demo lint typecheck bench image i18n i18n-compile clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)  ## run the gateway (config: ./gateway.toml if present, else defaults + GATEWAY__* env)
	$(BIN)/gateway $(if $(CONFIG),--config $(CONFIG)) run

test: $(STAMP)  ## run the whole test suite (needs PostgreSQL on 127.0.0.1 for the multi-instance tests)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

chat: $(STAMP)  ## talk to the agent in this terminal
	$(BIN)/gateway $(if $(CONFIG),--config $(CONFIG)) chat

doctor: $(STAMP)
	$(BIN)/gateway $(if $(CONFIG),--config $(CONFIG)) doctor

demo: $(STAMP)  ## fake Telegram + fake model on loopback, and a gateway pointed at them
	$(BIN)/python -m tests.fakes.demo

bench: $(STAMP)  ## the benchmark suite against the loopback fakes (prints JSON; BENCH_ARGS=--short)
	$(BIN)/python -m bench.suite $(BENCH_ARGS)

image:  ## build the container image with podman, no registry needed (deploy/image.sh; root, podman + mmdebstrap)
	deploy/image.sh build

LOCALES := gateway/core/locales

i18n: $(STAMP)  ## texts in the code -> gateway.pot -> each locale's gateway.po (new ones empty), then compile
	$(BIN)/pybabel extract --mapping-file babel.cfg --keywords N_ --no-location --sort-output \
	  --project agent-gateway --msgid-bugs-address "" --output-file $(LOCALES)/gateway.pot .
	$(BIN)/pybabel update --input-file $(LOCALES)/gateway.pot --output-dir $(LOCALES) --domain gateway \
	  --no-fuzzy-matching --ignore-obsolete --ignore-pot-creation-date
	$(MAKE) i18n-compile

i18n-compile: $(STAMP)  ## gateway.po -> gateway.mo (tests/test_i18n.py checks they match)
	$(BIN)/pybabel compile --domain gateway --directory $(LOCALES) --statistics

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)  ## mypy on gateway/, agent/ and adapters/ (settings in pyproject.toml)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) data .pytest_cache
