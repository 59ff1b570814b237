"""FP8 KV-cache calibration: per-layer K and V scales from an amax pass over calibration prompts.

    from eagle_trt.convert.calibrate import calibrate_kv_scales
    report = calibrate_kv_scales("ckpt", prompts)   # writes ckpt/kv_scales.safetensors

A stored FP8 entry is value / scale with scale = amax / 448 (e4m3's largest finite value), so the
largest K (or V) seen in calibration maps to the top of the FP8 range. The pass runs eagle-trt's own
runtime (target prefill + plain decoding, and the head over the same features), recording the amax
of every K/V written: post-RoPE keys, exactly what the cache stores.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from eagle_trt.config.decode import DecodeConfig
from eagle_trt.models.draft_head import Eagle3DraftHead
from eagle_trt.models.kv_cache import FP8, FP8_MAX, KVCache
from eagle_trt.models.llama import LlamaTarget
from eagle_trt.models.weights import load_safetensors
from eagle_trt.runtime.drafter import Drafter
from eagle_trt.runtime.runner import Runner

KV_SCALES_FILE = "kv_scales.safetensors"
MARGIN = 1.0  # headroom factor on amax; 1.0 = clip exactly at the calibrated max


class _AmaxCache(KVCache):
    """A float32 KV cache that records, per layer, the largest |K| and |V| ever written."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        n = self.k.shape[0]
        self.k_amax = torch.zeros(n)
        self.v_amax = torch.zeros(n)

    def write(self, layer, start, k, v):
        self.k_amax[layer] = max(float(self.k_amax[layer]), float(k.abs().max()))
        self.v_amax[layer] = max(float(self.v_amax[layer]), float(v.abs().max()))
        super().write(layer, start, k, v)


def _scales(amax: torch.Tensor) -> torch.Tensor:
    return (amax.clamp_min(1e-6) * MARGIN / FP8_MAX).float()


@torch.inference_mode()
def load_models(checkpoint: str | Path):
    """(target, head) of a checkpoint in fp32, loaded once for calibration and the agreement check."""
    target = LlamaTarget.load(Path(checkpoint) / "target")
    head = Eagle3DraftHead.load(Path(checkpoint) / "draft", target)
    target.aux_layer_ids = list(head.spec.aux_layer_ids)
    return target, head


def calibrate_kv_scales(checkpoint: str | Path, prompts: list[list[int]], new_tokens: int = 32,
                        models=None) -> dict:
    """Run the calibration prompts through target and head; write CKPT/kv_scales.safetensors atomically."""
    ckpt = Path(checkpoint)
    target, head = models or load_models(ckpt)
    s, d = target.spec, head.spec
    longest = max(len(p) for p in prompts) + new_tokens + 1
    t_cache = _AmaxCache(s.num_layers, s.num_kv_heads, s.head_dim, longest, torch.float32, torch.float32)
    drafter = Drafter(head, longest)
    drafter.cache = _AmaxCache(1, d.num_kv_heads, d.head_dim, longest, torch.float32, torch.float32)
    tokens_seen = 0
    for ids in prompts:
        # Prompt, then a greedy continuation: decode-time K/V are part of what the cache will hold.
        t_cache.length, drafter.cache.length = 0, 0
        seq = list(ids)
        logits, aux = target.forward(torch.tensor(seq), torch.arange(len(seq)), t_cache, need_aux=True)
        t_cache.length = len(seq)
        feats = [aux]
        for _ in range(new_tokens):
            seq.append(int(logits[-1].argmax()))
            logits, aux = target.forward(torch.tensor(seq[-1:]), torch.tensor([len(seq) - 1]), t_cache, need_aux=True)
            t_cache.length = len(seq)
            feats.append(aux)
        drafter.extend(torch.cat(feats)[: len(seq) - 1], torch.tensor(seq[1:]))
        tokens_seen += len(seq)
    tensors = {
        "target.k_scales": _scales(t_cache.k_amax), "target.v_scales": _scales(t_cache.v_amax),
        "draft.k_scales": _scales(drafter.cache.k_amax), "draft.v_scales": _scales(drafter.cache.v_amax),
    }
    tmp = ckpt / f".{KV_SCALES_FILE}.tmp-{os.getpid()}"
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, ckpt / KV_SCALES_FILE)
    return {
        "file": KV_SCALES_FILE,
        "prompts": len(prompts),
        "tokens": tokens_seen,
        "target_k_amax_max": round(float(t_cache.k_amax.max()), 4),
        "target_v_amax_max": round(float(t_cache.v_amax.max()), 4),
        "draft_k_amax": round(float(drafter.cache.k_amax.max()), 4),
        "draft_v_amax": round(float(drafter.cache.v_amax.max()), 4),
    }


@torch.inference_mode()
def fp8_agreement(checkpoint: str | Path, prompts: list[list[int]], new_tokens: int = 64, models=None) -> dict:
    """Greedy decoding with an FP8 KV cache (calibrated scales) against fp32 KV: token agreement and bytes."""
    ckpt = Path(checkpoint)
    scales = load_safetensors(ckpt / KV_SCALES_FILE)
    target, head = models or load_models(ckpt)
    cap = max(len(p) for p in prompts) + new_tokens + 300
    # The configured trees on both (no step budget): the comparison is of the KV cache, not of timing decisions.
    exact = Runner(target, head, cap, budget=False)
    fp8 = Runner(target, head, cap, kv_dtype=FP8, k_scales=scales["target.k_scales"],
                 v_scales=scales["target.v_scales"], draft_k_scales=scales["draft.k_scales"],
                 draft_v_scales=scales["draft.v_scales"], budget=False)
    same = total = prefix = 0
    spec_equal = True
    for ids in prompts:
        opts = DecodeConfig(max_new_tokens=new_tokens, mode="ar", eos_token_ids=[])
        a = exact.generate(ids, opts).token_ids
        b = fp8.generate(ids, opts).token_ids
        same += sum(x == y for x, y in zip(a, b))
        total += len(a)
        prefix += next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        # Speculative decoding over the FP8 cache must still equal plain decoding over the same cache.
        spec_equal &= fp8.generate(ids, DecodeConfig(max_new_tokens=new_tokens, eos_token_ids=[])).token_ids == b
    s = target.spec
    per_token_fp32 = 2 * s.num_layers * s.num_kv_heads * s.head_dim * 4
    return {
        "greedy_token_agreement": round(same / max(total, 1), 4),
        "mean_identical_prefix": round(prefix / len(prompts), 2),
        "new_tokens_per_prompt": new_tokens,
        "eagle_equals_ar_on_fp8": spec_equal,
        "kv_bytes_per_token_fp32": per_token_fp32,
        "kv_bytes_per_token_fp8": per_token_fp32 // 4,
        "kv_bytes_saved": f"{1 - 1 / 4:.0%} vs fp32, {1 - 1 / 2:.0%} vs fp16/bf16",
    }
