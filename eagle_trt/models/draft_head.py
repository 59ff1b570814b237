"""EAGLE-3 draft head: one decoder layer over [embedding(token) ; fused target features].

Reads both layouts in use:
- modelopt's export (`layers.0.*`, `fc`, `norm`, optional `lm_head`, `d2t`). Its first layer norms the
  hidden input twice (the decoder layer's `input_layernorm`, then `hidden_norm` in the attention
  pre-hook), so we reproduce that to match what modelopt trained.
- the official SafeAILab release (`midlayer.*`): `hidden_norm` only.

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
from eagle_trt.models import native_draft
from eagle_trt.models.gemm import Projection
from eagle_trt.models.kv_cache import KVCache
from eagle_trt.models.layers import Rope, attention, rms_norm, swiglu_mlp
from eagle_trt.models.spec import DraftSpec
from eagle_trt.models.weights import load_safetensors, read_json, take


class Eagle3DraftHead:
    def __init__(self, spec: DraftSpec, w: dict, target, dtype, hidden_prenorm: bool, source):
        s, hd, hidden = spec, spec.head_dim, spec.hidden_size
        if hidden != target.spec.hidden_size:
            raise CheckpointError(
                f"{source}: draft hidden_size {hidden} does not match the target's hidden_size "
                f"{target.spec.hidden_size}; convert the head for this target"
            )
        q_out, kv_out = s.num_heads * hd, s.num_kv_heads * hd
        n_aux = len(s.aux_layer_ids)
        self.spec, self.dtype, self.hidden_prenorm = spec, dtype, hidden_prenorm
        # Projections stored transposed, [in, out] (see models/llama.py for why).
        self.fc = Projection(take(w, "fc.weight", (hidden, n_aux * hidden), source).t().contiguous())
        self.fc_bias = w.pop("fc.bias", None)
        p = "layers.0."
        self.hidden_norm = take(w, p + "hidden_norm.weight", (hidden,), source)
        self.input_norm = take(w, p + "input_layernorm.weight", (hidden,), source)
        self.qkv = Projection(torch.cat([
            take(w, p + "self_attn.q_proj.weight", (q_out, 2 * hidden), source),
            take(w, p + "self_attn.k_proj.weight", (kv_out, 2 * hidden), source),
            take(w, p + "self_attn.v_proj.weight", (kv_out, 2 * hidden), source),
        ]).t().contiguous())
        self.o = Projection(take(w, p + "self_attn.o_proj.weight", (hidden, q_out), source).t().contiguous())
        self.post_norm = take(w, p + "post_attention_layernorm.weight", (hidden,), source)
        self.gate_up = Projection(torch.cat([
            take(w, p + "mlp.gate_proj.weight", (s.intermediate_size, hidden), source),
            take(w, p + "mlp.up_proj.weight", (s.intermediate_size, hidden), source),
        ]).t().contiguous())
        self.down = Projection(take(w, p + "mlp.down_proj.weight", (hidden, s.intermediate_size), source).t().contiguous())
        self.norm = take(w, "norm.weight", (hidden,), source)
        if "lm_head.weight" in w:
            self.lm_head = Projection(take(w, "lm_head.weight", (s.draft_vocab_size, hidden), source).t().contiguous())
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
        # The target's fused bf16 row ops where it has them (and the head's shapes fit them), else torch's.
        ops = getattr(target, "row_ops", None)
        self.row_ops = ops if ops is not None and dtype == torch.bfloat16 and ops.supports(
            s.num_heads, s.num_kv_heads, hd, False) else None
        # With them, the whole layer in one compiled call where every projection is on the AMX kernel.
        layer = native_draft.load() if self.row_ops is not None else None
        self.layer = layer if layer is not None and layer.supports(self) else None
        self._layer_weights = native_draft.DraftWeights(self) if self.layer is not None else None

    @classmethod
    def load(cls, draft_dir: str | Path, target, dtype: torch.dtype = torch.float32) -> "Eagle3DraftHead":
        draft_dir = Path(draft_dir)
        cfg_path = draft_dir / "config.json"
        spec = DraftSpec.from_config(read_json(cfg_path), target.spec, str(cfg_path))
        src = draft_dir / "model.safetensors"
        w = load_safetensors(src, dtype)
        official = any(k.startswith("midlayer.") for k in w)
        if official:
            w = {k.replace("midlayer.", "layers.0.", 1): t for k, t in w.items()}
        return cls(spec, w, target, dtype, hidden_prenorm=not official, source=src)

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
        s = self.spec
        t = tokens.shape[0]
        eps = s.rms_norm_eps
        if self.row_ops is not None and cache.k.dtype == torch.bfloat16:
            return self._forward_fused(hidden, tokens, positions, cache, start, mask, last_only)
        h_in = rms_norm(hidden, self.input_norm, eps) if self.hidden_prenorm else hidden
        x = torch.cat([rms_norm(self.embed[tokens], self.input_norm, eps), rms_norm(h_in, self.hidden_norm, eps)], -1)
        q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        q, k, v = self.qkv(x).split((q_out, kv_out, kv_out), dim=-1)
        q = self.rope.apply(q.view(t, s.num_heads, s.head_dim).transpose(0, 1), positions)
        k = self.rope.apply(k.view(t, s.num_kv_heads, s.head_dim).transpose(0, 1), positions)
        v = v.view(t, s.num_kv_heads, s.head_dim).transpose(0, 1)
        cache.write(0, start, k, v)
        kc, vc = cache.read(0, start + t)
        out = hidden + self.o(attention(q, kc, vc, mask))
        out = out + swiglu_mlp(rms_norm(out, self.post_norm, eps), self.gate_up, self.down)
        logits = self.lm_head(rms_norm(out[-1:] if last_only else out, self.norm, eps))
        return logits, out

    def top_logp(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits [R, V] (or [V]) -> the k most likely draft ids of each row and their log-probs, largest first:
        (log-probs [R, k] fp32, draft ids [R, k]). One compiled pass per row with the compiled layer, else torch's
        log_softmax and topk."""
        rows = logits.view(-1, logits.shape[-1])
        if self.layer is not None and rows.dtype == torch.bfloat16:
            return self.layer.top_logp(rows, k)
        return torch.log_softmax(rows.float(), dim=-1).topk(min(k, rows.shape[-1]), dim=-1)

    def _forward_fused(self, hidden, tokens, positions, cache, start, mask, last_only):
        """`forward` with the target's fused bf16 row ops (models/native_ops.py): torch's values up to the norms'
        last bits, in a fraction of the operator calls. The head only proposes, so its numerics need no
        invariance; this is for speed."""
        s, ops, eps = self.spec, self.row_ops, self.spec.rms_norm_eps
        hidden = hidden.contiguous()
        if self.layer is not None:  # the same steps in one call (models/native_draft.py)
            cos, sin = self.rope.tables(positions)
            return self.layer(self._layer_weights, s, hidden, self.embed[tokens], self.hidden_prenorm, cos, sin,
                              cache.k[0], cache.v[0], start, mask, last_only)
        h_in = ops.add_rms_norm(hidden, None, self.input_norm, eps) if self.hidden_prenorm else hidden
        x = torch.cat([ops.add_rms_norm(self.embed[tokens], None, self.input_norm, eps),
                       ops.add_rms_norm(h_in, None, self.hidden_norm, eps)], -1)
        cos, sin = self.rope.tables(positions)
        q = ops.rope_qkv(self.qkv(x), None, cos, sin, cache.k[0], cache.v[0], start, s.num_heads, s.num_kv_heads)
        kc, vc = cache.read(0, start + tokens.shape[0])
        out = hidden.clone()  # the caller's features stay as they are
        h = ops.add_rms_norm(out, self.o(attention(q, kc, vc, mask)), self.post_norm, eps)
        h = ops.add_rms_norm(out, self.down(ops.silu_mul(self.gate_up(h))), self.norm, eps)
        return self.lm_head(h[-1:] if last_only else h), out
