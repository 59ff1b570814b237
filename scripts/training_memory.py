"""Per-rank memory of convert's head training, computed from a target's shapes (docs/training.md prints its output).

    python scripts/training_memory.py                               # Llama 3.1 8B and 3.3 70B, the defaults below
    python scripts/training_memory.py --config /models/qwen3-8b/config.json --world 8 --batch-size 16

What is counted, per rank, in bytes (H hidden, I intermediate, V vocab, Dv draft vocab, L sequence length, b = the
rank's share of the global batch, T the TTT steps), in the two phases:
feature cache (the target's forward over the rank's share of the sequences, in batches of --batch-size):
  target      the whole target, as convert loads it (fp32: 4 B/param)
  activations the widest tensor of one decoder layer's forward (the MLP's gate and up, 2*I per token, fp32), the
              caught aux outputs (3H per token), one sequence's logits over V (the argmax counts)
training (the decoder layers released; the cache holds their outputs):
  target      its embeddings and LM head (V x H each unless tied), fp32
  head        the trainable EAGLE-3 head in fp32: fc (3H x H), one decoder layer over 2H inputs, its norms, the
              draft LM head (Dv x H); x4 B weights, x4 B gradients, x4 B DDP's gradient buckets
  optimizer   AdamW's exp_avg and exp_avg_sq, fp32: 8 B/param
  features    one step's batch from the cache: aux (3H) + final hidden (H) per token, widened to fp32: b*L*4H*4 B
  logits      the target's distribution over V (softmax, fp32) that the loss reads, b*L*V*4 B, and the head's logits
              over Dv kept for the backward of each TTT step, T*b*L*Dv*4 B (log-softmax and logits: x2)
  cache disk  the feature cache on disk, bf16: 4H*2 B per training token (all ranks share one copy)
Activations inside the one decoder layer (b*L*H-sized tensors, a few dozen per TTT step) are smaller than the logits
and left out.
"""

from __future__ import annotations

import argparse
import json

# Published config.json shapes (meta-llama/Llama-3.1-8B-Instruct, meta-llama/Llama-3.3-70B-Instruct).
PRESETS = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False),
    "llama-3.3-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                          num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False),
}
GiB = 1 << 30


def target_params(c: dict) -> int:
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return c["num_hidden_layers"] * layer + v * h * (1 if c.get("tie_word_embeddings") else 2) + h


def head_params(c: dict, draft_vocab: int) -> int:
    h, i = c["hidden_size"], c["intermediate_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = 2 * h * q + 2 * 2 * h * kv + q * h + 3 * h * i + 3 * h  # q/k/v over [embeds, hidden] (2H), three norms
    return 3 * h * h + layer + h + draft_vocab * h  # fc, the layer, the final norm, the draft LM head


def per_rank(c: dict, *, world: int, batch_size: int, seq_len: int, draft_vocab: int, ttt_steps: int) -> dict:
    h, v, i = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    b = -(-batch_size // world)  # the largest share
    n_head = head_params(c, draft_vocab)
    tokens = b * seq_len
    embed_and_lm_head = v * h * (1 if c.get("tie_word_embeddings") else 2) + h
    cache_tokens = batch_size * seq_len  # every rank runs its sequences in batches of --batch-size
    cache = {  # building the feature cache: the target's forward over this rank's sequences, batch by batch
        "target (fp32)": target_params(c) * 4,
        "forward activations (one layer's widest)": cache_tokens * max(i * 2, 4 * h) * 4,
        "aux outputs caught": cache_tokens * 3 * h * 4,
        "target logits of one sequence (argmax)": seq_len * v * 4,
    }
    train = {  # training the head on the cache (the decoder layers released)
        "target embeddings + LM head (fp32)": embed_and_lm_head * 4,
        "head weights + grads + DDP buckets": n_head * 12,
        "AdamW states": n_head * 8,
        "features (one step)": tokens * 4 * h * 4,
        "target softmax over V": tokens * v * 4,
        "head logits, all TTT steps": ttt_steps * tokens * draft_vocab * 4 * 2,
    }
    cache["total"], train["total"] = sum(cache.values()), sum(train.values())
    return {"head_params": n_head, "target_params": target_params(c), "share": b,
            "cache_bytes_per_token": 4 * h * 2, "phases": {"feature cache": cache, "training": train}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="a target's config.json (default: the two presets)")
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=16, help="global batch (sequences per optimizer step)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--draft-vocab-size", type=int, default=32000)
    p.add_argument("--ttt-steps", type=int, default=3)
    a = p.parse_args()
    targets = {a.config: json.load(open(a.config))} if a.config else PRESETS
    for name, c in targets.items():
        c = c.get("text_config", c)
        r = per_rank(c, world=a.world, batch_size=a.batch_size, seq_len=a.seq_len, draft_vocab=a.draft_vocab_size,
                     ttt_steps=a.ttt_steps)
        print(f"{name}: target {r['target_params'] / 1e9:.2f}B params, head {r['head_params'] / 1e6:.1f}M params; "
              f"world {a.world}, global batch {a.batch_size} ({r['share']} per rank) x {a.seq_len} tokens, "
              f"draft vocab {a.draft_vocab_size}, {a.ttt_steps} TTT steps")
        for phase, rows in r["phases"].items():
            print(f"  {phase}:")
            for k, v in rows.items():
                print(f"    {k:<42} {v / GiB:9.2f} GiB")
        print(f"  {'feature cache on disk, per token':<44} {r['cache_bytes_per_token'] / 1024:9.1f} KiB")


if __name__ == "__main__":
    main()
