"""Preallocated KV cache indexed by slot; rejection costs nothing (the length simply does not advance).

Layout per layer: k, v: [L, Hkv, capacity, D]. Slots [0, length) hold committed tokens; a verify pass
writes the tree after them, and `compact` moves the accepted path's entries down to the front.
With dtype fp8 the entries are stored as float8_e4m3fn divided by a per-layer scale (K and V apart)
and scaled back on read. Any other storage dtype may differ from the compute dtype too: entries are cast on write
and cast back on read, so every (weights, cache) pair of dtypes runs.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def resolve_kv_dtype(name: str, compute_dtype: torch.dtype) -> torch.dtype:
    return {
        "auto": compute_dtype,
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "fp8": FP8,
    }[name]


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        compute_dtype: torch.dtype,
        k_scales: torch.Tensor | None = None,
        v_scales: torch.Tensor | None = None,
        device: torch.device | str = "cpu",
    ):
        shape = (num_layers, num_kv_heads, capacity, head_dim)
        # Uninitialised: a slot is always written before any forward reads it (reads stop at the slots in use), and
        # untouched pages of a long context's cache cost no memory.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        # The position each slot holds (a tree's slots hold its nodes' positions until compact moves the accepted
        # ones down): what a sliding-window layer's mask is made from (layers.window_mask).
        self.positions = torch.zeros(capacity, dtype=torch.long)
        self.capacity = capacity
        self.length = 0  # committed slots
        self.compute_dtype = compute_dtype
        self.quantized = dtype == FP8
        ones = torch.ones(num_layers)
        self.k_scales = (k_scales if k_scales is not None else ones).float().tolist()
        self.v_scales = (v_scales if v_scales is not None else ones).float().tolist()

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [Hkv, T, D] written to slots [start, start+T)."""
        end = start + k.shape[1]
        if end > self.capacity:
            raise RuntimeError(f"KV cache full: need {end} slots, capacity {self.capacity}")
        if self.quantized:
            k = (k.float() / self.k_scales[layer]).clamp(-FP8_MAX, FP8_MAX)
            v = (v.float() / self.v_scales[layer]).clamp(-FP8_MAX, FP8_MAX)
        self.k[layer, :, start:end] = k.to(self.k.dtype)
        self.v[layer, :, start:end] = v.to(self.v.dtype)

    def read(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Entries of slots [0, end) as [Hkv, end, D] in the compute dtype."""
        k, v = self.k[layer, :, :end], self.v[layer, :, :end]
        if self.quantized:
            return (
                k.to(self.compute_dtype) * self.k_scales[layer],
                v.to(self.compute_dtype) * self.v_scales[layer],
            )
        if k.dtype != self.compute_dtype:  # a cache stored in another dtype: rounded on write, widened here
            return k.to(self.compute_dtype), v.to(self.compute_dtype)
        return k, v

    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Move slots start+keep[i] to start+i for every layer (keep: [n], ascending tree indices)."""
        idx = keep.tolist()
        first = next((i for i, j in enumerate(idx) if j != i), len(idx))  # entries before it are in place already
        if first == len(idx):
            return
        src = start + keep[first:]
        dst = slice(start + first, start + len(idx))
        # Advanced indexing copies before the write, so overlapping ranges are safe.
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]
        self.positions[dst] = self.positions[src]
