# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint types unit services demo bench load chaos chaos-pg clean screenshot bench-viewer attack bench-hocuspocus bench-aisdk

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

types: $(STAMP)
	$(PY) -m mypy

# A PostgreSQL server for the store tests (installs Debian's postgresql when root and missing).
services: $(STAMP)
	scripts/ensure-services $(PY)

# Headless Chromium for the viewer's browser tests (installs Debian's chromium when root and missing).
.PHONY: browser
browser:
	scripts/ensure-chromium

# CONVSYNC_REQUIRE_PG=1 / CONVSYNC_REQUIRE_REDIS=1 / CONVSYNC_REQUIRE_BROWSER=1: the PostgreSQL,
# Redis and browser tests fail rather than skip when no server or no Chromium can be had.
unit: $(STAMP) services js browser
	CONVSYNC_REQUIRE_PG=1 CONVSYNC_REQUIRE_REDIS=1 CONVSYNC_REQUIRE_BROWSER=1 $(PY) -m pytest -q

# The JavaScript replica (client/web/convsync.js) against the shared vectors; node >= 20. The
# npm packages its tests use (client/web/package.json, from the lockfile) are installed first.
.PHONY: js npm
npm:
	scripts/ensure-node
	scripts/ensure-npm

js: npm
	node --test client/web/test/

test: lint types unit

# Speed and memory figures, written to docs/benchmarks.md (well over an hour). Every script in
# bench/ runs here except those with a target of their own: bench/viewer.py and
# `bench/dashboard.py page` need Chromium (bench-viewer), bench/peer_hocuspocus needs Node's
# packages (bench-hocuspocus), bench/attacks.py is a pass/fail check (attack) and bench/load.py
# writes docs/reliability.md (load). bench/_*.py are the harness's modules, not scripts.
bench: $(STAMP)
	$(PY) bench/model.py
	$(PY) bench/merge.py
	$(PY) bench/hub.py all
	$(PY) bench/subscriber.py
	$(PY) bench/snapshot.py
	$(PY) bench/store_latency.py
	$(PY) bench/durable_cpu.py
	$(PY) bench/drafts.py
	$(PY) bench/gc.py
	$(PY) bench/tail.py
	$(PY) bench/js_fold.py
	$(PY) bench/approvals.py
	$(PY) bench/delete.py
	$(PY) bench/dashboard.py cpu
	$(PY) bench/dashboard.py cpu --store memory
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/peer.py
	$(PY) bench/provider_stream.py
	$(PY) bench/provider_ui.py
	scripts/ensure-services $(PY)
	$(PY) bench/multihub.py
	PYTHONPATH=. $(PY) bench/auth.py

# convsync's JS replica against Hocuspocus (Node 22 and the npm packages from the lockfile in
# bench/peer_hocuspocus); figures go to docs/benchmarks.md (about 10 minutes).
bench-hocuspocus: $(STAMP)
	scripts/ensure-hocuspocus
	$(PY) bench/peer_hocuspocus/run.py

# /v1/aisdk against the AI SDK's resumable setup (resumable-stream on Redis, the npm packages
# from the lockfile in bench/aisdk); figures go to docs/benchmarks.md (a few minutes).
bench-aisdk: $(STAMP)
	scripts/ensure-services $(PY)
	cd bench/aisdk && npm ci --no-audit --no-fund --loglevel=error
	$(PY) bench/aisdk/run.py

# The viewer in headless Chromium: catch-up of a 10,000-message conversation to first paint;
# figures go to docs/benchmarks.md.
bench-viewer: $(STAMP) browser
	$(PY) bench/viewer.py
	$(PY) bench/dashboard.py page

# The README's screenshot of the viewer mirroring the demo (taken by the browser test).
screenshot: $(STAMP) browser
	CONVSYNC_SCREENSHOT=docs/viewer.png $(PY) -m pytest -q tests/web/test_browser.py -k mirrors

# The attacks of issue 27 against a hub process on loopback, in full (a few minutes; exit 1
# when one is not refused as promised or its peak RSS passes 2 x idle + its caps). The test
# suite runs the quick form (tests/net/test_attacks.py); the table is in docs/security.md.
attack: $(STAMP)
	$(PY) bench/attacks.py --check

# Thousands of replicas on one hub; figures go to docs/reliability.md.
load: $(STAMP)
	$(PY) bench/load.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The demo on the embedded default store (./convsync.db).
demo: $(STAMP)
	$(PY) -m client.cli demo

# 500 chaos seeds with hub kills; figures go to docs/reliability.md.
chaos: $(STAMP)
	$(PY) tests/chaos/run.py --seeds 1:501 --jobs 3 --write

# 200 chaos seeds on two hub processes sharing PostgreSQL; figures go to docs/reliability.md.
chaos-pg: $(STAMP) services
	$(PY) tests/chaos/run.py --seeds 1:201 --store postgres --hubs 2 --jobs 3 --write
