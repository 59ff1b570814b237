"""A GGUF target's own quantized blocks, kept beside the de-quantized checkpoint: `convert` of a .gguf writes
target/gguf_blocks.safetensors (every projection and the LM head as the file's blocks, uint8 rows in HF order,
`convert/gguf_blocks.py`) and target/gguf_blocks.json (each one's format and [out, in] shape). The float weights stay
as they were (what transformers, the head training and the checks read); `build` with `weights: auto` puts these
blocks in the engine instead of them, byte for byte, so the engine computes with the model llama.cpp computes with.

    table = keep_blocks(Path("model.Q4_K_M.gguf"), checkpoint / "target")   # {name: {"format", "shape"}}
"""

from __future__ import annotations

from pathlib import Path

from eagle_trt.convert.gguf_blocks import read_blocks
from eagle_trt.engine.weight_blocks import is_projection
from eagle_trt.models.block_weights import (
    FORMATS, KEPT_FILE, KEPT_TABLE, block_elems, write_table,
)


def keep_blocks(gguf_path: Path, target_dir: Path) -> dict[str, dict]:
    """Write the kept blocks of the GGUF at gguf_path into target_dir; returns their table. A projection in a format
    the block kernels do not take, or whose rows are not whole blocks, is left out (it runs from the float weights
    then: `build` keeps it float only if every part of its fused projection is)."""
    from safetensors.torch import save_file

    blocks = read_blocks(gguf_path)
    kept, table = {}, {}
    for name, qt in sorted(blocks.items()):
        if not is_projection(name) or len(qt.shape) != 2 or qt.format not in FORMATS:
            continue
        if qt.shape[1] % block_elems(qt.format):
            continue
        kept[name] = qt.data.contiguous().clone()  # the map of the file is copy-on-write: save a plain tensor
        table[name] = {"format": qt.format, "shape": list(qt.shape)}
    if kept:
        save_file(kept, str(target_dir / KEPT_FILE), metadata={"format": "pt"})
        (target_dir / KEPT_FILE).chmod(0o644)
        write_table(target_dir, table, name=KEPT_TABLE)
    return table
