# Developer commands. `make run` and `make test` are the two a newcomer needs.
VENV ?= .venv
PY := $(VENV)/bin/python
PACKAGES := echo-proto echo-controller echo-core echo-gating echo-scheduler echo-kernels echo-sgl-kernel echo-sglang echo-server echo-lab
STAMP := $(VENV)/.echo-setup-stamp
SETUP_INPUTS := scripts/setup.sh scripts/requirements-dev.txt $(wildcard packages/*/pyproject.toml)

.PHONY: setup run test test-sglang lint typecheck proto proto-check pytest format gpu-check-dry

$(STAMP): $(SETUP_INPUTS)
	bash scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

## The main job on the embedded default (real model, real prompts, CPU).
run: $(STAMP)
	$(PY) -m echo_server.cli demo

## Everything CI checks: lint, types per package, generated code, tests.
test: lint typecheck proto-check pytest gpu-check-dry

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	bash scripts/buf.sh

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP)
	@for p in $(PACKAGES); do \
	  echo "mypy --strict packages/$$p"; \
	  (cd packages/$$p && ../../$(VENV)/bin/mypy --strict --config-file ../../pyproject.toml --cache-dir ../../.mypy_cache src tests) || exit 1; \
	done
	@echo "mypy --strict scripts/gpu_check (the GPU acceptance run) and the GPU-facing scripts"
	MYPYPATH=scripts:$(subst $(eval) ,:,$(wildcard packages/*/src)) $(VENV)/bin/mypy --strict \
	  --config-file pyproject.toml --cache-dir .mypy_cache scripts/gpu_check \
	  packages/echo-kernels/scripts packages/echo-lab/scripts/schedule_vs_gpu.py

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

proto-check: $(STAMP)
	$(PY) scripts/gen_proto.py --check

## scripts/gpu_check.sh's dry run: collects the GPU tier, imports, tiny engine + attention on the CPU.
gpu-check-dry: $(STAMP)
	PYTHON=$(PY) bash scripts/gpu_check.sh --dry-run

pytest: $(STAMP)
	$(PY) -m pytest -m "not gpu and not sglang_server" -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi; exit $$rc

## The SGLang tier: a real sglang.launch_server on the CPU with the ECHO plugin (its own venv,
## built by scripts/sglang/setup_env.sh; about 3 GB). .ci/run calls it after `make test`.
test-sglang: $(STAMP)
	bash scripts/sglang/setup_env.sh
	ECHO_SGLANG_REQUIRED=1 $(PY) -m pytest -m sglang_server -q -p no:cacheprovider tests/sglang_server
