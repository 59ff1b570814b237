"""The int8-activation layout of block weights (`csrc/int8_blocks.h` states the formula and the layout;
`csrc/int8_pack.cpp` repacks, `csrc/gemm_int8.cpp` computes): each activation row quantized row-locally to int8
blocks, exact integer block dot products, then one fixed fp32 step per block and output, so a many-row call gives the
bits of one-row calls and every ISA (AVX512-VNNI, AVX-VNNI, AVX2) gives the same bits.

The buffer: the header of `block_gemm.pack` (int64 words: magic, in, out, the segment count, then per segment its
ggml type id, rows, bytes per 16-row group and byte offset) under its own magic, then each segment's groups of 16
interleaved output rows, 64-byte aligned. Formats: q8_0, q4_0, q4_1, q5_0, q4_k, q6_k (a Q8_0, Q4_0, Q4_1 or
Q4_K_M GGUF's; q5_0 is Q4_K_M's for input sizes that are not multiples of 256); a weight with a segment in another
format (q5_1, q5_k, float rows) stays on the fp32 block path (`block_gemm`).

    buf = pack(lib, block_weights.quantize(w, "q4_0"))    # eagle_trt_blocks_gemm takes it as it takes pack()'s
"""

from __future__ import annotations

import torch

from eagle_trt.models.block_weights import FORMATS as TYPE_IDS, BlockWeight

MAGIC = 0x3138514250525445  # "ETRPBQ81" little-endian (kInt8Magic in csrc/int8_blocks.h)
FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k")
GROUP = 16  # output rows per group: one 16-lane vector
MAX_SEGMENTS = 4
HEADER_WORDS = 8 + 4 * MAX_SEGMENTS
_ALIGN = 64


def supports(w: BlockWeight) -> bool:
    """Whether every segment of the weight has an int8 path."""
    return all(s.format in FORMATS for s in w.segments)


def pack(lib, w: BlockWeight) -> torch.Tensor:
    """The int8-layout buffer of a block weight (ValueError for a format without an int8 path). The source rows are
    read once; nothing but the buffer is kept."""
    if not supports(w):
        raise ValueError(f"int8 activations take {', '.join(FORMATS)} weights, not {'+'.join(w.formats)}")
    if len(w.segments) > MAX_SEGMENTS:
        raise ValueError(f"a block weight holds at most {MAX_SEGMENTS} segments, got {len(w.segments)}")
    k = w.in_features
    header = [MAGIC, k, w.out_features, len(w.segments), 0, 0, 0, 0]
    offset = HEADER_WORDS * 8
    for s in w.segments:
        offset = (offset + _ALIGN - 1) // _ALIGN * _ALIGN
        group = lib.int8_group_bytes(TYPE_IDS[s.format], k)
        header += [TYPE_IDS[s.format], s.rows, group, offset]
        offset += (s.rows + GROUP - 1) // GROUP * group
    header += [0] * (HEADER_WORDS - len(header))
    buf = torch.zeros(offset, dtype=torch.uint8)
    buf[:HEADER_WORDS * 8] = torch.tensor(header, dtype=torch.int64).view(torch.uint8)
    for i, s in enumerate(w.segments):
        data = s.data.contiguous()
        rc = lib.int8_repack(TYPE_IDS[s.format], data.data_ptr(), s.rows, k, buf.data_ptr() + header[8 + 4 * i + 3])
        if rc != 0:
            raise RuntimeError(f"int8 repack of a {s.format} segment failed (code {rc})")
    return buf


def quantize(lib, x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' activation quantizer on x [M, K] fp32 (for tests): (a int8 [M, K], da fp32 [M, K / block])."""
    x = x.float().contiguous()
    a = torch.empty(x.shape, dtype=torch.int8)
    d = torch.empty(x.shape[0], x.shape[1] // block, dtype=torch.float32)
    rc = lib.int8_quantize(x.data_ptr(), x.shape[0], x.shape[1], block, a.data_ptr(), d.data_ptr())
    if rc != 0:
        raise ValueError(f"cannot quantize {list(x.shape)} in blocks of {block}")
    return a, d
