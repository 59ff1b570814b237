"""The feature cache computed by a built engine's kernels: `convert --features-from ENGINE`.

The head is trained on the target's layer outputs. transformers computes them in fp32 (or under bf16 autocast); a
built engine of the same target computes them with the kernels that will serve the head (AMX/AVX-512 tiles, its
dtype), several times faster on a CPU, and they are then the very features the head reads at run time. Each batch is
one forward of the engine's decoder stack over several sequences, each against its own KV cache (rows never see
another sequence's); the greedy token of every row (for the draft vocabulary's counts) comes from the engine's LM
head.

    source = EngineSource.open(engine_dir, model, aux_layer_ids)   # refuses an engine of another model
    cache = build_feature_cache(model, sequences, aux_layer_ids, cache_dir, key, source=source)

`open` checks the engine against the HF target convert loaded: the same shapes, and on a probe sequence the engine's
greedy choice equals the target's at nearly every position (teacher forced, `regen_probe.MIN_AGREEMENT`: the same
weights in another dtype flip near-ties only; another model misses far more).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from eagle_trt.errors import InputError

from .regen_probe import MIN_AGREEMENT

PROBE_TOKENS = 96


class EngineSource:
    name = "engine"

    def __init__(self, target, aux_layer_ids: list[int], digest: str):
        self.target, self.aux_layer_ids, self.digest = target, sorted(aux_layer_ids), digest

    @classmethod
    def open(cls, engine_dir: str | Path, model, aux_layer_ids: list[int], probe: list[int] | None = None
             ) -> "EngineSource":
        from eagle_trt.runtime.session import Session

        engine_dir = Path(engine_dir).expanduser()
        if not (engine_dir / "manifest.json").is_file():
            raise InputError(f"--features-from {engine_dir}: not an engine dir (no manifest.json); give a dir "
                             "`eagle-trt build` wrote for this model")
        target = Session.open(engine_dir, verify=True).runner.target
        spec, cfg = target.spec, model.config
        theirs = (spec.hidden_size, spec.num_layers, spec.vocab_size)
        ours = (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size)
        if theirs != ours:
            raise InputError(f"--features-from {engine_dir}: its target has hidden size, layers and vocabulary "
                             f"{theirs}, the model being converted {ours}: build the engine from this model")
        digest = hashlib.sha256((engine_dir / "manifest.json").read_bytes()).hexdigest()[:16]
        source = cls(target, aux_layer_ids, digest)
        source.check_against(model, probe or list(range(1, PROBE_TOKENS + 1)), str(engine_dir))
        return source

    def check_against(self, model, tokens: list[int], where: str) -> None:
        """The engine's greedy choices on `tokens` (teacher forced) against the HF target's: at least
        MIN_AGREEMENT of the positions, or an InputError naming the share."""
        ids = torch.tensor([tokens])
        with torch.inference_mode():
            hf = model(input_ids=ids.to(next(model.parameters()).device)).logits[0].argmax(-1).cpu()
        ours = self.features([tokens])[0][2]
        agree = float((hf == ours).float().mean())
        if agree < MIN_AGREEMENT:
            raise InputError(f"--features-from {where}: its greedy choices agree with the model being converted on "
                             f"{agree:.0%} of {len(tokens)} probe positions (at least {MIN_AGREEMENT:.0%} for the "
                             "same weights): it is an engine of another model")

    def features(self, seqs: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        from eagle_trt.models.llama import Rows

        t = self.target
        rows = []
        for q in seqs:
            tokens = torch.tensor(q, dtype=torch.long)
            rows.append(Rows(tokens, torch.arange(len(q)), t.new_cache(len(q) + 1)))
        hidden, aux = t.batched_hidden_states(rows, need_aux=True, aux_layers=self.aux_layer_ids)
        # A few hundred rows of logits at a time: a whole batch's would be rows x vocabulary at once.
        greedy = torch.cat([t.greedy(hidden[i:i + 256]) for i in range(0, hidden.shape[0], 256)])
        out, at = [], 0
        for q in seqs:
            n = len(q)
            out.append((aux[at:at + n], hidden[at:at + n], greedy[at:at + n]))
            at += n
        return out


__all__ = ["EngineSource", "PROBE_TOKENS"]
