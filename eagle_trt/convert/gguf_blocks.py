"""A GGUF file's weights as their own quantized blocks, under HF names and with rows in HF order.

    from eagle_trt.convert.gguf_blocks import read_blocks, dequantize
    blocks = read_blocks("models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    qt = blocks["model.layers.0.mlp.down_proj.weight"]     # QuantTensor("q4_k" or "q6_k", (1536, 8960), uint8 rows)
    w = dequantize(qt)                                      # what transformers' GGUF loader gives, bit for bit

Nothing is de-quantized on the way: `data` holds the file's bytes (a copy-on-write map of the file, read by
`gguf_file.py`), so reading a tensor costs no copy unless its rows are reordered. What differs from the file is
what transformers' GGUF loader (transformers/modeling_gguf_pytorch_utils.py) changes, so that `dequantize` of
every tensor here equals the loader's state dict, which `convert` produced until now:
- names: llama.cpp's (`blk.N.attn_q.weight`) become HF's (`model.layers.N.self_attn.q_proj.weight`); tensors HF
  has no parameter for (llama 3's `rope_freqs.weight`) are left out, as the loader leaves them;
- Q/K rows of a `llama`-architecture file (SmolLM2, Llama, Mistral): llama.cpp's converter permutes each head's
  rows from HF's rotate-half order into interleaved pairs; the loader reverses that. A row is quantized on its own
  (blocks run along in_features), so reordering whole rows of blocks reverses it losslessly. Qwen2 files are not
  permuted (their converter does not);
- tied embeddings: a file without `output.weight` ties the LM head to the embedding, and `lm_head.weight` is the
  very `QuantTensor` of `model.embed_tokens.weight` (as the loader's model shares the one parameter).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from eagle_trt.architectures import family_of_type
from eagle_trt.convert.gguf_file import GGUFFile, TensorInfo
from eagle_trt.errors import CheckpointError
from eagle_trt.quant_blocks import (  # noqa: F401  (re-exported: the one import for convert and build)
    BLOCK_BYTES, BLOCK_WEIGHTS, BLOCKS, BYTES_PER_256, FORMATS, QuantTensor, dequantize, row_layout,
)
from eagle_trt.quant_encode import quantize_rows  # noqa: F401  (re-exported)

# ggml type name -> our format; the others are refused by name.
GGML_FORMATS = {
    "F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1",
    "Q5_0": "q5_0", "Q5_1": "q5_1", "Q4_K": "q4_k", "Q5_K": "q5_k", "Q6_K": "q6_k",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_GLOBAL = re.compile(r"(\w+)\.(weight|bias)")
# transformers' GGUF loader reverses the Q/K permutation for this general.architecture only.
_PERMUTED_ARCH = "llama"


def hf_name(gguf_name: str) -> str | None:
    """The HF parameter name of a llama-family GGUF tensor, or None where HF has no parameter for it."""
    if m := _LAYER.fullmatch(gguf_name):
        part = _LAYER_NAMES.get(m[2])
        return None if part is None else f"model.layers.{m[1]}.{part}.{m[3]}"
    if m := _GLOBAL.fullmatch(gguf_name):
        base = _GLOBAL_NAMES.get(m[1])
        return None if base is None else f"{base}.{m[2]}"
    return None


def _head_counts(gf: GGUFFile, arch: str) -> tuple[int, int]:
    counts = []
    for key in (f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"):
        value = gf.metadata.get(key)
        if not isinstance(value, int) or value <= 0:
            raise CheckpointError(f"{gf.path}: {key} is {value!r}, not a positive integer; it is needed to restore "
                                  "the Q/K row order; re-convert the GGUF")
        counts.append(value)
    return counts[0], counts[1]


def _unpermute(qt: QuantTensor, n_head: int, name: str) -> QuantTensor:
    """Reverse llama.cpp's Q/K permutation: within each head, GGUF row 2i+j holds HF row j·(dim/2)+i."""
    rows = qt.shape[0]
    if rows % (2 * n_head):
        raise CheckpointError(f"{name}: {rows} rows do not split into {n_head} heads of rotary pairs")
    order = torch.arange(rows).reshape(n_head, rows // n_head // 2, 2).transpose(1, 2).reshape(-1)
    if len(qt.shape) == 2:
        return QuantTensor(qt.format, qt.shape, qt.data[order].contiguous())
    n, b = BLOCKS[qt.format]
    if n != 1:
        raise CheckpointError(f"{name}: a 1-D {qt.format} tensor's elements cannot be reordered; re-convert the "
                              "GGUF with a float bias")
    return QuantTensor(qt.format, qt.shape, qt.data.reshape(rows, b)[order].reshape(1, -1))


def _quant_tensor(gf: GGUFFile, t: TensorInfo) -> QuantTensor:
    """One GGUF tensor as rows of blocks, shape in HF order (GGUF lists in_features first)."""
    fmt = GGML_FORMATS.get(t.type_name)
    if fmt is None:
        raise CheckpointError(f"{gf.path}: tensor {t.name} is ggml type {t.type_name}, which eagle-trt does not "
                              f"read (it reads {', '.join(GGML_FORMATS)}); use a GGUF quantized to one of those")
    shape = tuple(reversed(t.dims))
    if not 1 <= len(shape) <= 2:
        raise CheckpointError(f"{gf.path}: tensor {t.name} has {len(shape)} dimensions {shape}; only 1-D and 2-D "
                              "weights are read")
    rows, row_bytes = row_layout(fmt, shape)
    return QuantTensor(fmt, shape, torch.from_numpy(gf.raw(t)).reshape(rows, row_bytes))


def read_blocks(path: str | Path, names=None) -> dict[str, QuantTensor]:
    """The weights of the GGUF at `path` by HF name (all, or those in `names`), each as its file's blocks, rows
    in HF order. A name that is not in the file, or a ggml type outside FORMATS, is a CheckpointError."""
    path = Path(path)
    gf = GGUFFile.open(path)
    arch = gf.metadata.get("general.architecture", "<missing>")
    family_of_type(arch, path)
    heads = _head_counts(gf, arch) if arch == _PERMUTED_ARCH else None
    by_hf = {}
    for t in gf.tensors.values():
        name = hf_name(t.name)
        if name is not None:
            by_hf[name] = t
    tied = "lm_head.weight" not in by_hf and "model.embed_tokens.weight" in by_hf
    wanted = list(by_hf) + (["lm_head.weight"] if tied else []) if names is None else list(names)
    missing = [n for n in wanted if n not in by_hf and not (tied and n == "lm_head.weight")]
    if missing:
        raise CheckpointError(f"{path} has no tensor {missing[0]}" + (f" (and {len(missing) - 1} more)"
                              if len(missing) > 1 else "") + "; is it a GGUF of this model?")
    out: dict[str, QuantTensor] = {}
    for name in wanted:
        source = "model.embed_tokens.weight" if tied and name == "lm_head.weight" else name
        if source in out:
            out[name] = out[source]
            continue
        qt = _quant_tensor(gf, by_hf[source])
        if heads is not None and ".self_attn.q_proj." in source:
            qt = _unpermute(qt, heads[0], source)
        elif heads is not None and ".self_attn.k_proj." in source:
            qt = _unpermute(qt, heads[1], source)
        out[name] = out[source] = qt
    return {name: out[name] for name in wanted}
