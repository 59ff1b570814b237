"""Reference forwards of each serving engine's EAGLE-3 draft layer, written from that engine's source (cited per block;
our own code, nothing copied), run on the files `eagle-trt export` wrote.

    logits, ids = REFERENCES["vllm"](head_dir, stream, next_tokens, positions, embed)

stream: the target's residual stream, [L + 1] tensors [T, H]: stream[0] the token embeddings, stream[j] the output of
decoder layer j - 1 (the input of layer j). Each reference picks its features from it by its own engine's rule for
the ids in the config it reads, so a layer id written with the wrong meaning shows up as a wrong feature.
Returns the draft logits [T, draft_vocab] and the target id of each draft id.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def _rms(x, w, eps):
    x64 = x.double()
    return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rope(x, positions, theta):
    # HF Llama rotate_half convention, default rope: inv_freq = theta^(-2i/d), cos/sin = cat(freqs, freqs).
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = positions.double()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _layer(w, p, llama, x, residual, positions):
    """One Llama decoder layer over a 2H-wide attention input x and the given residual, causal attention over the
    rows (a prefill), then the MLP: the part every engine shares once its norms have made x and residual."""
    t, h = x.shape[0], llama["hidden_size"]
    nh, kv = llama["num_attention_heads"], llama["num_key_value_heads"]
    hd = llama.get("head_dim") or h // nh
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(t, nh, hd).transpose(0, 1)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(t, kv, hd).transpose(0, 1)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(t, kv, hd).transpose(0, 1)
    q, k = _rope(q, positions, llama["rope_theta"]), _rope(k, positions, llama["rope_theta"])
    k, v = k.repeat_interleave(nh // kv, 0), v.repeat_interleave(nh // kv, 0)
    scores = (q @ k.transpose(1, 2)) / hd ** 0.5
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(t, nh * hd)
    out = residual + attn @ w[p + "self_attn.o_proj.weight"].T
    eps = llama["rms_norm_eps"]
    m = _rms(out, w[p + "post_attention_layernorm.weight"], eps)
    g, u = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
    return out + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T


def _head(w, llama, feature, e, positions, p, double_norm: bool, norm_before_residual: bool):
    eps = llama["rms_norm_eps"]
    h_in = _rms(feature, w[p + "input_layernorm.weight"], eps) if double_norm else feature
    normed = _rms(h_in, w[p + "hidden_norm.weight"], eps)
    residual = normed if norm_before_residual else feature
    x = torch.cat([_rms(e, w[p + "input_layernorm.weight"], eps), normed], -1)
    out = _layer(w, p, llama, x, residual, positions)
    logits = _rms(out, w["norm.weight"], eps) @ w["lm_head.weight"].T
    d2t = w.get("d2t")
    ids = torch.arange(logits.shape[-1]) + (d2t.long() if d2t is not None else 0)
    return logits, ids


def _files(head_dir: Path):
    head_dir = Path(head_dir)
    return json.loads((head_dir / "config.json").read_text()), load_file(str(head_dir / "model.safetensors"))


def vllm(head_dir, stream, tokens, positions, embed):
    cfg, raw = _files(head_dir)
    # vllm-project/vllm vllm/model_executor/models/llama_eagle3.py @00bd149, LlamaModel.load_weights: "midlayer."
    # becomes "layers.0."; Eagle3LlamaForCausalLM.load_weights: names with t2d skipped, d2t kept.
    w = {k.replace("midlayer.", "layers.0."): t for k, t in raw.items() if "t2d" not in k}
    # vllm .../v1/worker/gpu/spec_decode/eagle/eagle3_utils.py: ids = hf_config.eagle_aux_hidden_state_layer_ids;
    # vllm .../models/llama.py: hidden_states + residual appended before layer idx runs -> stream[idx].
    feature = torch.cat([stream[j] for j in cfg["eagle_aux_hidden_state_layer_ids"]], -1) @ w["fc.weight"].T
    # llama_eagle3.py LlamaDecoderLayer.forward, layer 0: input_layernorm(embeds), then _norm_before_residual or
    # _norm_after_residual on the hidden states (hidden_norm only), per config norm_before_residual.
    return _head(w, cfg, feature, embed[tokens], positions, "layers.0.", False, bool(cfg.get("norm_before_residual")))


def sglang(head_dir, stream, tokens, positions, embed):
    cfg, raw = _files(head_dir)
    # sgl-project/sglang python/sglang/srt/models/llama_eagle3.py @03d5a77, load_weights: d2t -> hot_token_id, t2d
    # skipped, any other name kept only if it (or model.<name>) is a parameter; the layer is the module `midlayer`,
    # so layers.0.* tensors are silently dropped (the layer would keep its random init).
    if any(k.startswith("layers.") for k in raw):
        raise AssertionError("SGLang would drop the layers.* tensors and run its draft layer on random weights")
    w = {k.replace("midlayer.", "layers.0."): t for k, t in raw.items() if "t2d" not in k}
    ids = list(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    if ids[0] == 1:  # SGLang PR #25454: a first id of 1 is read as modelopt's "output of layer" ids
        ids = [i + 1 for i in ids]
    # python/sglang/srt/models/llama.py: hidden_states + residual captured before layer i -> stream[i].
    feature = torch.cat([stream[j] for j in ids], -1) @ w["fc.weight"].T
    # LlamaDecoderLayer.forward: residual = hidden_states; input_layernorm(embeds); hidden_norm(hidden_states).
    return _head(w, cfg, feature, embed[tokens], positions, "layers.0.", False, False)


def speculators(head_dir, stream, tokens, positions, embed):
    cfg, w = _files(head_dir)
    # vllm-project/speculators src/speculators/models/eagle3/config.py @11ecdd3: the layer's Llama config is
    # transformer_layer_config; norm_before_residual and eagle_aux_hidden_state_layer_ids at the top.
    llama = dict(cfg["transformer_layer_config"])
    # src/speculators/models/eagle3/core.py @033c87f: t2d is a bool mask over the verifier vocab holding exactly
    # draft_vocab_size entries (load_vocab_mappings checks both); d2t the offsets.
    if "t2d" in w:
        t2d = w["t2d"].bool()
        assert t2d.numel() == llama["vocab_size"] and int(t2d.sum()) == cfg["draft_vocab_size"]
        assert torch.equal(torch.nonzero(t2d).flatten(), torch.arange(cfg["draft_vocab_size"]) + w["d2t"].long())
    # The ids are served by vLLM (capture before layer j), speculators' default [2, L//2, L-3] the same convention.
    feature = torch.cat([stream[j] for j in cfg["eagle_aux_hidden_state_layer_ids"]], -1) @ w["fc.weight"].T
    # src/speculators/models/eagle3/model_definitions.py @08af5f4, Eagle3FirstLayerMixin.forward: residual = hidden;
    # input_layernorm(embeds), hidden_norm(hidden); residual = normed hidden when norm_before_residual.
    return _head(w, llama, feature, embed[tokens], positions, "layers.0.", False, bool(cfg["norm_before_residual"]))


def trtllm(head_dir, stream, tokens, positions, embed):
    cfg, raw = _files(head_dir)
    # eagle-trt's bundle (engine/trtllm_bundle.py) hands TensorRT-LLM the head under midlayer.* names and its ids as
    # eagle3_layers_to_capture, which TensorRT-LLM captures after layer i -> stream[i + 1].
    w = {k.replace("midlayer.", "layers.0."): t for k, t in raw.items()}
    feature = torch.cat([stream[i + 1] for i in cfg["eagle_aux_hidden_state_layer_ids"]], -1) @ w["fc.weight"].T
    # NVIDIA/TensorRT-LLM tensorrt_llm/_torch/models/modeling_speculative.py @b35ac1b, the Eagle3 decoder layer:
    # residual = hidden_states; hidden_norm(hidden_states); input_layernorm(embeds).
    return _head(w, cfg, feature, embed[tokens], positions, "layers.0.", False, False)


def modelopt(head_dir, stream, tokens, positions, embed):
    cfg, w = _files(head_dir)
    # NVIDIA modelopt 0.47.0 torch/speculative/plugins/hf_eagle.py: a forward hook on layer i collects its output
    # -> stream[i + 1]; modeling_eagle.py: the HF decoder layer's input_layernorm on the hidden input (residual =
    # the raw input), then the attention pre-hook's hidden_norm: the feature normed twice.
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    feature = torch.cat([stream[i + 1] for i in ids], -1) @ w["fc.weight"].T
    return _head(w, cfg, feature, embed[tokens], positions, "layers.0.", True, False)


REFERENCES = {"vllm": vllm, "sglang": sglang, "speculators": speculators, "trtllm": trtllm, "modelopt": modelopt}
