"""llama.cpp as bench methods, through the optional llama-cpp-python package (`pip install 'eagle-trt[llama-cpp]'`,
or `make llama-cpp`): the GGUF the engine was converted from, decoded by the tool its users already have.

    llama.cpp          llama.cpp's plain greedy decoding (`Llama.generate`, temp 0)
    llama.cpp-lookup   the same with llama-cpp-python's speculative drafter, `LlamaPromptLookupDecoding`
    llama.cpp-draft    the same with a draft GGUF (`--draft-gguf`): the package ships no drafter for one, so
                       `GGUFDrafter` below fills its `draft_model` hook with a second `Llama` drafting a greedy chain

Both are fed the token ids our methods get (never text), run on the bench's thread count, and stop where ours do
(an EOS token of the engine's, included, or max_new_tokens). Their greedy output is compared with our `ar`
(reported, never fatal: llama.cpp's numerics are its own), and llama.cpp's tokenizer is checked against ours on
every prompt's text.

Only the package's public API is used: `llama_cpp.Llama` (model_path, n_ctx, n_threads, n_threads_batch,
draft_model, seed, verbose; `tokenize`, `generate`, `reset`, `n_vocab`) and
`llama_cpp.llama_speculative.LlamaPromptLookupDecoding`; the vendored llama.cpp commit comes from ggml's own
`ggml_commit()` where the shared library exports it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from eagle_trt import timing
from eagle_trt.bench.methods import LLAMA_CPP_METHODS, Method, MethodOutput
from eagle_trt.bench.stats import first_difference
from eagle_trt.errors import InputError, MissingDependencyError
from eagle_trt.prompt_sources import as_ids

PACKAGE = "llama-cpp-python"
# llama-cpp-python's README advises 2 predicted tokens on CPU-only machines (10, the class default, for GPUs);
# max_ngram_size 2 is the class default.
LOOKUP_SETTINGS = {"max_ngram_size": 2, "num_pred_tokens": 2}
# The chain a draft GGUF drafts per verify step (llama.cpp's own `llama-speculative` takes --draft-max).
DRAFT_TOKENS = 4
INSTALL_HINT = ("install the extra (it compiles llama.cpp): make llama-cpp, or "
                "CMAKE_ARGS='-DGGML_NATIVE=ON' pip install 'eagle-trt[llama-cpp]'")


def import_llama_cpp():
    """The llama_cpp module, or a missing-dependency error that says how to install it."""
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as e:
        raise MissingDependencyError(f"--methods llama.cpp needs the optional {PACKAGE} package ({e})",
                                     hint=INSTALL_HINT) from None


def check_gguf(gguf, option: str = "--gguf") -> Path:
    if gguf is None and option == "--gguf":
        raise InputError("--methods llama.cpp needs --gguf FILE: the GGUF llama.cpp decodes (the one the engine was "
                         "converted from, so both run the same model)")
    if gguf is None:
        raise InputError("--methods llama.cpp-draft needs --draft-gguf FILE: the draft model's GGUF (the target's "
                         "vocabulary), e.g. the one the engine's draft model was converted from")
    path = Path(gguf)
    if not path.is_file() or path.suffix.lower() != ".gguf":
        raise InputError(f"{option} {path}: not a .gguf file; pass the GGUF the engine was converted from")
    return path


def versions(module) -> dict:
    """llama-cpp-python's version, the vendored llama.cpp (ggml) commit and version where exported, its CPU
    features as llama.cpp reports them."""
    out = {"llama_cpp_python": getattr(module, "__version__", None), "llama_cpp_commit": None, "ggml_version": None,
           "system_info": None}
    info = getattr(module, "llama_print_system_info", None)
    if info is not None:
        out["system_info"] = _text(info())
    try:
        lib = importlib.import_module("llama_cpp._ggml").libggml
    except (ImportError, AttributeError, OSError):
        return out
    for key, symbol in (("llama_cpp_commit", "ggml_commit"), ("ggml_version", "ggml_version")):
        out[key] = _c_string(lib, symbol)
    return out


def _c_string(lib, symbol: str) -> str | None:
    import ctypes

    fn = getattr(lib, symbol, None)  # absent from older builds
    if fn is None:
        return None
    fn.argtypes, fn.restype = [], ctypes.c_char_p
    return _text(fn())


def _text(value) -> str | None:
    if value is None:
        return None
    return (value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)).strip() or None


class LlamaCppMethod(Method):
    """One llama.cpp decoding method on its own `Llama` (a drafter is fixed when the context is made)."""

    def __init__(self, name: str, llama, eos_token_ids: list[int], settings: dict):
        self.name, self.llama, self.eos = name, llama, frozenset(eos_token_ids)
        self.speculative = "draft_model" in settings
        self.settings = settings

    def run(self, prompt_ids, max_new_tokens):
        out: list[int] = []
        t = timing.now()
        # reset() first: generate() would otherwise keep the previous run's KV cache for a shared prefix, which
        # our methods recompute (each run starts from an empty cache, prompt processing timed).
        self.llama.reset()
        gen = self.llama.generate(list(prompt_ids), temp=0.0, repeat_penalty=1.0, reset=True)
        try:
            for tok in gen:
                out.append(int(tok))
                if out[-1] in self.eos or len(out) >= max_new_tokens:
                    break
        finally:
            gen.close()
        return MethodOutput(out, timing.now() - t)

    def close(self) -> None:
        """Free llama.cpp's model and context (its drafter's too): a loaded llama.cpp slows the torch forwards timed
        after it in this process (bench's verify-cost curve)."""
        draft = getattr(self.llama, "draft_model", None)
        for owner in (self.llama, getattr(draft, "llama", None)):
            if owner is not None and hasattr(owner, "close"):
                owner.close()


class GGUFDrafter:
    """llama-cpp-python's `draft_model` hook (called with the context's token ids, returns the draft's token ids)
    on a second `Llama`: a greedy chain of `tokens` tokens, the draft's KV cache kept for the prefix this call shares
    with the tokens it evaluated last time (the part of the context the target accepted)."""

    def __init__(self, llama, tokens: int):
        self.llama, self.tokens = llama, tokens

    def __call__(self, input_ids, /, **kwargs):
        import numpy as np

        ids = [int(t) for t in input_ids]
        d = self.llama
        keep = 0
        for seen, now in zip(d.input_ids[: d.n_tokens], ids):
            if int(seen) != now:
                break
            keep += 1
        keep = min(keep, len(ids) - 1)  # one token at least is evaluated: its logits give the first draft
        d.n_tokens = keep  # eval() drops the draft's cache past n_tokens before it decodes
        d.eval(ids[keep:])
        out = [int(d.sample(temp=0.0, repeat_penalty=1.0))]
        while len(out) < self.tokens:
            d.eval([out[-1]])
            out.append(int(d.sample(temp=0.0, repeat_penalty=1.0)))
        return np.array(out, dtype=np.intc)


def build_llama_methods(names: list[str], gguf, threads: int, n_ctx: int, eos_token_ids: list[int],
                        draft_gguf=None) -> list[Method]:
    """The named llama.cpp methods on `gguf` (llama.cpp-draft drafting with `draft_gguf`), each with `threads`
    threads for decoding and prompt processing."""
    module = import_llama_cpp()
    path = check_gguf(gguf)
    draft_path = check_gguf(draft_gguf, "--draft-gguf") if "llama.cpp-draft" in names else None
    out: list[Method] = []
    for name in names:
        assert name in LLAMA_CPP_METHODS, name
        settings = {"gguf": str(path), "threads": threads, "greedy": True, "n_ctx": n_ctx}
        draft = None
        if name == "llama.cpp-lookup":
            spec = importlib.import_module("llama_cpp.llama_speculative")
            draft = spec.LlamaPromptLookupDecoding(**LOOKUP_SETTINGS)
            settings["draft_model"] = {"LlamaPromptLookupDecoding": dict(LOOKUP_SETTINGS)}
        elif name == "llama.cpp-draft":
            # Room for the chain past the target's context: the drafter evaluates up to DRAFT_TOKENS - 1 more.
            draft = GGUFDrafter(_open(module, draft_path, threads, n_ctx + DRAFT_TOKENS, None), DRAFT_TOKENS)
            settings["draft_model"] = {"GGUFDrafter": {"gguf": str(draft_path), "num_pred_tokens": DRAFT_TOKENS}}
        llama = _open(module, path, threads, n_ctx, draft)
        if isinstance(draft, GGUFDrafter) and draft.llama.n_vocab() != llama.n_vocab():
            raise InputError(f"--draft-gguf {draft_path}: its vocabulary ({draft.llama.n_vocab():,} tokens) is not "
                             f"the target's ({llama.n_vocab():,}); pass a draft model of the same family")
        out.append(LlamaCppMethod(name, llama, eos_token_ids, settings))
    return out


def _open(module, path: Path, threads: int, n_ctx: int, draft):
    try:
        return module.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                            n_gpu_layers=0, seed=0, draft_model=draft, verbose=False)
    except (ValueError, RuntimeError) as e:  # llama-cpp-python: "Failed to load model from file: ..."
        raise InputError(f"--gguf {path}: llama.cpp cannot load it ({e}); pass a GGUF llama.cpp {module.__version__} "
                         "reads") from None


