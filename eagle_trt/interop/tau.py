"""τ of an engine's head under another engine's computation, measured by eagle-trt's runtime.

    taus = measure_computations(Path("engines/smol"), {"eagle-trt": (True, None), "vLLM": (False, None)})
    taus["vLLM"]["chain"], taus["vLLM"]["dynamic"]

A computation is (hidden_prenorm, the target layers fed to the head or None for its own): True is modelopt's double
norm, False hidden_norm only (`formats.py`). Greedy, prompt lookup off (the head alone), chain and dynamic tree, on
the first prompts of the shipped chat set. The output must stay token-identical to plain greedy under every
computation (checked: only τ may move), so a failed check is an error, not a number.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from eagle_trt.errors import EagleError, InputError


def chat_prompts(n: int) -> list[list[dict]]:
    text = (resources.files("eagle_trt") / "data" / "chat_prompts.jsonl").read_text(encoding="utf-8")
    return [json.loads(line)["messages"] for line in text.splitlines() if line.strip()][:n]


def measure_computations(engine: Path, cases: dict[str, tuple[bool, list[int] | None]], prompts: int = 8,
                         max_new_tokens: int = 64) -> dict[str, dict]:
    """{case: {"aux_layers_fed", "chain", "dynamic"}} for an engine dir (torch backend)."""
    from eagle_trt.runtime.session import Session

    session = Session.open(engine)
    runner = session.runner
    head = getattr(runner.drafter, "head", None)
    if head is None:
        raise InputError(f"'{engine}' has no EAGLE-3 head on eagle-trt's runtime (a draft model or a TensorRT-LLM "
                         "bundle): measure tau on a torch engine")
    ids = [session.encode(m[0]["content"]) for m in chat_prompts(prompts)]
    own, own_prenorm = list(runner.aux_layers), head.hidden_prenorm
    plain = [runner.generate(p, session.decode_config(max_new_tokens=max_new_tokens, mode="ar")).token_ids
             for p in ids]
    out: dict[str, dict] = {}
    try:
        for name, (prenorm, layers) in cases.items():
            head.hidden_prenorm, runner.aux_layers = prenorm, list(layers or own)
            out[name] = {"aux_layers_fed": list(runner.aux_layers)}
            for tree in ("chain", "dynamic"):
                out[name][tree] = _tau(session, runner, ids, plain, tree, max_new_tokens, name)
    finally:
        head.hidden_prenorm, runner.aux_layers = own_prenorm, own
    return out


def _tau(session, runner, ids, plain, tree: str, max_new_tokens: int, name: str) -> float:
    committed = steps = 0.0
    for p, want in zip(ids, plain):
        cfg = session.decode_config(max_new_tokens=max_new_tokens, tree=tree, lookup_tokens=0)
        result = runner.generate(p, cfg)
        if result.token_ids != want:
            raise EagleError(f"{name}, {tree} tree: speculative output differs from plain greedy")
        committed += result.metrics.acceptance_length * result.metrics.verify_steps
        steps += result.metrics.verify_steps
    return round(committed / steps, 3) if steps else 1.0
