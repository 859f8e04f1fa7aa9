# Two commands do everything, on a fresh machine without a GPU:
#   make book   venv + install, execute every notebook, render the HTML book into _build/html
#   make test   venv + install, unit tests, notebooks under nbval, nbstripout --verify, strict book build
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(shell find notebooks -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' | sort)

.PHONY: book test install unit notebooks stripped book-strict sync-url clean

install: $(STAMP)
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . --path-output . 
	@echo "The book is at $(CURDIR)/_build/html/index.html"

test: $(STAMP)
	$(MAKE) unit notebooks stripped book-strict

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests

notebooks: $(STAMP)
	$(BIN)/python -m pytest -q --nbval-lax --nbval-current-env --nbval-cell-timeout=600 -p no:randomly $(NOTEBOOKS)

stripped: $(STAMP)
	$(BIN)/nbstripout --verify $(NOTEBOOKS)

# Warnings are errors. The notebooks were just executed under nbval, so this build
# checks the book itself (table of contents, cross-references, markup) without running them again.
book-strict: $(STAMP)
	mkdir -p _build
	$(BIN)/python -c 'import yaml; c = yaml.safe_load(open("_config.yml")); c["execute"]["execute_notebooks"] = "off"; yaml.safe_dump(c, open("_build/strict-config.yml", "w"))'
	set -o pipefail; $(BIN)/jupyter-book build . --path-output _build/strict -W -n --keep-going \
	    --config _build/strict-config.yml 2>&1 | tail -n 25

sync-url: $(STAMP)
	$(BIN)/python tools/sync_repo_url.py

clean:
	rm -rf _build
