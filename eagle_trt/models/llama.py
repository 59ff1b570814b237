"""Lean Llama-family target forward (Llama, SmolLM2, Mistral, Qwen2) for speculative decoding.

One call runs T tokens at explicit positions against the KV cache: the committed prefix is fully
visible, and the T new tokens see each other through `tree_mask` (causal when it is None). So the same
function does prefill, plain decoding (T=1) and tree verification (T = tree size).

    target = LlamaTarget.load("engines/x/target", dtype=torch.float32)
    cache = target.new_cache(capacity=4096)
    logits, aux = target.forward(ids, positions, cache, tree_mask=None, need_aux=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_trt.models import native_attention, native_ops, native_stack
from eagle_trt.models.gemm import Projection
from eagle_trt.models.native_gemm import ARGMAX_ROWS
from eagle_trt.models.kv_cache import KVCache
from eagle_trt.models.layers import Rope, additive_mask, attention, attention_fp64, rms_norm, swiglu_mlp
from eagle_trt.models.spec import TargetSpec
from eagle_trt.models.weights import load_safetensors, read_json, take


@dataclass
class LayerWeights:
    # Projections hold the weight transposed, [in, out], plus a prepacked copy for multi-row and bf16
    # calls (see models/gemm.py).
    input_norm: torch.Tensor
    qkv: Projection  # [hidden, (H + 2*Hkv) * D]: q columns, then k, then v
    qkv_bias: torch.Tensor | None
    o: Projection  # [H * D, hidden]
    post_norm: torch.Tensor
    gate_up: Projection  # [hidden, 2I]: gate columns, then up
    down: Projection  # [I, hidden]


def pick_attention(dtype: torch.dtype, device: torch.device, spec: TargetSpec | None = None):
    """The target's attention. bf16: a verify row must be bit-identical to decoding that token alone (the
    prepacked bf16 GEMMs already are; see models/gemm.py), so on the CPU it is the compiled row-invariant kernel
    (models/native_attention.py), else the float64 fallback (the same property at about twice the cost).
    fp32 keeps the fused kernel: its one-row and many-row GEMMs differ in the last bit anyway, those differences
    sit far below any greedy tie seen in practice, and it is as fast. EAGLE_TRT_NATIVE=0 turns the kernel off;
    a model whose head layout the kernel does not take (`NativeAttention.supports`) gets the fallback."""
    if dtype == torch.float32:
        return attention
    if device.type == "cpu" and dtype == torch.bfloat16:
        kernel = native_attention.load()
        if kernel is not None and (spec is None or kernel.supports(spec.num_heads, spec.num_kv_heads, spec.head_dim)):
            return kernel
    return attention_fp64


def pick_row_ops(dtype: torch.dtype, device: torch.device, spec: TargetSpec) -> "native_ops.RowOps | None":
    """The fused per-row ops (norms, RoPE + cache write, SiLU * up, argmax; models/native_ops.py) for a bf16 target on
    the CPU; None keeps the torch operators (fp32, which matches transformers' op order bit for bit, and every
    fallback). Independent of the attention: each row stays a function of that row with either."""
    if dtype != torch.bfloat16 or device.type != "cpu":
        return None
    ops = native_ops.load()
    if ops is None or not ops.supports(spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.attention_bias):
        return None
    return ops


class LlamaTarget:
    def __init__(self, spec: TargetSpec, embed, layers, norm, lm_head, dtype, max_positions: int | None = None):
        self.spec = spec
        self.embed = embed
        self.layers: list[LayerWeights] = layers
        self.norm = norm
        self.lm_head = lm_head if isinstance(lm_head, Projection) else Projection(lm_head)  # [hidden, vocab]
        self.dtype = dtype
        self.rope = Rope(spec.head_dim, spec.rope_theta, spec.rope_scaling,
                         max_positions or spec.max_position_embeddings, dtype)
        self.aux_layer_ids: list[int] = []
        self.attend = pick_attention(dtype, embed.device, spec)
        self.row_ops = pick_row_ops(dtype, embed.device, spec)
        # The layer loop in one call where every projection is on the AMX kernel (used while the attention is the
        # compiled kernel the stack calls; see _hidden_states_fused).
        stack = native_stack.load() if self.row_ops is not None else None
        self.stack = stack if stack is not None and stack.supports(layers) else None
        self._stack_weights = native_stack.StackWeights(layers, norm) if self.stack is not None else None

    # ---- loading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: str | Path, dtype: torch.dtype = torch.float32) -> "LlamaTarget":
        model_dir = Path(model_dir)
        spec = TargetSpec.from_hf_config(read_json(model_dir / "config.json"), str(model_dir / "config.json"))
        src = model_dir / "model.safetensors"
        w = load_safetensors(src, dtype)
        return cls.from_state_dict(spec, w, dtype, src)

    @classmethod
    def from_state_dict(cls, spec: TargetSpec, w: dict, dtype, source="state dict") -> "LlamaTarget":
        s, hd = spec, spec.head_dim
        q_out, kv_out = s.num_heads * hd, s.num_kv_heads * hd
        embed = take(w, "model.embed_tokens.weight", (s.vocab_size, s.hidden_size), source)
        layers = []
        for i in range(s.num_layers):
            p = f"model.layers.{i}."
            q = take(w, p + "self_attn.q_proj.weight", (q_out, s.hidden_size), source)
            k = take(w, p + "self_attn.k_proj.weight", (kv_out, s.hidden_size), source)
            v = take(w, p + "self_attn.v_proj.weight", (kv_out, s.hidden_size), source)
            bias = None
            if s.attention_bias:
                bias = torch.cat([take(w, p + f"self_attn.{n}_proj.bias", (o,), source)
                                  for n, o in (("q", q_out), ("k", kv_out), ("v", kv_out))])
            gate = take(w, p + "mlp.gate_proj.weight", (s.intermediate_size, s.hidden_size), source)
            up = take(w, p + "mlp.up_proj.weight", (s.intermediate_size, s.hidden_size), source)
            layers.append(LayerWeights(
                input_norm=take(w, p + "input_layernorm.weight", (s.hidden_size,), source),
                qkv=Projection(torch.cat([q, k, v]).t().contiguous()),
                qkv_bias=bias,
                o=Projection(take(w, p + "self_attn.o_proj.weight", (s.hidden_size, q_out), source).t().contiguous()),
                post_norm=take(w, p + "post_attention_layernorm.weight", (s.hidden_size,), source),
                gate_up=Projection(torch.cat([gate, up]).t().contiguous()),
                down=Projection(take(w, p + "mlp.down_proj.weight", (s.hidden_size, s.intermediate_size), source).t().contiguous()),
            ))
        norm = take(w, "model.norm.weight", (s.hidden_size,), source)
        if "lm_head.weight" in w:
            lm_head = take(w, "lm_head.weight", (s.vocab_size, s.hidden_size), source)
        else:
            lm_head = embed  # tied embeddings (SmolLM2)
        # [hidden, vocab]; for tied embeddings this is a transposed copy (the lookup keeps [vocab, hidden]).
        return cls(spec, embed, layers, norm, lm_head.t().contiguous(), dtype)

    def new_cache(self, capacity: int, kv_dtype: torch.dtype | None = None, k_scales=None, v_scales=None) -> KVCache:
        s = self.spec
        return KVCache(s.num_layers, s.num_kv_heads, s.head_dim, capacity, kv_dtype or self.dtype,
                       self.dtype, k_scales, v_scales, device=self.embed.device)

    # ---- forward -----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,
        need_aux: bool = False,
        logits_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens, positions: [T]; tree_mask: [T, T] bool (row sees column) or None for causal.

        Writes K/V at slots [cache.length, cache.length + T) without advancing cache.length.
        Returns logits [T, V] (or only `logits_rows`) and, with need_aux, the EAGLE-3 features
        [T, len(aux_layer_ids) * hidden]: outputs of the decoder layers in `aux_layer_ids`.
        """
        hidden, aux = self.hidden_states(tokens, positions, cache, tree_mask, need_aux, logits_rows)
        return self.logits(hidden), aux

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [R, H] -> logits [R, V]. Split out so a verify pass can skip rows it never reads."""
        return self.lm_head(hidden)

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [R, H] -> the greedy token of each row [R]: `argmax(logits(hidden))`, with the LM
        head and the argmax fused where the AMX kernel holds the LM head (the logits are never written). Up to 16
        rows: the fused kernel takes 16 a pass over the weight, the plain one 32."""
        if self.lm_head.amx is not None and hidden.dtype == torch.bfloat16 and hidden.shape[0] <= ARGMAX_ROWS:
            return self.lm_head.argmax(hidden)
        return self.argmax(self.logits(hidden))

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [R, V] -> the greedy token of each row [R] (torch.argmax's answer; bf16 rows in the row-ops
        kernel, which reads them as they are instead of torch's slower bf16 reduction)."""
        if self.row_ops is not None and logits.dtype == torch.bfloat16 and logits.dim() == 2:
            return self.row_ops.argmax(logits)
        return logits.argmax(dim=-1)

    @torch.inference_mode()
    def hidden_states(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,
        need_aux: bool = False,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Like `forward`, but returns the final-normed hidden states [T (or rows), H] instead of logits."""
        s = self.spec
        t = tokens.shape[0]
        start = cache.length
        end = start + t
        if self.row_ops is not None and cache.k.dtype == torch.bfloat16:
            return self._hidden_states_fused(tokens, positions, cache, tree_mask, need_aux, rows)
        mask = self._mask(t, start, tree_mask)
        q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        aux = []
        x = self.embed[tokens]  # [T, hidden]
        cos, sin = self.rope.tables(positions)
        for i, lw in enumerate(self.layers):
            h = rms_norm(x, lw.input_norm, s.rms_norm_eps)
            qkv = lw.qkv(h)
            if lw.qkv_bias is not None:
                qkv = qkv + lw.qkv_bias
            # RoPE on q and k heads together: [H + Hkv, T, D].
            qk = qkv[:, :q_out + kv_out].reshape(t, s.num_heads + s.num_kv_heads, s.head_dim).transpose(0, 1)
            q, k = self.rope.rotate(qk, cos, sin).split((s.num_heads, s.num_kv_heads))
            v = qkv[:, q_out + kv_out:].reshape(t, s.num_kv_heads, s.head_dim).transpose(0, 1)
            cache.write(i, start, k, v)
            kc, vc = cache.read(i, end)
            x = x + lw.o(self.attend(q, kc, vc, mask))
            x = x + swiglu_mlp(rms_norm(x, lw.post_norm, s.rms_norm_eps), lw.gate_up, lw.down)
            if need_aux and i in self.aux_layer_ids:
                aux.append(x)
        x = rms_norm(x if rows is None else x[rows], self.norm, s.rms_norm_eps)
        if not need_aux:
            return x, None
        # Order follows aux_layer_ids (ascending, as modelopt concatenates them).
        return x, torch.cat(aux, dim=-1)

    def _mask(self, t: int, start: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        """What every layer's attention gets for T new tokens after `start` cached ones: [T, start + T], the prefix
        fully visible and the new tokens by the tree mask (causal when None); None for one token. float64 attention
        takes it in its additive form, made once here for all layers."""
        if t == 1:
            return None
        local = tree_mask if tree_mask is not None else torch.ones(t, t, dtype=torch.bool).tril_()
        mask = torch.cat([torch.ones(t, start, dtype=torch.bool), local], dim=1)
        if self.attend is attention_fp64:
            return additive_mask(mask, self.spec.num_heads // self.spec.num_kv_heads)
        return mask

    def _hidden_states_fused(self, tokens, positions, cache, tree_mask, need_aux, rows):
        """`hidden_states` with the per-row ops fused (bf16, bf16 KV cache): torch's values, bit for bit but for the
        norms' rare last-bit differences (tests/test_native_ops.py), in a fraction of the calls. The residual add of each layer's MLP is done by the
        next norm's call, so a layer's output (an EAGLE-3 feature) is read after that call."""
        s, ops = self.spec, self.row_ops
        t = tokens.shape[0]
        start = cache.length
        mask = self._mask(t, start, tree_mask)
        x = self.embed[tokens]  # [T, hidden], a fresh tensor: updated in place below
        cos, sin = self.rope.tables(positions)
        # The same kernels in the same order, in one call (models/native_stack.py), unless the attention was swapped.
        if self.stack is not None and isinstance(self.attend, native_attention.NativeAttention):
            h, aux = self.stack(self._stack_weights, s, x, cos, sin, cache.k, cache.v, start, mask,
                                self.aux_layer_ids if need_aux else [])
            return (h if rows is None else h[rows]), aux
        aux = []
        want = set(self.aux_layer_ids) if need_aux else set()
        # One buffer per intermediate, reused by every layer: each is read before the next layer writes it.
        bf = torch.bfloat16
        h_buf, o_buf, d_buf = (torch.empty(t, s.hidden_size, dtype=bf) for _ in range(3))
        qkv_buf = torch.empty(t, (s.num_heads + 2 * s.num_kv_heads) * s.head_dim, dtype=bf)
        q_buf = torch.empty(s.num_heads, t, s.head_dim, dtype=bf)
        gu_buf = torch.empty(t, 2 * s.intermediate_size, dtype=bf)
        a_buf = torch.empty(t, s.intermediate_size, dtype=bf)
        pending = None  # the last layer's MLP output, not yet added to x
        for i, lw in enumerate(self.layers):
            h = ops.add_rms_norm(x, pending, lw.input_norm, s.rms_norm_eps, out=h_buf)
            if i - 1 in want:
                aux.append(x.clone())
            q = ops.rope_qkv(lw.qkv(h, out=qkv_buf), lw.qkv_bias, cos, sin, cache.k[i], cache.v[i], start,
                             s.num_heads, s.num_kv_heads, out=q_buf)
            kc, vc = cache.read(i, start + t)
            h = ops.add_rms_norm(x, lw.o(self.attend(q, kc, vc, mask), out=o_buf), lw.post_norm, s.rms_norm_eps,
                                 out=h_buf)
            pending = lw.down(ops.silu_mul(lw.gate_up(h, out=gu_buf), out=a_buf), out=d_buf)
        h = ops.add_rms_norm(x, pending, self.norm, s.rms_norm_eps)
        if len(self.layers) - 1 in want:
            aux.append(x)
        if rows is not None:
            h = h[rows]
        if not need_aux:
            return h, None
        return h, torch.cat(aux, dim=-1)
