"""A tiny GGUF that `eagle-trt convert` takes end to end (a 2-layer llama with a byte-level BPE vocabulary in its
metadata, every block format the engine reads), an EAGLE-3 head that fits it, and where its bytes lie, for tests that
damage the file in place. Nothing is downloaded; everything is seeded.

    path = write_model_gguf(tmp / "m.gguf")              # 96 tokens, hidden 256, projections in 8 formats
    head = write_head(tmp / "head")                      # aux layers [0, 1], a 48-token draft vocab with d2t
    layout = tensor_layout(path.read_bytes())            # {name: Entry(type_at, offset_at, data_at, ...)}
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import gguf
import torch
from safetensors.torch import save_file

from eagle_trt.convert.gguf_file import GGUFFile
from eagle_trt.models.block_weights import FORMATS as BLOCK_FORMATS
from test_gguf_blocks import FFN, HEADS, HIDDEN, KV_HEADS, LAYER_FORMATS, LAYERS, VOCAB, _add

FORMAT_OF = {ggml: fmt for fmt, ggml in BLOCK_FORMATS.items()}  # ggml type id -> block format name
HEAD_DIM = HIDDEN // HEADS
AUX = [0, 1]
DRAFT_VOCAB = 48
# 92 printable characters, two merged pieces, the space, and the end token: 96 = VOCAB.
TOKENS = [chr(c) for c in range(33, 125)] + ["Ġt", "Ġa", "Ġ", "<|endoftext|>"]
PROMPT = "at tat a"


def write_model_gguf(path: Path, seed: int = 0) -> Path:
    """A 2-layer llama GGUF with its tokenizer: the projections in q4_k, q8_0, q6_k, q4_0, q5_0, q5_1, q5_k, the
    embedding q4_1 and the LM head f16 (the block formats the kernels read), norms f32."""
    gen = torch.Generator().manual_seed(seed)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("tiny-fuzz")
    w.add_context_length(128)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_types([1] * (VOCAB - 1) + [3])
    w.add_token_merges(["Ġ t", "Ġ a"])  # two: transformers reads a one-element array as a bare string
    w.add_bos_token_id(VOCAB - 1)
    w.add_eos_token_id(VOCAB - 1)
    _add(w, "token_embd.weight", "q4_1", (VOCAB, HIDDEN), gen)
    _add(w, "output.weight", "f16", (VOCAB, HIDDEN), gen)
    _add(w, "output_norm.weight", "f32", (HIDDEN,), gen)
    out_features = {"attn_q": HIDDEN, "attn_k": KV_HEADS * HEAD_DIM, "attn_v": KV_HEADS * HEAD_DIM,
                    "attn_output": HIDDEN, "ffn_gate": FFN, "ffn_up": FFN, "ffn_down": HIDDEN}
    for i in range(LAYERS):
        for part, fmt in LAYER_FORMATS.items():
            _add(w, f"blk.{i}.{part}.weight", fmt, (out_features[part], FFN if part == "ffn_down" else HIDDEN), gen)
        for norm in ("attn_norm", "ffn_norm"):
            _add(w, f"blk.{i}.{norm}.weight", "f32", (HIDDEN,), gen)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_head(out: Path, seed: int = 1) -> Path:
    """A random EAGLE-3 head for write_model_gguf's target (modelopt's layout): draft id i -> target id 2i."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) * 0.05  # noqa: E731
    h, q, kv, p = HIDDEN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, "layers.0."
    w = {"fc.weight": r(h, len(AUX) * h), "norm.weight": 1 + r(h), "lm_head.weight": r(DRAFT_VOCAB, h),
         "d2t": torch.arange(DRAFT_VOCAB), p + "hidden_norm.weight": 1 + r(h), p + "input_layernorm.weight": 1 + r(h),
         p + "self_attn.q_proj.weight": r(q, 2 * h), p + "self_attn.k_proj.weight": r(kv, 2 * h),
         p + "self_attn.v_proj.weight": r(kv, 2 * h), p + "self_attn.o_proj.weight": r(h, q),
         p + "post_attention_layernorm.weight": 1 + r(h), p + "mlp.gate_proj.weight": r(FFN, h),
         p + "mlp.up_proj.weight": r(FFN, h), p + "mlp.down_proj.weight": r(h, FFN)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(out / "model.safetensors"))
    cfg = dict(architectures=["LlamaForCausalLMEagle3"], hidden_size=h, num_attention_heads=HEADS,
               num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate_size=FFN, rms_norm_eps=1e-6,
               rope_theta=10000.0, max_position_embeddings=128, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB,
               eagle_aux_hidden_state_layer_ids=AUX, num_hidden_layers=1,
               eagle_config=dict(eagle_aux_hidden_state_layer_ids=AUX, use_input_layernorm_in_first_layer=True))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in a GGUF's bytes: its header fields and its data."""

    name: str
    ggml_type: int
    type_at: int      # byte position of its uint32 ggml type in the header
    offset_at: int    # byte position of its uint64 data offset in the header
    offset: int       # that offset (relative to the data section)
    data_at: int      # absolute position of its first data byte
    nbytes: int


def tensor_layout(data: bytes, path: Path | None = None) -> dict[str, Entry]:
    """Every tensor of a valid GGUF's bytes with the positions of its header fields (found after its name)."""
    if path is None:
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
            f.write(data)
            f.flush()
            return tensor_layout(data, Path(f.name))
    infos = GGUFFile.open(path).tensors
    out = {}
    for name, info in infos.items():
        key = struct.pack("<Q", len(name)) + name.encode()
        at = data.index(key) + len(key)
        n_dims = struct.unpack_from("<I", data, at)[0]
        type_at = at + 4 + 8 * n_dims
        offset = struct.unpack_from("<Q", data, type_at + 4)[0]
        out[name] = Entry(name, info.ggml_type, type_at, type_at + 4, offset, info.offset, info.nbytes)
    return out


def set_metadata_int(data: bytes, key: str, value: int) -> bytes:
    """`data` with the integer metadata value of `key` replaced (same width: the layout does not move)."""
    raw = bytearray(data)
    at = raw.index(struct.pack("<Q", len(key)) + key.encode()) + 8 + len(key)
    fmt = {4: "<I", 5: "<i", 10: "<Q", 11: "<q"}[struct.unpack_from("<I", raw, at)[0]]
    struct.pack_into(fmt, raw, at + 4, value)
    return bytes(raw)