def prompt_text(tokenizer, prompt) -> tuple[str, bool]:
    """The text our tokenizer encodes for a bench Prompt and whether special tokens are added, by the rule of
    `prompt_sources.prompt_ids`: the chat template's rendering (encoded without added specials), or the raw text."""
    messages = prompt.messages or [{"role": "user", "content": prompt.text}]
    if prompt.chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), False
    if prompt.chat:  # no template: a lone user turn as it is, a conversation as 'role: content' lines
        if len(messages) == 1 and messages[0]["role"] == "user":
            return messages[0]["content"], True
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ", True
    return prompt.text or "\n".join(m["content"] for m in prompt.messages), True


def tokenizer_agreement(llama, tokenizer, prompts) -> dict:
    """llama.cpp's tokenization of each prompt's text against ours: {"prompts", "agree", "mismatches": [...]}.

    prompts: (Prompt, the ids our bench encoded for it, before any cut to max_input_len). A mismatch names the
    first differing position; llama.cpp is fed our ids either way, so the bench's numbers stay comparable."""
    mismatches = []
    for p, ours in prompts:
        text, add_special = prompt_text(tokenizer, p)
        if as_ids(tokenizer(text, add_special_tokens=add_special)) != list(ours):
            mismatches.append({"prompt": p.id, "first_difference": None,
                               "message": f"prompt {p.id}: not compared (its text does not re-encode to the bench's "
                                          "ids with our tokenizer)"})
            continue
        theirs = [int(t) for t in llama.tokenize(text.encode("utf-8"), add_bos=add_special, special=True)]
        diff = first_difference(theirs, list(ours))
        if diff is not None:
            mismatches.append({
                "prompt": p.id, "first_difference": diff, "tokens": len(ours), "llama_cpp_tokens": len(theirs),
                "ours_at": ours[diff] if diff < len(ours) else None,
                "llama_cpp_at": theirs[diff] if diff < len(theirs) else None,
                "message": f"llama.cpp tokenizes prompt {p.id} differently from ours from token {diff} "
                           f"({len(theirs)} vs {len(ours)} tokens); it is fed our token ids"})
    return {"prompts": len(prompts), "agree": len(prompts) - len(mismatches), "mismatches": mismatches}


def greedy_agreement(checks: list[dict], names) -> dict:
    """Per llama.cpp method, from the first repeat's checks against `ar`: how many prompts give our greedy tokens
    exactly, and for the others the token index where the two part."""
    out = {}
    for name in names:
        rows = [c for c in checks if c["method"] == name and c["repeat"] == 0]
        out[name] = {"reference": rows[0]["reference"] if rows else None, "prompts": len(rows),
                     "equal": sum(c["match"] for c in rows),
                     "first_difference": {c["prompt"]: c["first_difference"] for c in rows if not c["match"]}}
    return out
