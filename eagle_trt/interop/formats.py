"""What each serving engine reads from an EAGLE-3 head dir, as one table: layer ids, tensor names, norms, vocab maps.

Every fact cites the engine file (repo, path, commit) it was read from; docs/interop.md prints the table.

    fmt = FORMATS["vllm"]
    fmt.engine_ids([1, 14, 26])   # -> [2, 15, 27]: vLLM captures *before* layer j, eagle-trt the output of layer i

Two conventions for a layer id exist, and a head is only right where its ids mean what its target layers were:
- "output": id i is the output of decoder layer i (0-based). modelopt (a forward hook on layer i) and eagle-trt's
  runtime (`models/reference.target_layers` appends x after layer i).
- "before": id j is the residual stream entering layer j, i.e. the output of layer j-1 (vLLM, SGLang, speculators and
  the official EAGLE code sum hidden + residual at the top of iteration j).

And two computations of the fused feature f before the decoder layer's attention:
- "double norm": hidden_norm(input_layernorm(f)), residual f (modelopt: the HF decoder layer's input_layernorm, then
  its attention pre-hook's hidden_norm). What eagle-trt trains, and `Eagle3DraftHead.hidden_prenorm` reproduces.
- "hidden_norm only": hidden_norm(f), residual f (vLLM with norm_before_residual false, SGLang, speculators, the
  official EAGLE code, TensorRT-LLM). `hidden_prenorm=False` in eagle-trt's runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

OUTPUT, BEFORE = "output", "before"


@dataclass(frozen=True)
class Source:
    repo: str
    path: str
    commit: str
    fact: str


@dataclass(frozen=True)
class Format:
    name: str
    engine: str
    layer_prefix: str          # the decoder layer's tensor prefix the engine's loader maps
    id_meaning: str            # OUTPUT or BEFORE
    double_norm: bool          # True: the engine computes hidden_norm(input_layernorm(f)) as eagle-trt does
    writes_t2d: bool           # the target->draft bool mask beside d2t
    config_style: str          # "modelopt" (eagle-trt's draft config), "hf" (flat HF Llama + eagle ids), "speculators"
    sources: tuple[Source, ...]
    notes: tuple[str, ...] = ()

    def engine_ids(self, ours: list[int]) -> list[int]:
        """eagle-trt's ids (outputs of layers i) -> the ids this engine must read to feed the same layers."""
        if self.name == "sglang" and ours[:1] == [1]:
            # SGLang adds 1 to ids that start at 1 (modelopt's convention): every release then captures the right
            # layers, where the shifted ids would be read right only from PR #25454 on (before it, SGLang added 1
            # to every id list).
            return list(ours)
        return [i + 1 for i in ours] if self.id_meaning == BEFORE else list(ours)

    def our_ids(self, theirs: list[int]) -> list[int]:
        """This engine's ids -> eagle-trt's (the inverse of engine_ids, as the engine reads them today)."""
        if self.name == "sglang" and theirs[:1] == [1]:
            return list(theirs)
        return [j - 1 for j in theirs] if self.id_meaning == BEFORE else list(theirs)


