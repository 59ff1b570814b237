"""Write a tiny random Llama (HF format: safetensors + byte-level tokenizer) for tests and debugging.

    python scripts/make_tiny_model.py --output /tmp/tiny-llama
    eagle-trt convert /tmp/tiny-llama --output /tmp/tiny-ckpt --steps 0

Nothing is downloaded: the config is inline, the weights are random (seeded), and the tokenizer is
a 256-symbol byte-level BPE with no merges plus four special tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

TINY_CONFIG = dict(
    vocab_size=260,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=256,
    eos_token_id=257,
    pad_token_id=258,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    byte_vocab = {ch: i for i, ch in enumerate(sorted(byte_vocab))}
    tok = Tokenizer(models.BPE(vocab=byte_vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


# The families eagle-trt runs, as transformers builds them: Qwen2 always has q/k/v biases and here ties its
# embeddings (as Qwen2.5-0.5B/1.5B do); Mistral is Llama's layout with an optional sliding window (none here);
# llama3 is Llama 3.1's RoPE (rope_type llama3, its factors; an original context short enough that the tiny model's
# positions cross every band of the frequency blend); Qwen3 has q/k norms; Gemma 3 its own layer, with a window
# shorter than the tests' contexts, every third layer global, and a query scale that is not head_dim's.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64))),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True, rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=True, rope_theta=1000000.0)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        tie_word_embeddings=True, sliding_window=6, layer_types=[
            "full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(8)],
        query_pre_attn_scalar=24, rope_theta=1000000.0, rope_local_base_freq=10000.0)),
}
# Families whose norms transformers initialises to a constant: randomised here, so a test tells each norm (and its
# (1 + w) offset) from the others.
RANDOM_NORMS = ("llama3", "qwen3", "gemma3")


def make_tiny_model(output: str | Path, seed: int = 0, init_std: float = 0.08, with_tokenizer: bool = True,
                    family: str = "llama", **overrides) -> Path:
    """Create the model dir and return its path. `family`: llama, qwen2 or mistral; `overrides` change TINY_CONFIG
    fields."""
    import torch
    import transformers

    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    config_cls, model_cls, extra = FAMILIES[family]
    fields = {**TINY_CONFIG, **extra, **overrides}
    if family == "qwen2":
        fields.pop("head_dim", None)  # Qwen2 derives it (hidden / heads)
    if family == "gemma3" and "rope_scaling" in overrides:  # Gemma 3's scaling applies to its global layers
        fields["rope_parameters"] = {"full_attention": {"rope_theta": fields["rope_theta"], **fields.pop("rope_scaling")},
                                     "sliding_attention": {"rope_type": "default",
                                                           "rope_theta": fields["rope_local_base_freq"]}}
    cfg = getattr(transformers, config_cls)(**fields, initializer_range=init_std)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg).float().eval()
    if family in RANDOM_NORMS:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(output, safe_serialization=True)
    if with_tokenizer:  # the byte tokenizer needs vocab_size 260
        tok = make_tokenizer()
        assert len(tok) == cfg.vocab_size, (len(tok), cfg.vocab_size)
        tok.save_pretrained(output)
    return output


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", required=True, help="directory to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init-std", type=float, default=0.08, help="weight init std (larger = peakier logits)")
    ap.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    args = ap.parse_args()
    path = make_tiny_model(args.output, seed=args.seed, init_std=args.init_std, family=args.family)
    print(path)


if __name__ == "__main__":
    main()
