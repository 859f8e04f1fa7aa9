# Two commands do everything, on a fresh machine without a GPU:
#   make book   venv + install, execute every notebook, render the HTML book into _build/html
#   make test   venv + install, unit tests, notebooks under nbval, nbstripout --verify, strict book build
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(shell find notebooks -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' | sort)

.PHONY: book test install unit notebooks stripped book-strict sync-url clean grade

install: $(STAMP)
$(STAMP): requirements.txt pyproject.toml tools/ipython_kernel_config.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	mkdir -p $(VENV)/etc/ipython && cp tools/ipython_kernel_config.py $(VENV)/etc/ipython/
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
	    --config _build/strict-config.yml 2>&1 | sed '/The HTML pages are in/d; /Finished generating HTML/,$$d' | tail -n 25
	@echo "The strict build passed (it checks the markup; its pages have no outputs). To read the book,"
	@echo "run make book and open $(CURDIR)/_build/html/index.html"

# Part III's score table: the assignments as they are (make grade), or the solutions (make grade ARGS=--solutions)
grade: $(STAMP)
	$(BIN)/python -m minicompile.grade $(ARGS)

sync-url: $(STAMP)
	$(BIN)/python tools/sync_repo_url.py

clean:
	rm -rf _build

# ---- Python 3.13: the capture tests in a Debian trixie chroot (not part of `make test`) ----
# Built once into chroot/ (ignored): debootstrap, Python 3.13 in a venv, torch's cp313 wheel from
# PyPI with its dependencies (PyPI's Linux wheel is the CUDA build: `import torch` loads the CUDA
# libraries even on a CPU-only machine, so --no-deps does not work), pytest, numpy.
# Needs root (debootstrap, chroot, bind mounts).
PY313_ROOT := chroot/trixie
PY313_PKGS := numpy pytest

.PHONY: test-py313 py313-chroot
PY313_CHROOT = chroot $(PY313_ROOT) /usr/bin/env -i HOME=/root PATH=/opt/py313/bin:/usr/bin:/bin \
    PIP_CERT=/etc/ssl/certs/host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1

py313-chroot: $(PY313_ROOT)/.ready
$(PY313_ROOT)/.ready:
	command -v debootstrap >/dev/null || apt-get install -y debootstrap
	test -e $(PY313_ROOT)/.debootstrapped || { \
	    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
	        trixie $(CURDIR)/$(PY313_ROOT) && touch $(PY313_ROOT)/.debootstrapped; }
	cp /etc/resolv.conf $(PY313_ROOT)/etc/resolv.conf
	# g++: minicompile's C++ kernels; python3-dev: Inductor's (the tests that run it)
	chroot $(PY313_ROOT) /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
	    sh -c '{ command -v g++ && ls /usr/include/python3*/Python.h; } >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q --no-install-recommends g++ python3-dev; }'
	# this machine's CA bundle (it may include the certificate of a TLS-inspecting proxy)
	cp /etc/ssl/certs/ca-certificates.crt $(PY313_ROOT)/etc/ssl/certs/host-ca.crt
	test -x $(PY313_ROOT)/opt/py313/bin/python || chroot $(PY313_ROOT) python3 -m venv /opt/py313
	$(PY313_CHROOT) pip install -q --no-cache-dir torch==2.13.0 $(PY313_PKGS)
	$(PY313_CHROOT) python -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.ones(2).sum().item())'
	du -sh $(PY313_ROOT)
	touch $@

# The repository is bind-mounted read-write at /repo; the trap unmounts it whatever the tests do.
PY313_TESTS ?= tests/test_capture*.py tests/test_api.py
test-py313: $(PY313_ROOT)/.ready
	mkdir -p $(PY313_ROOT)/repo $(PY313_ROOT)/proc
	trap 'umount -q $(CURDIR)/$(PY313_ROOT)/repo; umount -q $(CURDIR)/$(PY313_ROOT)/proc' EXIT; \
	mountpoint -q $(PY313_ROOT)/proc || mount -t proc proc $(PY313_ROOT)/proc; \
	mountpoint -q $(PY313_ROOT)/repo || mount --bind $(CURDIR) $(PY313_ROOT)/repo; \
	$(PY313_CHROOT) PYTHONPATH=/repo PYTHONDONTWRITEBYTECODE=1 /bin/bash -c \
	    'cd /repo && python --version && python -m pytest -q -p no:cacheprovider $(PY313_TESTS)'
