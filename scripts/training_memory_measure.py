"""Measure the training phase's per-rank GPU memory and set it beside `training_memory.py`'s arithmetic.

    python scripts/training_memory_measure.py --preset llama-3.1-8b --share 2 --seq-len 2048 --steps 3 --json

What runs is convert's own training step (`train.train_head`: modelopt's EAGLE-3 head attached by `attach_eagle3`,
the target's decoder layers released as `head_training._drop_target_layers` releases them, AdamW, 3 TTT steps) on
one process, over a synthetic feature cache of random features with the real shapes: the bytes a rank holds do not
depend on the values. The target is made from the preset's published config.json shapes with random embeddings
and LM head (no weights are read). On CUDA the peak is `torch.cuda.max_memory_allocated` over the steps; the static
part (weights) is what is allocated before the first step. One process has no DDP gradient buckets, so the
computed figure is given with and without them. On the CPU the steps run and no memory is reported (a check that
the script works, e.g. `--preset tiny`).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_memory import GiB, PRESETS, per_rank  # noqa: E402

from eagle_trt.convert.attach import attach_eagle3  # noqa: E402
from eagle_trt.convert.train import TrainConfig, train_head  # noqa: E402

TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, vocab_size=1024, tie_word_embeddings=False)


class SyntheticCache:
    """The read side of a feature cache (`FeatureCache.batch`'s shapes and dtypes), random features of one length."""

    def __init__(self, n: int, seq_len: int, hidden: int, n_aux: int, vocab: int, seed: int = 0):
        self.n, self.seq_len, self.hidden, self.n_aux, self.vocab = n, seq_len, hidden, n_aux, vocab
        self.g = torch.Generator().manual_seed(seed)

    key = "synthetic"

    def __len__(self) -> int:
        return self.n

    def length(self, i: int) -> int:
        return self.seq_len

    def batch(self, indices: list[int], pad_id: int = 0, device=None) -> dict[str, torch.Tensor]:
        b, L = len(indices), self.seq_len
        out = {"input_ids": torch.randint(0, self.vocab, (b, L), generator=self.g),
               "attention_mask": torch.ones((b, L), dtype=torch.long),
               "aux": torch.randn((b, L, self.n_aux * self.hidden), generator=self.g).to(torch.bfloat16),
               "hidden": torch.randn((b, L, self.hidden), generator=self.g).to(torch.bfloat16)}
        out = {k: v.to(device) for k, v in out.items()}
        out["aux"], out["hidden"] = out["aux"].float(), out["hidden"].float()
        return out


def make_model(shape: dict, draft_vocab: int, device: torch.device):
    """The target with 4 decoder layers (enough for 3 aux layers; they are released before training, so their number
    changes nothing the training phase holds) and random embeddings and LM head, the EAGLE-3 head attached on the
    CPU (as convert attaches it), the layers released, then moved to `device`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**shape, "num_hidden_layers": 4}, max_position_embeddings=8192, rms_norm_eps=1e-5,
                      rope_theta=500000.0)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model.to_empty(device="cpu")  # no initialisation pass: only the tensors training reads get values
    with torch.no_grad():
        for module in (model.model.embed_tokens, model.lm_head):
            module.weight.normal_(0, 0.02)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
    rope = model.model.rotary_emb  # inv_freq is a buffer computed from the config
    model.model.rotary_emb = type(rope)(config=cfg)
    model = attach_eagle3(model, draft_vocab)
    model.model.layers = torch.nn.ModuleList()  # as _drop_target_layers: the cache holds their outputs
    gc.collect()
    return model.to(device)


def measure(shape: dict, *, share: int, seq_len: int, draft_vocab: int, steps: int, device: torch.device) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = make_model(shape, draft_vocab, device)
    n_aux = len(model.eagle_config.eagle_aux_hidden_state_layer_ids)
    static = torch.cuda.memory_allocated(device) if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    cache = SyntheticCache(share * steps, seq_len, shape["hidden_size"], n_aux, shape["vocab_size"])
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = train_head(model, cache, TrainConfig(steps=steps, batch_size=share, lr=1e-4, checkpoint_every=10**9),
                            Path(tmp) / "checkpoint.safetensors", progress=False)
        seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    computed = per_rank(shape, world=1, batch_size=share, seq_len=seq_len, draft_vocab=draft_vocab, ttt_steps=3)
    train = computed["phases"]["training"]
    n_head = computed["head_params"]
    weights = train["target embeddings + LM head (fp32)"] + n_head * 4
    del model
    gc.collect()
    return {"share": share, "seq_len": seq_len, "draft_vocab": draft_vocab, "steps": steps,
            "s_per_step": round(seconds / steps, 3), "losses": [h["loss"] for h in result.history],
            "measured_static_gib": None if static is None else round(static / GiB, 2),
            "computed_weights_gib": round(weights / GiB, 2),
            "measured_peak_gib": None if peak is None else round(peak / GiB, 2),
            "computed_total_gib": round(train["total"] / GiB, 2),
            "computed_total_without_ddp_buckets_gib": round((train["total"] - n_head * 4) / GiB, 2),
            "device": torch.cuda.get_device_name(device) if cuda else "cpu"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="llama-3.1-8b", choices=[*PRESETS, "tiny"])
    p.add_argument("--share", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--draft-vocab-size", type=int, default=32000)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    shape = TINY if a.preset == "tiny" else PRESETS[a.preset]
    r = {"preset": a.preset, **measure(shape, share=a.share, seq_len=a.seq_len, draft_vocab=a.draft_vocab_size,
                                      steps=a.steps, device=torch.device(a.device))}
    print(json.dumps(r) if a.json else "\n".join(f"{k:<40} {v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
