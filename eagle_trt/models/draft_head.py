"""EAGLE-3 draft head: one decoder layer over [embedding(token) ; fused target features].

Reads both layouts in use:
- modelopt's export (`layers.0.*`, `fc`, `norm`, optional `lm_head`, `d2t`). Its first layer norms the
  hidden input twice (the decoder layer's `input_layernorm`, then `hidden_norm` in the attention
  pre-hook), so we reproduce that to match what modelopt trained.
- the official SafeAILab release (`midlayer.*`): `hidden_norm` only.
- with `norm_before_residual: true` in config.json (speculators' heads, imported by `convert --head`), the decoder
  layer's residual is hidden_norm's output instead of the feature.

Data flow for draft position t: input = (f_t, token_{t+1}); f_t is fc(concat of the target's aux layer
outputs at t), or, while drafting past the verified prefix, the draft's own pre-norm output from the step
before. The output predicts token_{t+2}.

    head = Eagle3DraftHead.load("engines/x/draft", target)
    logits, hidden = head.forward(head.fuse(aux), tokens, positions, cache, start=0)
"""

from __future__ import annotations

from pathlib import Path

import torch

from eagle_trt.errors import CheckpointError
from eagle_trt.models import block_weights, weight_cache
from eagle_trt.models.kernel_api import Kernels, Part
from eagle_trt.models.kernels import choose_kernels, head_inputs
from eagle_trt.models.kv_cache import KVCache
from eagle_trt.models.layers import Rope, embed
from eagle_trt.models.spec import DraftSpec
from eagle_trt.models.weights import load_safetensors, read_json, take
from eagle_trt.private_cache import WeightSource