def engine_default_ids(num_layers: int) -> list[int]:
    """The "before" ids vLLM, SGLang and speculators fall back to when a config names none: (2, L//2, L-3), which
    are modelopt's default "output" ids (1, L//2-1, L-4) shifted by one."""
    return [2, num_layers // 2, num_layers - 3]


_VLLM = "vllm-project/vllm"
_SGL = "sgl-project/sglang"
_SPEC = "vllm-project/speculators"
_MO = "NVIDIA/Model-Optimizer"
_TRT = "NVIDIA/TensorRT-LLM"

FORMATS: dict[str, Format] = {f.name: f for f in (
    Format(
        "modelopt", "NVIDIA modelopt / eagle-trt", "layers.0.", OUTPUT, True, False, "modelopt",
        (Source(_MO, "modelopt/torch/speculative/plugins/hf_eagle.py", "nvidia-modelopt 0.47.0",
                "default ids sorted({1, L//2-1, L-4}); a forward hook on each layer in "
                "eagle_aux_hidden_state_layer_ids collects that layer's output"),
         Source(_MO, "modelopt/torch/speculative/plugins/modeling_eagle.py", "nvidia-modelopt 0.47.0",
                "layers[0] keeps the HF decoder layer's input_layernorm on the hidden input; the attention pre-hook "
                "then concatenates input_layernorm(embeds) with hidden_norm(hidden): the feature is normed twice"),
         Source(_MO, "modelopt/torch/export/plugins/hf_spec_configs.py", "nvidia-modelopt 0.47.0",
                "the export nests eagle_aux_hidden_state_layer_ids under eagle_config, with "
                "use_input_layernorm_in_first_layer")),
    ),
    Format(
        "vllm", "vLLM", "layers.0.", BEFORE, False, False, "hf",
        (Source(_VLLM, "vllm/model_executor/models/llama_eagle3.py", "00bd1493b3e82d6c13c68ee8a0e1c5a96707e190",
                "load_weights renames midlayer. to layers.0., skips any name with t2d, maps d2t to "
                "draft_id_to_target_id; layer 0: input_layernorm(embeds), hidden_norm(hidden), residual = hidden "
                "unless norm_before_residual (then residual = hidden_norm(hidden)); no input_layernorm on hidden"),
         Source(_VLLM, "vllm/model_executor/models/interfaces.py (EagleModelMixin), read in excerpts",
                "9790d90f3543db70de14652d73a0f52b0457546f",
                "_maybe_add_hidden_state appends hidden_states + residual when layer_idx is in "
                "aux_hidden_state_layers, called at the top of the layer loop, before layer idx runs: id j = output "
                "of layer j-1"),
         Source(_VLLM, "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py",
                "0cfdd2e15d6991f354c6e22fd7f7e7577afe0424",
                "ids from the draft hf_config's top-level eagle_aux_hidden_state_layer_ids (eagle_config only for a "
                "layer_ids key), else the model's default (2, L//2, L-3), with a warning")),
        ("norm_before_residual written as the head was trained: false for eagle-trt's heads (residual = the raw "
         "feature), true for a speculators head trained so",),
    ),
    Format(
        "sglang", "SGLang / SpecForge", "midlayer.", BEFORE, False, True, "hf",
        (Source(_SGL, "python/sglang/srt/models/llama_eagle3.py", "03d5a7771f6082e7737a5f19cae7d1e863087013",
                "the decoder layer is the module midlayer; load_weights keeps only names found in its params (a "
                "layers.0.* tensor is dropped without a word, leaving random weights); d2t -> hot_token_id, t2d "
                "skipped; residual = hidden, input_layernorm(embeds), hidden_norm(hidden) only"),
         Source(_SGL, "python/sglang/srt/models/llama.py", "see docs/interop.md",
                "layers_to_capture: hidden_states + residual appended before layer i runs (id j = output of "
                "layer j-1); default [2, L//2, L-3]"),
         Source(_SGL, "pull request #25454 (merged 2026-05-16)", "-",
                "explicit ids get +1 only when the first id is 1; before it, always")),
        ("midlayer.* names: every SGLang release loads them; layers.0.* only from PR #24663 on",
         "ids: SGLang adds 1 to an id list that starts at 1 (modelopt's convention) and, from PR #25454 on, takes any "
         "other list as capture-before-layer ids (before it, it added 1 to every list); export writes a head whose "
         "first layer is 1 in modelopt's convention (right in every release), others shifted (right from #25454), and "
         "refuses one that reads layer 0 (its id 1 would be shifted again)"),
    ),
    Format(
        "speculators", "speculators (vLLM's format)", "layers.0.", BEFORE, False, True, "speculators",
        (Source(_SPEC, "src/speculators/models/eagle3/config.py", "11ecdd3385ed00258b89b0de8b55a0074ced9ec4",
                "Eagle3SpeculatorConfig: speculators_model_type eagle3, transformer_layer_config, draft_vocab_size, "
                "norm_before_residual, target_hidden_size, eagle_aux_hidden_state_layer_ids"),
         Source(_SPEC, "src/speculators/models/eagle3/model_definitions.py", "08af5f4dd90b8b0522432e2efedf9a5211c8770f",
                "first layer: residual = hidden; input_layernorm(embeds), hidden_norm(hidden); with "
                "norm_before_residual the residual is the normed hidden"),
         Source(_SPEC, "src/speculators/models/eagle3/core.py", "033c87f2390373b1f0fec7fbc3e29a75dc97f274",
                "decoder layers under layers.*; d2t [draft] offsets and t2d [verifier vocab] bool mask with "
                "draft_vocab_size entries set"),
         Source(_SPEC, "src/speculators/models/utils.py", "see docs/interop.md",
                "default target layer ids [2, L//2, L-3], the ids vLLM's capture-before-layer reads")),
    ),
    Format(
        "trtllm", "TensorRT-LLM", "midlayer.", OUTPUT, False, False, "modelopt",
        (Source(_TRT, "tensorrt_llm/_torch/models/modeling_speculative.py", "b35ac1b64368513d215c57d2ed01d62d910df8da",
                "Eagle3 decoder layer: residual = hidden, hidden_norm(hidden), input_layernorm(embeds): hidden_norm "
                "only"),
         Source(_TRT, "tensorrt_llm/_torch/speculative/eagle3.py", "001e67005b4f64b69b0045456870be48ab7b2cf0",
                "layers_to_capture default (1, L//2-1, L-4), modelopt's; maybe_capture_hidden_states(layer_id, "
                "hidden, residual) saves hidden + residual of that layer: ids are layer outputs"),
         Source("eagle-trt", "eagle_trt/engine/trtllm_bundle.py", "6dbcb88",
                "the bundle passes the head's ids as eagle3_layers_to_capture (TensorRT-LLM's default is "
                "modelopt's, so its ids are layer outputs) and names the decoder layer midlayer")),
        ("the draft dir a TensorRT-LLM bundle carries; `build --backend trtllm` writes the whole bundle",),
    ),
)}


def format_named(name: str) -> Format:
    from eagle_trt.errors import InputError

    if name not in FORMATS:
        raise InputError(f"--format '{name}' is not one of {', '.join(FORMATS)}")
    return FORMATS[name]
