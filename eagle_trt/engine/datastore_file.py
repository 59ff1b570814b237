"""The lookup datastore on disk: draft/datastore.safetensors, one int32 tensor "tokens".

Documents are token id lists joined with -1 between them. The file travels with the draft head:
`eagle-trt convert` writes it from the training sequences (or copies it with --head), `eagle-trt build`
copies it into the engine's draft/ dir (hashed in the manifest like every engine file), and the torch
runtime loads it into a `Datastore` when present.

    write_datastore(path, [[1, 2, 3], [4, 5]])    # tokens = [1, 2, 3, -1, 4, 5]
    store = read_datastore(path, vocab_size=49152)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from eagle_trt.errors import CheckpointError
from eagle_trt.speculative.datastore import SEPARATOR, Datastore

DATASTORE_NAME = "datastore.safetensors"


def write_datastore(path: str | Path, documents: list[list[int]]) -> int:
    """Write the documents atomically (temp file, then rename); returns the token count."""
    from safetensors.torch import save_file

    flat: list[int] = []
    for doc in documents:
        if doc:
            if flat:
                flat.append(SEPARATOR)
            flat.extend(int(t) for t in doc)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file({"tokens": torch.tensor(flat, dtype=torch.int32)}, str(tmp),
                  metadata={"format": "eagle-trt-datastore/1"})
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return sum(1 for t in flat if t != SEPARATOR)


def check_datastore(path: str | Path, vocab_size: int) -> torch.Tensor:
    """The file's tokens, after checking they are a 1-D integer tensor of ids in [-1, vocab_size)."""
    from eagle_trt.models.weights import load_safetensors

    tensors = load_safetensors(Path(path))
    tokens = tensors.get("tokens")
    if tokens is None or tokens.dim() != 1 or tokens.is_floating_point():
        raise CheckpointError(f"{path}: expected one 1-D integer tensor 'tokens' (a lookup datastore)",
                              hint="rebuild it with scripts/make_datastore.py or delete it")
    if tokens.numel() and (int(tokens.min()) < SEPARATOR or int(tokens.max()) >= vocab_size):
        raise CheckpointError(f"{path}: token ids outside [0, {vocab_size}) for this target's vocabulary",
                              hint="the datastore was made with another tokenizer; rebuild or delete it")
    return tokens


def read_datastore(path: str | Path, vocab_size: int) -> Datastore:
    return Datastore(check_datastore(path, vocab_size))