class Eagle3DraftHead:
    def __init__(self, spec: DraftSpec, w: dict, target, dtype, hidden_prenorm: bool, source,
                 normed_residual: bool = False):
        s, hd, hidden = spec, spec.head_dim, spec.hidden_size
        if hidden != target.spec.hidden_size:
            raise CheckpointError(
                f"{source}: draft hidden_size {hidden} does not match the target's hidden_size "
                f"{target.spec.hidden_size}; convert the head for this target"
            )
        q_out, kv_out = s.num_heads * hd, s.num_kv_heads * hd
        n_aux = len(s.aux_layer_ids)
        self.spec, self.dtype, self.hidden_prenorm = spec, dtype, hidden_prenorm
        # config norm_before_residual (speculators' heads): the decoder layer's residual is hidden_norm's output
        self.normed_residual = normed_residual
        self.kernels = self._kernels(target, dtype, n_aux)
        project = self.kernels.projection
        # Projections stored transposed, [in, out] (see models/llama.py for why).
        fused = block_weights.projection_weight  # float: [in, out]; GGUF blocks: rows as they are
        self.fc = project(fused([take(w, "fc.weight", (hidden, n_aux * hidden), source)]))
        self.fc_bias = w.pop("fc.bias", None)
        p = "layers.0."
        self.hidden_norm = take(w, p + "hidden_norm.weight", (hidden,), source)
        self.input_norm = take(w, p + "input_layernorm.weight", (hidden,), source)
        self.qkv = project(fused([
            take(w, p + "self_attn.q_proj.weight", (q_out, 2 * hidden), source),
            take(w, p + "self_attn.k_proj.weight", (kv_out, 2 * hidden), source),
            take(w, p + "self_attn.v_proj.weight", (kv_out, 2 * hidden), source),
        ]))
        self.o = project(fused([take(w, p + "self_attn.o_proj.weight", (hidden, q_out), source)]))
        self.post_norm = take(w, p + "post_attention_layernorm.weight", (hidden,), source)
        self.gate_up = project(fused([
            take(w, p + "mlp.gate_proj.weight", (s.intermediate_size, hidden), source),
            take(w, p + "mlp.up_proj.weight", (s.intermediate_size, hidden), source),
        ]))
        self.down = project(fused([take(w, p + "mlp.down_proj.weight", (hidden, s.intermediate_size), source)]))
        self.norm = take(w, "norm.weight", (hidden,), source)
        if "lm_head.weight" in w:
            self.lm_head = project(fused([take(w, "lm_head.weight", (s.draft_vocab_size, hidden), source)]))
        elif s.draft_vocab_size == target.spec.vocab_size:
            self.lm_head = target.lm_head  # modelopt reuses the target's head when the vocab is not reduced
        else:
            raise CheckpointError(f"{source}: tensor 'lm_head.weight' is missing (draft vocab is reduced)")
        self.embed = w.pop("embed_tokens.weight", None)
        if self.embed is None:
            self.embed = target.embed  # EAGLE-3 shares the target's embedding table
        d2t = w.pop("d2t", None)
        if d2t is not None and tuple(d2t.shape) != (s.draft_vocab_size,):
            raise CheckpointError(f"{source}: tensor 'd2t' has shape {list(d2t.shape)}, expected [{s.draft_vocab_size}]")
        # draft id -> target id, as one lookup table.
        ids = torch.arange(s.draft_vocab_size)
        self.draft_to_target = ids + d2t.long() if d2t is not None else ids
        if int(self.draft_to_target.max()) >= target.spec.vocab_size or int(self.draft_to_target.min()) < 0:
            raise CheckpointError(f"{source}: 'd2t' maps draft ids outside the target vocab ({target.spec.vocab_size})")
        w.pop("t2d", None)
        self.rope = Rope(hd, s.rope_theta, s.rope_scaling, target.rope.cos.shape[0], dtype)
        # The head reads token embeddings as the target's embedding module gives them (Gemma 3: scaled).
        self.embed_scale = target.spec.embed_scale
        self._weights = self.kernels.draft_weights(self)

    @staticmethod
    def _kernels(target, dtype, n_aux: int) -> Kernels:
        """The target's kernels where they serve this head (same dtype), fitted to the head's projections; else the
        kernels chosen for the head."""
        if target.kernels.dtype != dtype:
            return choose_kernels(dtype, target.spec, target.embed.device,
                                  getattr(target.kernels, "block_compute", "float"))
        return target.kernels.fitted(head_inputs(target.spec, n_aux))

    @classmethod
    def load(cls, draft_dir: str | Path, target, dtype: torch.dtype = torch.float32,
             cache: WeightSource | None = None) -> "Eagle3DraftHead":
        """The head in draft_dir for `target`. cache (an engine's head, `EngineDir.weight_source`): its runtime
        layout from the weight cache when this machine made it before, stored there when not
        (`models/weight_cache.py`)."""
        draft_dir = Path(draft_dir)
        cfg_path = draft_dir / "config.json"
        cfg = read_json(cfg_path)
        spec = DraftSpec.from_config(cfg, target.spec, str(cfg_path))
        normed_residual = bool(cfg.get("norm_before_residual", False))
        kernels = cls._kernels(target, dtype, len(spec.aux_layer_ids))

        def make() -> "Eagle3DraftHead":
            src = draft_dir / "model.safetensors"
            w, table = load_safetensors(src, dtype), block_weights.read_table(draft_dir)
            official = any(k.startswith("midlayer.") for k in w)
            if official:
                w = {k.replace("midlayer.", "layers.0.", 1): t for k, t in w.items()}
                table = {k.replace("midlayer.", "layers.0.", 1): e for k, e in table.items()}
            if table:  # build quantized the head's projections (draft_weights)
                w = block_weights.BlockTensors(w, table, src)
            return cls(spec, w, target, dtype, hidden_prenorm=not official, source=src, normed_residual=normed_residual)

        return weight_cache.load_or_make(
            cache, "draft", kernels.cache_key, make,
            state_of=lambda head: head.runtime_state(target),
            restore=lambda tensors, meta: cls.from_runtime_state(spec, target, dtype, kernels, tensors, meta,
                                                                 normed_residual))

    _PROJECTIONS = ("fc", "qkv", "o", "gate_up", "down")
    _TENSORS = ("hidden_norm", "input_norm", "post_norm", "norm", "draft_to_target")

    def runtime_state(self, target) -> tuple[dict[str, torch.Tensor], dict]:
        """Every tensor the head reads, in its kernels' layout; the LM head and the embedding table only where they
        are the head's own (else they are the target's, and taken from it on load)."""
        b = self.kernels
        tensors = {name: getattr(self, name) for name in self._TENSORS}
        meta = {"projections": {}, "hidden_prenorm": self.hidden_prenorm, "own_lm_head": self.lm_head is not
                target.lm_head, "own_embed": self.embed is not target.embed}
        for name in self._PROJECTIONS + (("lm_head",) if meta["own_lm_head"] else ()):
            tensors[name], meta["projections"][name] = b.projection_state(getattr(self, name))
        if self.fc_bias is not None:
            tensors["fc_bias"] = self.fc_bias
        if meta["own_embed"]:
            tensors["embed"] = self.embed
        return tensors, meta

    @classmethod
    def from_runtime_state(cls, spec: DraftSpec, target, dtype, kernels, tensors: dict, meta: dict,
                           normed_residual: bool = False) -> "Eagle3DraftHead":
        """The head `runtime_state` described, its projections taken as they are (nothing packed or copied)."""
        head = cls.__new__(cls)
        head.spec, head.dtype, head.hidden_prenorm, head.kernels = spec, dtype, meta["hidden_prenorm"], kernels
        head.normed_residual = normed_residual
        for name in cls._PROJECTIONS + (("lm_head",) if meta["own_lm_head"] else ()):
            setattr(head, name, kernels.projection_from_state(tensors[name], meta["projections"][name]))
        for name in cls._TENSORS:
            setattr(head, name, tensors[name])
        head.fc_bias = tensors.get("fc_bias")
        if not meta["own_lm_head"]:
            head.lm_head = target.lm_head
        head.embed = tensors["embed"] if meta["own_embed"] else target.embed
        head.rope = Rope(spec.head_dim, spec.rope_theta, spec.rope_scaling, target.rope.cos.shape[0], dtype)
        head.embed_scale = target.spec.embed_scale
        head._weights = kernels.draft_weights(head)
        return head

    def new_cache(self, capacity: int, kv_dtype: torch.dtype | None = None, k_scales=None, v_scales=None) -> KVCache:
        s = self.spec
        return KVCache(1, s.num_kv_heads, s.head_dim, capacity, kv_dtype or self.dtype, self.dtype,
                       k_scales, v_scales, device=self.fc.w.device)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[T, n_aux * H] target features -> [T, H] draft input."""
        out = self.fc(aux)
        return out + self.fc_bias if self.fc_bias is not None else out

    @torch.inference_mode()
    def forward(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        start: int,
        mask: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: [T, H]; tokens, positions: [T]; K/V written to slots [start, start+T).

        mask: [T, start+T] bool (True = visible) or None when every slot is visible.
        Returns draft logits [T, draft_vocab] (only the last row with last_only) and the pre-norm
        output hidden [T, H]."""
        return self.batched_forward(hidden, tokens, positions, [Part(cache, start, tokens.numel(), mask)], last_only)

    @torch.inference_mode()
    def batched_forward(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, parts: list[Part],
                        last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Several requests' rows in one forward (`kernel_api.Part`: each request's head cache, start, rows and
        mask, in row order) -> draft logits [T, draft_vocab] (with last_only: each part's last row,
        [len(parts), draft_vocab]) and the pre-norm output hidden [T, H]."""
        cos, sin = self.rope.tables(positions)
        return self.kernels.draft_layer(self._weights, spec=self.spec, hidden=hidden,
                                        e=embed(self.embed, tokens, self.embed_scale),
                                        prenorm=self.hidden_prenorm, cos=cos, sin=sin, parts=parts,
                                        last_only=last_only)

    def top_logp(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits [R, V] (or [V]) -> the k most likely draft ids of each row and their log-probs, largest first:
        (log-probs [R, k] fp32, draft ids [R, k]), in one compiled pass per row on the native kernels."""
        return self.kernels.top_logp(logits.view(-1, logits.shape[-1]), k)
