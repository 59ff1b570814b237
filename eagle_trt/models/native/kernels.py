"""The compiled kernels for a model (amx, avx512 or avx2): one compiled call per target forward and per
draft-head forward, every row a function of that row alone, for fp32 and bf16 engines.

    kernels = NativeKernels(native.library(), torch.bfloat16, amx=True)
    proj = kernels.projection(w)                   # packed once for the chosen kernel
    h, aux = kernels.decoder_stack(kernels.target_weights(layers, norm), spec=spec, x=x, cos=cos, sin=sin,
                                   parts=[Part(cache, start, rows, mask)], aux_layers=[1])

A KV cache the kernels cannot write themselves (stored in another dtype than the engine's, such as fp8, or one that
watches its writes) makes that forward run the torch reference loop with these projections and this attention.
"""

from __future__ import annotations

import torch

from eagle_trt.models import reference
from eagle_trt.models.block_weights import BlockWeight
from eagle_trt.models.kernel_api import HeadStack, Kernels, Part, TargetStack
from eagle_trt.models.kv_cache import KVCache
from eagle_trt.models.native import block_gemm, gemm, ops, stack

_DTYPES = (torch.float32, torch.bfloat16)


def _native_cache(cache, dtype) -> bool:
    """Whether the kernels may write this cache themselves: stored in the engine's dtype, and a plain KVCache (a
    subclass that hooks `write`, as FP8 calibration's amax cache does, must see every write)."""
    return cache.k.dtype is dtype and not cache.quantized and type(cache).write is KVCache.write


class NativeKernels:
    row_invariant = True  # every kernel keeps each output row a function of that row alone (csrc/*.cpp)

    def __init__(self, lib, dtype: torch.dtype, amx: bool = False, block_compute: str = "float"):
        if dtype not in _DTYPES:
            raise ValueError(f"the native kernels take float32 or bfloat16, not {dtype}")
        if amx and (dtype is not torch.bfloat16 or lib.isa_name != "amx"):
            raise ValueError("AMX projections need a bf16 engine on a CPU that grants the tiles")
        if block_compute not in block_gemm.COMPUTE:
            raise ValueError(f"block_compute is one of {', '.join(block_gemm.COMPUTE)}, not {block_compute!r}")
        self.lib, self.dtype, self.amx, self.block_compute = lib, dtype, amx, block_compute
        # The projections' kernel gives the name: AMX tiles, else this build's vectors.
        self.name = "amx" if amx else ("avx512" if lib.isa_code >= 2 else "avx2")
        self.attend = ops.Attention(lib)
        self.lm_head_rows = gemm.AMX_ROWS if amx else gemm.SIMD_ROWS
        self.reason = None

    def fitted(self, inputs) -> Kernels:
        """These kernels for projections of these input sizes: AMX only where every one fits its K blocks, else the
        same build's vector kernel. The one place that decides whether a model's projections run on AMX."""
        if self.amx and not all(gemm.amx_fits(k) for k in inputs):
            return NativeKernels(self.lib, self.dtype, amx=False, block_compute=self.block_compute)
        return self

    def projection(self, w):
        """A float weight [in, out] packed for this build's vectors or AMX tiles; a BlockWeight (GGUF blocks, [out, in]
        rows) on the block kernel, whatever the CPU, computing as `block_compute` says."""
        if isinstance(w, BlockWeight):
            return block_gemm.BlockProjection(self.lib, w, self.block_compute)
        return gemm.NativeProjection(self.lib, w, amx=self.amx)

    # ---- the runtime weight cache (models/weight_cache.py) -------------------------------------------------
    @property
    def cache_key(self) -> str:
        """What the packed layouts depend on: the kernel build (its sources, flags and CPU), the dtype, AMX, and the
        block weights' layout (int8 repacks them)."""
        blocks = "-int8" if self.block_compute == "int8" else ""
        return f"{self.name}-{str(self.dtype).removeprefix('torch.')}{blocks}-{self.lib.path.stem}"

    @staticmethod
    def projection_state(proj) -> tuple[torch.Tensor, dict]:
        if proj.kernel == block_gemm.KERNEL:
            return proj.w, {"in": proj.in_features, "out": proj.out_features, "blocks": proj.formats}
        return proj.w, {"in": proj.in_features, "out": proj.out_features, "amx": proj.amx}

    def projection_from_state(self, w: torch.Tensor, meta: dict):
        if "blocks" in meta:
            return block_gemm.BlockProjection.from_packed(self.lib, w, meta["in"], meta["out"])
        return gemm.NativeProjection.from_packed(self.lib, w, meta["in"], meta["out"], meta["amx"])

    # ---- the target -----------------------------------------------------------------------------------------
    def target_weights(self, layers, norm) -> TargetStack:
        return TargetStack(layers, norm, stack.StackWeights(layers, norm))

    def decoder_stack(self, weights: TargetStack, *, spec, x, cos, sin, parts, aux_layers, local_rope=None):
        if not all(_native_cache(p.cache, self.dtype) for p in parts):
            return reference.target_layers(weights.layers, weights.norm, spec, x, cos, sin, parts, aux_layers,
                                           self.attend, local_rope=local_rope)
        return stack.decoder_stack(self.lib, weights.table, spec=spec, x=x.contiguous(), cos=cos, sin=sin,
                                   parts=parts, aux_layers=aux_layers, local_rope=local_rope)

    # ---- the draft head -------------------------------------------------------------------------------------
    def draft_weights(self, head) -> HeadStack:
        try:
            return HeadStack(head, stack.DraftWeights(head))
        except ValueError:  # a head whose LM head (the target's) is packed for another kernel: its layer loop
            return HeadStack(head)

    def draft_layer(self, weights: HeadStack, *, spec, hidden, e, prenorm, cos, sin, parts, last_only):
        if weights.table is None or not all(_native_cache(p.cache, self.dtype) for p in parts):
            return reference.draft_layer(weights.head, spec, hidden, e, prenorm, cos, sin, parts, last_only,
                                         self.attend)
        return stack.draft_layer(self.lib, weights.table, spec=spec, hidden=hidden, e=e, prenorm=prenorm, cos=cos,
                                 sin=sin, parts=parts, last_only=last_only)

    # ---- reading logits -------------------------------------------------------------------------------------
    def greedy(self, lm_head, hidden: torch.Tensor) -> torch.Tensor:
        """argmax(lm_head(hidden)) per row; on AMX the LM head and the argmax fused for up to 16 rows (one pass over
        the weight; past that the plain product takes 32 rows a pass)."""
        if lm_head.amx and hidden.shape[0] <= gemm.ARGMAX_ROWS:
            return lm_head.argmax(hidden)
        return ops.argmax(self.lib, lm_head(hidden))

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return ops.argmax(self.lib, logits)

    def top_logp(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.top_logp(self.lib, logits, k)
