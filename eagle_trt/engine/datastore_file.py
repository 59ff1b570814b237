"""The lookup datastore on disk: draft/datastore.safetensors, an int32 tensor "tokens", and in an engine its index.

Documents are token id lists joined with -1 between them. The file travels with the draft head:
`eagle-trt convert` writes it from the training sequences (or copies it with --head); `eagle-trt build` writes
it into the engine's draft/ dir with the n-gram index the runtime searches (sorted hashes and positions per n,
`Datastore.index_tensors`), so opening an engine sorts nothing; the torch runtime loads it into a `Datastore`.

    write_datastore(path, [[1, 2, 3], [4, 5]])    # tokens = [1, 2, 3, -1, 4, 5]
    write_indexed(src, engine_path, vocab_size)   # tokens + index, for an engine
    store = read_datastore(path, vocab_size=49152)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle_trt.errors import CheckpointError
from eagle_trt.models.weights import load_safetensors
from eagle_trt.speculative.datastore import NGRAMS, SEPARATOR, Datastore

DATASTORE_NAME = "datastore.safetensors"


def write_datastore(path: str | Path, documents: list[list[int]]) -> int:
    """Write the documents atomically (temp file, then rename); returns the token count."""
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
    tensors = load_safetensors(Path(path))
    tokens = tensors.get("tokens")
    if tokens is None or tokens.dim() != 1 or tokens.is_floating_point():
        raise CheckpointError(f"{path}: expected one 1-D integer tensor 'tokens' (a lookup datastore)",
                              hint="rebuild it with scripts/make_datastore.py or delete it")
    if tokens.numel() and (int(tokens.min()) < SEPARATOR or int(tokens.max()) >= vocab_size):
        raise CheckpointError(f"{path}: token ids outside [0, {vocab_size}) for this target's vocabulary",
                              hint="the datastore was made with another tokenizer; rebuild or delete it")
    return tokens


INDEXED_FORMAT = "eagle-trt-datastore/2"


def write_indexed(src: str | Path, dst: str | Path, vocab_size: int) -> None:
    """The datastore at `src` with its index built, written to `dst` (an engine's copy)."""
    tokens = check_datastore(src, vocab_size)
    store = Datastore(tokens)
    save_file({"tokens": tokens.to(torch.int32).contiguous(), **store.index_tensors()}, str(dst),
              metadata={"format": INDEXED_FORMAT, "ngrams": ",".join(map(str, store.ngrams))})
    Path(dst).chmod(0o644)


def read_datastore(path: str | Path, vocab_size: int) -> Datastore:
    """The datastore, with the index the file holds when it was written for these n-grams (an engine's), else
    built here."""
    tokens = check_datastore(path, vocab_size)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        names = set(f.keys())
        ngrams = tuple(int(n) for n in meta.get("ngrams", "").split(",") if n.strip().isdigit())
        if meta.get("format") != INDEXED_FORMAT or tuple(sorted(ngrams, reverse=True)) != NGRAMS:
            return Datastore(tokens)  # a head's plain copy, or an index for other n-grams than the runtime's
        index = {name: f.get_tensor(name) for name in names if name != "tokens"}
    if any(index[k].dim() != 1 or index[k].is_floating_point() for k in index) or any(
            index.get(f"keys.{n}", torch.zeros(0)).shape != index.get(f"ends.{n}", torch.zeros(1)).shape
            for n in ngrams):
        raise CheckpointError(f"{path}: a damaged datastore index", hint="rebuild the engine with `eagle-trt build`")
    return Datastore.from_tensors(tokens, index, ngrams)
