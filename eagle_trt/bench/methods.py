"""The decoding methods the bench compares, each behind one `run(prompt_ids, max_new_tokens)` call.

    hf             Hugging Face transformers `generate`, greedy, fp32, from the engine's target dir
    hf-assisted    HF's assisted generation with what the engine drafts with: its draft model as
                   `assistant_model` (a draft-model engine; HF's own assistant settings), else prompt lookup
                   (`prompt_lookup_num_tokens`)
    ar             our plain autoregressive loop (the reference every speculative output must equal at T=0)

An EAGLE-3 engine (the head drafts):

    chain          one draft path of `draft_length` tokens
    tree           dynamic tree with the engine's defaults (`eagle-trt tune` results if stored),
                   prompt lookup off: the head's drafts alone
    tree-lookup    the same tree plus prompt-lookup branches copied from the context (the engine's
                   lookup_tokens and lookup_branches; DEFAULT_LOOKUP where it turns lookup off)
    tree-untuned   dynamic tree with the build config's settings, ignoring tuned.json, lookup off

A draft-model engine (a small LM drafts), the same four: draft-model-chain, draft-model (the dynamic tree),
draft-model-lookup, draft-model-untuned.

llama.cpp on the GGUF the engine came from (the optional llama-cpp-python package; bench/llamacpp.py):

    llama.cpp          its plain greedy decoding
    llama.cpp-lookup   its speculative mode: llama-cpp-python's prompt-lookup drafter
    llama.cpp-draft    its speculative hook with a draft GGUF (a second llama.cpp model drafts a greedy chain)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eagle_trt import timing
from eagle_trt.errors import InputError

# Our speculative methods: name -> (the drafter they need, their role: chain / tree / tree-lookup / tree-untuned).
SPECULATIVE = {"chain": ("eagle3", "chain"), "tree": ("eagle3", "tree"), "tree-lookup": ("eagle3", "tree-lookup"),
               "tree-untuned": ("eagle3", "tree-untuned"), "draft-model-chain": ("model", "chain"),
               "draft-model": ("model", "tree"), "draft-model-lookup": ("model", "tree-lookup"),
               "draft-model-untuned": ("model", "tree-untuned")}
LLAMA_CPP_METHODS = ("llama.cpp", "llama.cpp-lookup", "llama.cpp-draft")
ALL_METHODS = ("hf", "hf-assisted", "ar", *SPECULATIVE, *LLAMA_CPP_METHODS)
DRAFT_SHARE_METHODS = ("tree", "tree-lookup", "chain", "draft-model", "draft-model-lookup", "draft-model-chain")
DEFAULT_METHODS = ("hf", "hf-assisted", "ar", "chain", "tree", "tree-lookup")
DEFAULT_MODEL_METHODS = ("hf", "hf-assisted", "ar", "draft-model-chain", "draft-model", "draft-model-lookup")
BASELINES = ("hf", "hf-assisted", "ar", *LLAMA_CPP_METHODS)
# Which method's output each one must reproduce token for token at T=0, and whether a difference fails
# the bench (our speculative decoding is lossless by construction) or is only reported (HF's and llama.cpp's
# numerics are their own).
REFERENCE = {**{name: ("ar", True) for name in SPECULATIVE}, "hf-assisted": ("hf", False), "hf": ("ar", False),
             **{name: ("ar", False) for name in LLAMA_CPP_METHODS}}
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
            "total_tokens": opts.total_tokens, "confidence_threshold": opts.confidence_threshold,
            "fallback_after": opts.fallback_after,
            "lookup_tokens": opts.lookup_tokens, "lookup_branches": opts.lookup_branches,
            "datastore_branches": opts.datastore_branches
            if opts.lookup_tokens > 0 and getattr(runner, "datastore", None) is not None else 0,
            "max_verify_rows": opts.max_verify_rows if opts.lookup_tokens > 0 else 0}

    def run(self, prompt_ids, max_new_tokens):
        self.opts = self.opts.model_copy(update={"max_new_tokens": max_new_tokens})
        t = timing.now()
        result = self.runner.generate(prompt_ids, self.opts)
        secs = timing.now() - t
        m = result.metrics
        steps = [(s.accepted, s.tree_depth) for s in m.steps] if self.speculative else []
        return MethodOutput(result.token_ids, secs, m.to_dict(), steps, m.draft_s, m.verify_s)


class HFMethod(Method):
    def __init__(self, name: str, model, eos_token_ids: list[int], prompt_lookup: int | None = None,
                 assistant=None):
        """prompt_lookup: HF's prompt-lookup decoding with that many tokens; assistant: a draft model for HF's
        assisted generation (`assistant_model`, with HF's default assistant settings)."""
        self.name, self.model, self.eos = name, model, list(eos_token_ids)
        self.prompt_lookup, self.assistant = prompt_lookup, assistant
        self.speculative = prompt_lookup is not None or assistant is not None
        self.settings = {"dtype": "float32", "greedy": True}
        if prompt_lookup:
            self.settings["prompt_lookup_num_tokens"] = prompt_lookup
        if assistant is not None:
            self.settings["assistant_model"] = "the engine's draft model"

    def run(self, prompt_ids, max_new_tokens):
        ids = torch.tensor([prompt_ids])
        kw = dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, temperature=None, top_p=None,
                  top_k=None, attention_mask=torch.ones_like(ids), eos_token_id=self.eos or None,
                  pad_token_id=self.eos[0] if self.eos else None)
        if self.prompt_lookup:
            kw["prompt_lookup_num_tokens"] = self.prompt_lookup
        if self.assistant is not None:
            kw["assistant_model"] = self.assistant
        t = timing.now()
        with torch.inference_mode():
            out = self.model.generate(ids, **kw)
        secs = timing.now() - t
        return MethodOutput(out[0, len(prompt_ids):].tolist(), secs)


