"""Lean target forward (the families of architectures.py: Llama, SmolLM2, Mistral, Qwen2, Qwen3, Gemma 3) for
speculative decoding.

One call runs T tokens at explicit positions against the KV cache: the committed prefix is fully
visible, and the T new tokens see each other through `tree_mask` (causal when it is None). So the same
function does prefill, plain decoding (T=1) and tree verification (T = tree size). The layers run on the
kernels chosen when the weights load (`models/kernels.py`): one compiled call per forward on the CPU kernels, the
torch reference elsewhere.

    target = LlamaTarget.load("engines/x/target", dtype=torch.float32)
    cache = target.new_cache(capacity=4096)
    logits, aux = target.forward(ids, positions, cache, tree_mask=None, need_aux=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_trt.errors import CheckpointError
from eagle_trt.models import block_weights, weight_cache
from eagle_trt.models.kernel_api import Part
from eagle_trt.models.kernels import choose_kernels
from eagle_trt.models.kv_cache import KVCache
from eagle_trt.models.layers import Rope, embed, window_mask
from eagle_trt.models.spec import TargetSpec
from eagle_trt.models.weights import LazyTensors, read_json, take
from eagle_trt.private_cache import WeightSource


def model_tensors(model_dir: Path, dtype: torch.dtype):
    """A model dir's tensors read as they are taken: floating ones cast to `dtype`, those its blocks.json names as
    GGUF block weights (a quantized engine's projections)."""
    tensors = LazyTensors(model_dir, dtype)
    table = block_weights.read_table(model_dir)
    return block_weights.BlockTensors(tensors, table, model_dir) if table else tensors


@dataclass
class Rows:
    """One request's tokens in a target forward: ids and positions [T], its KV cache (written after
    cache.length), and how they see each other (tree_mask [T, T] bool; None: causal)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    cache: KVCache
    tree_mask: torch.Tensor | None = None


@dataclass
class LayerWeights:
    # Projections come from the kernels (models/kernels.py): each weight [in, out], packed for its kernel.
    input_norm: torch.Tensor
    qkv: object  # [hidden, (H + 2*Hkv) * D]: q columns, then k, then v
    qkv_bias: torch.Tensor | None
    o: object  # [H * D, hidden]
    post_norm: torch.Tensor
    gate_up: object  # [hidden, 2I]: gate columns, then up
    down: object  # [I, hidden]
    q_norm: torch.Tensor | None = None  # [D], every query head's RMSNorm before RoPE (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None  # [D], every key head's
    attn_out_norm: torch.Tensor | None = None  # [hidden], the attention output's before its residual add (Gemma 3)
    mlp_out_norm: torch.Tensor | None = None  # [hidden], the MLP output's before its residual add (Gemma 3)


# The norms only some families have, by their LayerWeights field.
OPTIONAL_NORMS = ("q_norm", "k_norm", "attn_out_norm", "mlp_out_norm")


def _norm_weight(w: torch.Tensor, spec: TargetSpec) -> torch.Tensor:
    """A norm's weight as the kernels multiply by it: Gemma 3 scales by (1 + w), the 1 added here (in fp32, as
    transformers adds it, then in the weights' dtype)."""
    return (w.float() + 1.0).to(w.dtype) if spec.norm_plus_one else w


def _layer_norms(w: dict, p: str, s: TargetSpec, source) -> dict:
    """One layer's norms by LayerWeights field, from the checkpoint names of its family: Gemma 3's
    post_attention_layernorm is its attention output's norm and pre_feedforward_layernorm the MLP's input norm."""
    names = dict(input_norm="input_layernorm", post_norm="post_attention_layernorm")
    if s.sandwich_norms:
        names.update(post_norm="pre_feedforward_layernorm", attn_out_norm="post_attention_layernorm",
                     mlp_out_norm="post_feedforward_layernorm")
    out = {field: _norm_weight(take(w, p + name + ".weight", (s.hidden_size,), source), s)
           for field, name in names.items()}
    if s.qk_norm:
        for field in ("q_norm", "k_norm"):
            out[field] = _norm_weight(take(w, p + f"self_attn.{field}.weight", (s.head_dim,), source), s)
    return out


class LlamaTarget:
    def __init__(self, spec: TargetSpec, embed, layers, norm, lm_head, dtype, max_positions: int | None = None,
                 kernels=None):
        """`layers`: LayerWeights whose projections `kernels` made; `lm_head` [hidden, vocab] (a tensor, packed
        here) or a projection."""
        self.spec = spec
        self.embed = embed
        self.kernels = kernels or choose_kernels(dtype, spec, embed.device)
        self.layers: list[LayerWeights] = layers
        self.norm = norm
        plain = isinstance(lm_head, (torch.Tensor, block_weights.BlockWeight))
        self.lm_head = self.kernels.projection(lm_head) if plain else lm_head
        self.dtype = dtype
        self.rope = Rope(spec.head_dim, spec.rope_theta, spec.rope_scaling,
                         max_positions or spec.max_position_embeddings, dtype)
        # Gemma 3's sliding-window layers rotate with their own base, unscaled.
        self.local_rope = Rope(spec.head_dim, spec.rope_local_theta, None,
                               max_positions or spec.max_position_embeddings, dtype) if spec.local_layers else None
        self.aux_layer_ids: list[int] = []
        self._weights = self.kernels.target_weights(layers, norm)
        self.source = "the model"  # what an error names: its dir, once `load` knows it

    @property
    def row_invariant(self) -> bool:
        """True when the kernels guarantee a verify row is bit-identical to decoding that token alone (for a KV
        cache in the engine's dtype), which is what keeps greedy speculative output equal to plain decoding."""
        return self.kernels.row_invariant

    @property
    def lm_head_rows(self) -> int:
        """Rows the LM head scores in one pass over its weight: scoring up to this many costs about one row."""
        return self.kernels.lm_head_rows

    # ---- loading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: str | Path, dtype: torch.dtype = torch.float32, cache: WeightSource | None = None,
             role: str = "target", block_compute: str = "float") -> "LlamaTarget":
        """The model in model_dir (model.safetensors, or shards with their index), its tensors read one at a time.
        cache (an engine's weights, `EngineDir.weight_source`): the runtime layout comes from the weight cache when
        this machine made it before, and is stored there when not (`models/weight_cache.py`). block_compute: how
        block weights compute (the engine's `block_compute`: float or int8)."""
        model_dir = Path(model_dir)
        spec = TargetSpec.from_hf_config(read_json(model_dir / "config.json"), str(model_dir / "config.json"))
        kernels = choose_kernels(dtype, spec, block_compute=block_compute)
        model = weight_cache.load_or_make(
            cache, role, kernels.cache_key,
            make=lambda: cls.from_state_dict(spec, model_tensors(model_dir, dtype), dtype, model_dir, kernels=kernels),
            state_of=lambda model: model.runtime_state(),
            restore=lambda tensors, meta: cls.from_runtime_state(spec, dtype, kernels, tensors, meta))
        model.source = str(model_dir)
        return model

    def runtime_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Every tensor the forward reads, in the kernels' layout, and how to rebuild the model from them."""
        b, tensors, meta = self.kernels, {"embed": self.embed, "norm": self.norm}, {"projections": {}}

        def project(name: str, proj) -> None:
            tensors[name], meta["projections"][name] = b.projection_state(proj)

        for i, lw in enumerate(self.layers):
            tensors[f"layers.{i}.input_norm"], tensors[f"layers.{i}.post_norm"] = lw.input_norm, lw.post_norm
            for name in ("qkv_bias", *OPTIONAL_NORMS):
                if getattr(lw, name) is not None:
                    tensors[f"layers.{i}.{name}"] = getattr(lw, name)
            for part in ("qkv", "o", "gate_up", "down"):
                project(f"layers.{i}.{part}", getattr(lw, part))
        project("lm_head", self.lm_head)
        meta["num_layers"] = len(self.layers)
        return tensors, meta

    @classmethod
    def from_runtime_state(cls, spec: TargetSpec, dtype, kernels, tensors: dict, meta: dict) -> "LlamaTarget":
        """The model `runtime_state` described, its projections taken as they are (nothing packed or copied)."""
        if meta["num_layers"] != spec.num_layers:
            raise ValueError("the stored layout is for another model")

        def project(name: str):
            return kernels.projection_from_state(tensors[name], meta["projections"][name])

        layers = [LayerWeights(
            input_norm=tensors[f"layers.{i}.input_norm"], qkv=project(f"layers.{i}.qkv"),
            qkv_bias=tensors.get(f"layers.{i}.qkv_bias"), o=project(f"layers.{i}.o"),
            post_norm=tensors[f"layers.{i}.post_norm"], gate_up=project(f"layers.{i}.gate_up"),
            down=project(f"layers.{i}.down"), **{n: tensors.get(f"layers.{i}.{n}") for n in OPTIONAL_NORMS})
            for i in range(spec.num_layers)]
        return cls(spec, tensors["embed"], layers, tensors["norm"], project("lm_head"), dtype, kernels=kernels)

    @classmethod
    def from_state_dict(cls, spec: TargetSpec, w: dict, dtype, source="state dict", kernels=None) -> "LlamaTarget":
        """`kernels`: the kernels to run on (default: chosen for this dtype and shape, `models/kernels.py`)."""
        s, hd = spec, spec.head_dim
        kernels = kernels or choose_kernels(dtype, spec, next(iter(w.values())).device if w else "cpu")
        project = kernels.projection
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
            norms = _layer_norms(w, p, s, source)
            layers.append(LayerWeights(
                qkv=project(block_weights.projection_weight([q, k, v])),
                qkv_bias=bias,
                o=project(block_weights.projection_weight([take(w, p + "self_attn.o_proj.weight",
                                                                (s.hidden_size, q_out), source)])),
                gate_up=project(block_weights.projection_weight([gate, up])),
                down=project(block_weights.projection_weight([take(w, p + "mlp.down_proj.weight",
                                                                   (s.hidden_size, s.intermediate_size), source)])),
                **norms,
            ))
        norm = _norm_weight(take(w, "model.norm.weight", (s.hidden_size,), source), s)
        if "lm_head.weight" in w:
            lm_head = take(w, "lm_head.weight", (s.vocab_size, s.hidden_size), source)
        else:
            lm_head = embed  # tied embeddings (SmolLM2)
        # [hidden, vocab]; for tied embeddings this is a transposed copy (the lookup keeps [vocab, hidden]). A
        # quantized engine stores its LM head's blocks apart even when the embeddings are tied.
        return cls(spec, embed, layers, norm, block_weights.projection_weight([lm_head]), dtype, kernels=kernels)

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
        aux_layers: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens, positions: [T]; tree_mask: [T, T] bool (row sees column) or None for causal.

        Writes K/V at slots [cache.length, cache.length + T) without advancing cache.length.
        Returns logits [T, V] (or only `logits_rows`) and, with need_aux, the EAGLE-3 features
        [T, len(layers) * hidden]: outputs of the decoder layers `aux_layers` (default: `aux_layer_ids`).
        """
        hidden, aux = self.hidden_states(tokens, positions, cache, tree_mask, need_aux, logits_rows, aux_layers)
        return self.logits(hidden), aux

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [R, H] -> logits [R, V] (softcapped where the model caps them, as transformers:
        divide, tanh, multiply). Split out so a verify pass can skip rows it never reads."""
        logits = self.lm_head(hidden)
        cap = self.spec.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [R, H] -> the greedy token of each row [R]: `argmax(logits(hidden))`, with the LM
        head and the argmax fused where the kernels have that kernel (the logits are never written). Softcapped
        logits take the argmax of the capped values (tanh can merge near values into a tie)."""
        if self.spec.final_logit_softcapping is not None:
            return self.kernels.argmax(self.logits(hidden))
        return self.kernels.greedy(self.lm_head, hidden)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings [T, hidden] as the decoder stack takes them (scaled where the family scales them)."""
        return embed(self.embed, tokens, self.spec.embed_scale)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [R, V] -> the greedy token of each row [R] (torch.argmax's answer)."""
        return self.kernels.argmax(logits)

    @torch.inference_mode()
    def hidden_states(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        tree_mask: torch.Tensor | None = None,
        need_aux: bool = False,
        rows: torch.Tensor | None = None,
        aux_layers: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Like `forward`, but returns the final-normed hidden states [T (or rows), H] instead of logits."""
        h, aux = self.batched_hidden_states([Rows(tokens, positions, cache, tree_mask)], need_aux, aux_layers)
        return (h if rows is None else h[rows]), aux

    @torch.inference_mode()
    def batched_hidden_states(self, batch: list[Rows], need_aux: bool = False,
                              aux_layers: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward over several requests' rows, each `Rows` against its own KV cache (written after its
        cache.length, which does not advance) -> the final-normed hidden states [sum of rows, H] and the features,
        the requests' rows in order. Each request's rows are what `hidden_states` gives it alone: the kernels keep
        every row a function of that row, and attention reads the request's own cache only."""
        if need_aux and aux_layers is None:
            aux_layers = self.aux_layer_ids
        tokens = torch.cat([r.tokens for r in batch]) if len(batch) > 1 else batch[0].tokens
        positions = torch.cat([r.positions for r in batch]) if len(batch) > 1 else batch[0].positions
        x = self.embed_tokens(tokens)  # [T, hidden], a fresh tensor (the kernels may update it in place)
        cos, sin = self.rope.tables(positions)
        parts = [self._part(r) for r in batch]
        local_rope = self.local_rope.tables(positions) if self.local_rope is not None else None
        h, aux = self.kernels.decoder_stack(self._weights, spec=self.spec, x=x, cos=cos, sin=sin, parts=parts,
                                            aux_layers=aux_layers if need_aux else [], local_rope=local_rope)
        # Convert and build refuse non-finite weights, so inf or NaN here is overflow of finite ones (damaged blocks
        # or values of absurd size): no token can be read from it. The check reads H values a row, where the forward
        # did H multiply-adds for every weight.
        if not bool(torch.isfinite(h).all()):
            raise CheckpointError(f"{self.source}: the model's hidden states overflow to inf or NaN (its weights are "
                                  f"finite but of absurd size); it cannot decode: rebuild it from an undamaged model")
        return h, aux

    def _part(self, r: Rows) -> Part:
        """One request's rows as the kernels take them; with sliding-window layers, the slots' positions recorded in
        its cache and the window's mask made from them."""
        t, start = r.tokens.shape[0], r.cache.length
        mask = self._mask(t, start, r.tree_mask)
        if not self.spec.local_layers:
            return Part(r.cache, start, t, mask)
        r.cache.positions[start:start + t] = r.positions
        local = window_mask(mask, r.cache.positions[:start + t], r.positions, self.spec.sliding_window)
        return Part(r.cache, start, t, mask, local)

    @staticmethod
    def _mask(t: int, start: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        """What every layer's attention gets for T new tokens after `start` cached ones: bool [T, start + T], the
        prefix fully visible and the new tokens by the tree mask (causal when None); None for one token."""
        if t == 1:
            return None
        local = tree_mask if tree_mask is not None else torch.ones(t, t, dtype=torch.bool).tril_()
        return torch.cat([torch.ones(t, start, dtype=torch.bool), local], dim=1)
