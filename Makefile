# gpucloud — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PORT   ?= 8000
BIN    := $(VENV)/bin

.PHONY: demo test lint schema clean help

help:
	@echo "make demo   - the platform on embedded defaults (SQLite, filesystem broker) at http://127.0.0.1:$(PORT)"
	@echo "make test   - the whole test suite against PostgreSQL and Redis on 127.0.0.1"
	@echo "make lint   - ruff and mypy"
	@echo "make schema - write the OpenAPI schema to var/openapi.yml"

# The virtualenv is rebuilt whenever requirements.txt changes.
$(BIN)/.installed: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	touch $@

demo: $(BIN)/.installed
	DEBUG=$${DEBUG:-1} PORT=$(PORT) $(BIN)/python manage.py demo

test: $(BIN)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(BIN)/.installed
	$(BIN)/python -m pip install -q ruff==0.14.5 mypy==1.18.2
	$(BIN)/ruff check .
	$(BIN)/mypy

schema: $(BIN)/.installed
	mkdir -p var && DEBUG=1 $(BIN)/python manage.py spectacular --validate --fail-on-warn --file var/openapi.yml

clean:
	rm -rf var $(VENV)
