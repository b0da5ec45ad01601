# gpucloud — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PORT   ?= 8000
BIN    := $(VENV)/bin

.PHONY: demo test chaos lint schema vendor clean help

help:
	@echo "make demo   - the platform on embedded defaults (SQLite, filesystem broker) at http://127.0.0.1:$(PORT)"
	@echo "make test   - the whole test suite against PostgreSQL and Redis on 127.0.0.1"
	@echo "make chaos  - the HA topology (haproxy, 2 webs, 2 workers, 2 beats) with processes killed under load"
	@echo "make lint   - ruff, mypy and lint-imports (the app layers, docs/architecture.md)"
	@echo "make schema - write the OpenAPI schema to var/openapi.yml"
	@echo "make vendor - refresh the console's browser libraries (htmx, uPlot, xterm.js) from npm"

# The virtualenv is rebuilt whenever requirements.txt changes.
# The CLI and SDK (sdk/, a distribution of its own) go in too: $(BIN)/gpucloud.
$(BIN)/.installed: requirements.txt sdk/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q -e ./sdk
	touch $@

demo: $(BIN)/.installed
	DEBUG=$${DEBUG:-1} PORT=$(PORT) $(BIN)/python manage.py demo

test: $(BIN)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Needs haproxy on the PATH (Debian: apt-get install haproxy). About two minutes.
chaos: $(BIN)/.installed
	$(BIN)/python -m pytest chaos $(PYTEST_ARGS)

lint: $(BIN)/.installed
	$(BIN)/python -m pip install -q ruff==0.14.5 mypy==1.18.2
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

schema: $(BIN)/.installed
	mkdir -p var && DEBUG=1 $(BIN)/python manage.py spectacular --validate --fail-on-warn --file var/openapi.yml

# The console's browser libraries, from the npm registry, served by the app itself (no CDN).
# The copies are committed, so `make demo` needs no Node.js; run this after changing frontend/package.json.
VENDOR := frontend/static/vendor
vendor:
	cd frontend && npm ci --no-audit --no-fund
	mkdir -p $(VENDOR)/htmx $(VENDOR)/uplot $(VENDOR)/xterm
	cp frontend/node_modules/htmx.org/dist/htmx.min.js frontend/node_modules/htmx.org/LICENSE $(VENDOR)/htmx/
	cp frontend/node_modules/uplot/dist/uPlot.iife.min.js frontend/node_modules/uplot/dist/uPlot.min.css \
	   frontend/node_modules/uplot/LICENSE $(VENDOR)/uplot/
	cp frontend/node_modules/@xterm/xterm/lib/xterm.js frontend/node_modules/@xterm/xterm/css/xterm.css \
	   frontend/node_modules/@xterm/xterm/LICENSE $(VENDOR)/xterm/
	cp frontend/node_modules/@xterm/addon-fit/lib/addon-fit.js $(VENDOR)/xterm/
	cp frontend/node_modules/@xterm/addon-fit/LICENSE $(VENDOR)/xterm/LICENSE.addon-fit
	sed -i '/sourceMappingURL=/d' $(VENDOR)/xterm/*.js  # the maps are not vendored (collectstatic follows them)

clean:
	rm -rf var $(VENV)
