"""The decoding methods the bench compares, each behind one `run(prompt_ids, max_new_tokens)` call.

    hf             Hugging Face transformers `generate`, greedy, fp32, from the engine's target dir
    hf-assisted    the same with prompt-lookup assisted generation (`prompt_lookup_num_tokens`)
    ar             our plain autoregressive loop (the reference every EAGLE output must equal at T=0)
    chain          EAGLE-3, one draft path of `draft_length` tokens
    tree           EAGLE-3 dynamic tree with the engine's defaults (`eagle-trt tune` results if stored),
                   prompt lookup off: the head's drafts alone
    tree-lookup    the same tree plus prompt-lookup branches copied from the context (the engine's
                   lookup_tokens and lookup_branches; DEFAULT_LOOKUP where it turns lookup off)
    tree-untuned   EAGLE-3 dynamic tree with the build config's settings, ignoring tuned.json, lookup off
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from eagle_trt.errors import InputError

ALL_METHODS = ("hf", "hf-assisted", "ar", "chain", "tree", "tree-lookup", "tree-untuned")
DEFAULT_METHODS = ("hf", "hf-assisted", "ar", "chain", "tree", "tree-lookup")
BASELINES = ("hf", "hf-assisted", "ar")
# Which method's output each one must reproduce token for token at T=0, and whether a difference fails
# the bench (our speculative decoding is lossless by construction) or is only reported (HF's numerics).
REFERENCE = {"chain": ("ar", True), "tree": ("ar", True), "tree-lookup": ("ar", True), "tree-untuned": ("ar", True),
             "hf-assisted": ("hf", False), "hf": ("ar", False)}
PROMPT_LOOKUP_TOKENS = 10
DEFAULT_LOOKUP = (8, 2)  # (lookup_tokens, lookup_branches) of tree-lookup where the engine's settings turn it off
# (with the build config's datastore_branches)


@dataclass
class MethodOutput:
    token_ids: list[int]
    seconds: float
    metrics: dict | None = None  # GenerationMetrics.to_dict() for our methods
    steps: list[tuple[int, int]] = field(default_factory=list)  # (accepted, tree depth) per verify step
    draft_s: float = 0.0
    verify_s: float = 0.0


class Method:
    name: str = ""
    speculative: bool = False
    settings: dict = {}

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> MethodOutput:  # pragma: no cover
        raise NotImplementedError


class OursMethod(Method):
    def __init__(self, name: str, runner, opts):
        self.name, self.runner, self.opts = name, runner, opts
        self.speculative = opts.mode == "eagle"
        self.settings = {"mode": opts.mode} if not self.speculative else {
            "tree": opts.tree, "draft_length": opts.draft_length, "beam_width": opts.beam_width,
            "total_tokens": opts.total_tokens, "fallback_after": opts.fallback_after,
            "lookup_tokens": opts.lookup_tokens, "lookup_branches": opts.lookup_branches,
            "datastore_branches": opts.datastore_branches
            if opts.lookup_tokens > 0 and getattr(runner, "datastore", None) is not None else 0,
            "max_verify_rows": opts.max_verify_rows if opts.lookup_tokens > 0 else 0}

    def run(self, prompt_ids, max_new_tokens):
        self.opts.max_new_tokens = max_new_tokens
        t = time.perf_counter()
        result = self.runner.generate(prompt_ids, self.opts)
        secs = time.perf_counter() - t
        m = result.metrics
        steps = [(s.accepted, s.tree_depth) for s in m.steps] if self.speculative else []
        return MethodOutput(result.token_ids, secs, m.to_dict(), steps, m.draft_s, m.verify_s)


class HFMethod(Method):
    def __init__(self, name: str, model, eos_token_ids: list[int], prompt_lookup: int | None = None):
        self.name, self.model, self.eos = name, model, list(eos_token_ids)
        self.prompt_lookup = prompt_lookup
        self.speculative = prompt_lookup is not None
        self.settings = {"dtype": "float32", "greedy": True}
        if prompt_lookup:
            self.settings["prompt_lookup_num_tokens"] = prompt_lookup

    def run(self, prompt_ids, max_new_tokens):
        ids = torch.tensor([prompt_ids])
        kw = dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, temperature=None, top_p=None,
                  top_k=None, attention_mask=torch.ones_like(ids), eos_token_id=self.eos or None,
                  pad_token_id=self.eos[0] if self.eos else None)
        if self.prompt_lookup:
            kw["prompt_lookup_num_tokens"] = self.prompt_lookup
        t = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, **kw)
        secs = time.perf_counter() - t
        return MethodOutput(out[0, len(prompt_ids):].tolist(), secs)


def parse_methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in ALL_METHODS]
    if bad or not names:
        raise InputError(f"--methods: unknown method(s) {', '.join(bad) or '(none)'}; choose from "
                         f"{', '.join(ALL_METHODS)}")
    # References run too, so every speculative output has something to be checked against.
    for m in list(names):
        ref = REFERENCE.get(m, (None, False))
        if ref[1] and ref[0] not in names:
            names.insert(0, ref[0])
    return list(dict.fromkeys(names))


def load_hf_model(target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()


def build_methods(session, names: list[str]) -> list[Method]:
    """Instantiate the named methods on an open Session (the HF model is loaded once, if needed)."""
    runner = session.runner
    eos = runner.eos_token_ids  # the runtime's stop tokens: HF stops where our methods do
    hf = load_hf_model(session.engine.target_dir) if any(n.startswith("hf") for n in names) else None
    out: list[Method] = []
    for n in names:
        if n == "hf":
            out.append(HFMethod(n, hf, eos))
        elif n == "hf-assisted":
            out.append(HFMethod(n, hf, eos, prompt_lookup=PROMPT_LOOKUP_TOKENS))
        elif n == "ar":
            out.append(OursMethod(n, runner, session.decode_options(mode="ar")))
        elif n == "chain":
            out.append(OursMethod(n, runner, session.decode_options(mode="eagle", tree="chain", lookup_tokens=0)))
        elif n == "tree":
            out.append(OursMethod(n, runner, session.decode_options(mode="eagle", tree="dynamic", lookup_tokens=0)))
        elif n == "tree-lookup":
            own = session.decode_options()
            lookup = ((own.lookup_tokens, own.lookup_branches, own.datastore_branches) if own.lookup_tokens
                      else (*DEFAULT_LOOKUP, session.config.datastore_branches))
            out.append(OursMethod(n, runner, session.decode_options(
                mode="eagle", tree="dynamic", lookup_tokens=lookup[0], lookup_branches=lookup[1],
                datastore_branches=lookup[2], max_verify_rows=own.max_verify_rows)))
        elif n == "tree-untuned":
            out.append(OursMethod(n, runner, session.decode_options(mode="eagle", tree="dynamic", tuned=False,
                                                                    lookup_tokens=0)))
    return out