def default_methods(session) -> list[str]:
    """The methods `bench` runs when none are named: the engine's drafter's, plus the untuned tree if tuned; the HF
    ones only where transformers can read what they load (`hf_unreadable`)."""
    model = session.draft_kind == "model"
    names = list(DEFAULT_MODEL_METHODS if model else DEFAULT_METHODS)
    names = [n for n in names if n not in hf_unreadable(session)]
    return names + ([("draft-model" if model else "tree") + "-untuned"] if session.tuned else [])


def hf_unreadable(session) -> dict[str, str]:
    """HF method -> why transformers cannot load what it needs from this engine: a target (or, for a draft model's
    assisted generation, a draft) stored in GGUF blocks, which only eagle-trt's kernels read."""
    out = {}
    if session.weights != "float":
        why = f"the engine's target is stored in GGUF blocks (weights: {session.weights})"
        out = {"hf": why, "hf-assisted": why}
    elif session.draft_kind == "model" and session.draft_weights != "float":
        out["hf-assisted"] = f"the engine's draft model is stored in GGUF blocks (draft_weights: {session.draft_weights})"
    return out


def check_hf(names: list[str], session) -> None:
    """HF methods named for an engine transformers cannot read: one input error naming them and the way out."""
    bad = {n: why for n, why in hf_unreadable(session).items() if n in names}
    if bad:
        raise InputError(f"--methods: {', '.join(bad)}: {next(iter(bad.values()))}, which transformers cannot "
                         "read; leave them out, or build the engine with weights: float (and draft_weights: float) "
                         "for an HF side by side")


def check_drafter(names: list[str], draft_kind: str) -> None:
    """Speculative methods need the engine's kind of drafter: an input error naming the ones that do not."""
    wrong = [n for n in names if n in SPECULATIVE and SPECULATIVE[n][0] != draft_kind]
    if wrong:
        what = "a draft model" if draft_kind == "model" else "an EAGLE-3 head"
        use = [n for n, (kind, _) in SPECULATIVE.items() if kind == draft_kind]
        raise InputError(f"--methods: {', '.join(wrong)} need{'s' if len(wrong) == 1 else ''} another drafter; this "
                         f"engine drafts with {what}: use {', '.join(use)}")


def parse_methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in ALL_METHODS]
    if bad or not names:
        raise InputError(f"--methods: unknown method(s) {', '.join(bad) or '(none)'}; choose from "
                         f"{', '.join(ALL_METHODS)}")
    # References run too, so every speculative output has something to be checked against (and llama.cpp's greedy
    # tokens are compared with ours).
    for m in list(names):
        ref = REFERENCE.get(m, (None, False))
        if (ref[1] or m in LLAMA_CPP_METHODS) and ref[0] not in names:
            names.insert(0, ref[0])
    return list(dict.fromkeys(names))


def load_hf_model(target_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()


def build_methods(session, names: list[str]) -> list[Method]:
    """Instantiate the named methods on an open Session (each HF model is loaded once, if needed)."""
    check_drafter(names, session.draft_kind)
    check_hf(names, session)
    runner = session.runner
    eos = runner.eos_token_ids  # the runtime's stop tokens: HF stops where our methods do
    hf = load_hf_model(session.engine.target_dir) if any(n.startswith("hf") for n in names) else None
    out: list[Method] = []
    for n in names:
        if n == "hf":
            out.append(HFMethod(n, hf, eos))
        elif n == "hf-assisted" and session.draft_kind == "model":
            out.append(HFMethod(n, hf, eos, assistant=load_hf_model(session.engine.draft_dir)))
        elif n == "hf-assisted":
            out.append(HFMethod(n, hf, eos, prompt_lookup=PROMPT_LOOKUP_TOKENS))
        elif n == "ar":
            out.append(OursMethod(n, runner, session.decode_config(mode="ar")))
        else:
            out.append(OursMethod(n, runner, _speculative_options(session, SPECULATIVE[n][1])))
    return out


def _speculative_options(session, role: str):
    if role == "chain":
        return session.decode_config(mode="eagle", tree="chain", lookup_tokens=0)
    if role == "tree":
        return session.decode_config(mode="eagle", tree="dynamic", lookup_tokens=0)
    if role == "tree-untuned":
        return session.decode_config(mode="eagle", tree="dynamic", tuned=False, lookup_tokens=0)
    own = session.decode_config()  # tree-lookup
    lookup = ((own.lookup_tokens, own.lookup_branches, own.datastore_branches) if own.lookup_tokens
              else (*DEFAULT_LOOKUP, session.config.datastore_branches))
    return session.decode_config(mode="eagle", tree="dynamic", lookup_tokens=lookup[0], lookup_branches=lookup[1],
                                  datastore_branches=lookup[2], max_verify_rows=own.max_verify_rows)
