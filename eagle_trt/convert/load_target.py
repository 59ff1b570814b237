"""Load the target model (the big model EAGLE-3 drafts for) from an HF directory or a .gguf file.

    from eagle_trt.convert.load_target import load_target
    model, tokenizer, info = load_target("/tmp/tiny-llama")   # or "SmolLM2-135M-Instruct.Q4_1.gguf"
    print(info.format, info.architecture, info.num_layers)

Everything is loaded in fp32, offline (`local_files_only=True`) and without remote code. Only
safetensors and GGUF are read: a directory with only pickle weights (pytorch_model.bin) is refused,
because unpickling an untrusted file can run arbitrary code. Cheap checks (files present, headers
intact, architecture supported) run before the slow weight load so a bad input fails in a second.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from eagle_trt.architectures import check_config, family_of_type
from eagle_trt.convert.gguf_checks import check_gguf_contents
from eagle_trt.convert.gguf_file import GGUFFile
from eagle_trt.convert.gguf_tokenizer import gguf_bpe_tokenizer, needs_bpe_rebuild
from eagle_trt.errors import CheckpointError, InputError, MissingDependencyError
from eagle_trt.quant_blocks import all_finite
from eagle_trt.safetensors_stream import tensor_locations
from eagle_trt.shards import index_shards

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# At least one of these must exist: tokenizer_config.json alone carries no vocabulary.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class SourceInfo:
    """Where the target came from, recorded in convert.json."""

    path: str
    format: str  # "hf" | "gguf"
    architecture: str  # HF model_type, e.g. "llama"
    num_layers: int
    hidden_size: int
    vocab_size: int

    def to_dict(self) -> dict:
        return asdict(self)


def _check_supported(arch: str, path: Path) -> None:
    family_of_type(arch, path)


def _check_safetensors(path: Path) -> None:
    """Parse the header; safetensors also verifies the data section covers every tensor."""
    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except Exception as e:  # SafetensorError has no stable public import path
        raise CheckpointError(
            f"corrupt or truncated safetensors file {path} ({e}); re-download or re-export the model"
        ) from e


def _check_hf_dir(path: Path) -> str:
    """Validate an HF model dir without loading weights; return its model_type."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(
            f"no config.json in {path}; pass a Hugging Face model directory or a .gguf file"
        )
    try:
        config = json.loads(config_file.read_text())
        model_type = config.get("model_type", "<missing>")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, RecursionError) as e:
        raise CheckpointError(f"unreadable {config_file} ({e}); re-download the model") from e
    _check_supported(model_type, path)
    check_config(config, config_file, family_of_type(model_type, path))

    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES)
        if pickles:
            raise CheckpointError(
                f"{path} has only pickle weights ({', '.join(pickles)}), which eagle-trt never "
                "loads (unpickling can run code); convert them to safetensors first"
            )
        raise CheckpointError(f"no *.safetensors weights in {path}; re-download the model")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        missing = sorted(shard.name for shard in index_shards(index) if not shard.is_file())
        if missing:
            raise CheckpointError(f"missing weight shards in {path}: {', '.join(missing)}")
    for shard in shards:
        _check_safetensors(shard)
    if index.is_file() and not (path / "model.safetensors").is_file():
        tensor_locations(index_shards(index), index)  # no tensor in two shards, each where the index says

    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise CheckpointError(
            f"no tokenizer in {path} (expected one of {', '.join(_TOKENIZER_FILES)}); "
            "copy the tokenizer files of the original model into it"
        )
    return model_type


def _check_gguf(path: Path) -> str:
    """Parse the GGUF header and tensor table (every tensor inside the file, aligned, none overlapping another), check
    its architecture, then its contents (`gguf_checks.py`); return the architecture it declares."""
    gf = GGUFFile.open(path)
    arch = gf.metadata.get("general.architecture", "<missing>")
    _check_supported(arch, path)
    check_gguf_contents(gf)  # a layer count its tensors bear out, finite block scales: before the slow load
    return arch


def _wrap_load_error(what: str, path: Path, e: Exception) -> CheckpointError:
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return CheckpointError(f"could not load the {what} from {path}: {first_line}")


def _source(model_path: str | Path) -> tuple[Path, str, str, dict]:
    """Check MODEL cheaply (files, headers, architecture): (resolved path, "hf" | "gguf", the dir transformers loads
    from, its extra loading arguments)."""
    path = Path(model_path).expanduser().resolve()
    if not path.exists():
        raise InputError(
            f"model path not found: {path}; pass a Hugging Face model directory or a .gguf file"
        )
    if path.is_dir():
        fmt, _ = "hf", _check_hf_dir(path)
        source, extra = str(path), {"use_safetensors": True}
    elif path.is_file() and path.suffix.lower() == ".gguf":
        fmt, _ = "gguf", _check_gguf(path)
        # Imported here: transformers takes seconds to import, and the cheap checks must fail before that.
        from transformers.utils import is_accelerate_available

        if not is_accelerate_available():  # transformers refuses GGUF loading without it
            raise MissingDependencyError(
                f"loading {path} needs the 'accelerate' package; run: pip install accelerate"
            )
        source, extra = str(path.parent), {"gguf_file": path.name}
    else:
        raise InputError(
            f"not a model directory or .gguf file: {path}; pass the directory that holds "
            "config.json and *.safetensors, or a .gguf file"
        )
    return path, fmt, source, extra


def load_tokenizer(model_path: str | Path):
    """The tokenizer of MODEL (HF dir or .gguf) alone, after the same cheap checks as `load_target`."""
    path, fmt, source, extra = _source(model_path)
    return _tokenizer(path, fmt, source, extra)


def _tokenizer(path: Path, fmt: str, source: str, extra: dict):
    # Imported here: transformers takes seconds to import, and the cheap checks must fail before that.
    from transformers import AutoTokenizer

    try:
        tok_extra = {"gguf_file": extra["gguf_file"]} if fmt == "gguf" else {}
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=False, **tok_extra)
        if fmt == "gguf" and needs_bpe_rebuild(path):
            tokenizer = gguf_bpe_tokenizer(path, tokenizer)
    except Exception as e:
        raise _wrap_load_error("tokenizer", path, e) from e
    return with_special_tokens(tokenizer, gguf_special_ids(path)) if fmt == "gguf" else tokenizer


# GGUF metadata keys of the special tokens, and the tokenizer attribute each sets.
_GGUF_SPECIALS = {"tokenizer.ggml.bos_token_id": "bos_token", "tokenizer.ggml.eos_token_id": "eos_token"}


def gguf_special_ids(path: Path) -> dict[str, int]:
    """The bos / eos token ids a GGUF file's own metadata declares ({'bos_token': 1, 'eos_token': 2}); absent
    keys are left out. These are the model's: transformers' GGUF tokenizer conversion (BPE vocabularies) builds
    both tokens from the bos id, so a SmolLM2 GGUF (eos 2, <|im_end|>) would otherwise end on <|im_start|>."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for key, attr in _GGUF_SPECIALS.items():
        field = reader.get_field(key)
        value = field.contents() if field is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[attr] = value
    return out


def with_special_tokens(tokenizer, ids: dict[str, int]):
    """The tokenizer with each named special token set to the token of that id (when the id is in its vocabulary)."""
    for attr, token_id in ids.items():
        if token_id < len(tokenizer) and getattr(tokenizer, f"{attr}_id", None) != token_id:
            setattr(tokenizer, attr, tokenizer.convert_ids_to_tokens(token_id))
    return tokenizer


def check_finite_weights(model, path: Path) -> None:
    """Every loaded (de-quantized) parameter is finite; a CheckpointError names the first that is not."""
    for name, p in model.named_parameters():
        if p.is_floating_point() and not all_finite(p.detach()):
            raise CheckpointError(f"{path}: tensor {name} holds inf or NaN values after loading; the weights are "
                                  "corrupt: re-download or re-export the model")


def load_target(model_path: str | Path):
    """Load MODEL (HF dir or .gguf) as an fp32 causal LM. Returns (model, tokenizer, SourceInfo)."""
    # Imported here: transformers takes seconds to import, and the cheap checks must fail before that.
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    # convert draws its own status lines; transformers' per-tensor bars would interleave with them.
    hf_logging.disable_progress_bar()
    path, fmt, source, extra = _source(model_path)
    common = dict(local_files_only=True, trust_remote_code=False)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **common, **extra)
    except Exception as e:
        raise _wrap_load_error("model", path, e) from e
    tokenizer = _tokenizer(path, fmt, source, extra)

    config = model.config
    _check_supported(config.model_type, path)
    check_config(config.to_dict(), path, family_of_type(config.model_type, path))
    # GGUF loading dequantizes; make sure the saved config says fp32 and carries no quantizer
    # state (modelopt's TTT mask code also calls torch.finfo on config.dtype).
    config.dtype = torch.float32
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model.eval()
    check_finite_weights(model, path)

    info = SourceInfo(
        path=str(path),
        format=fmt,
        architecture=config.model_type,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
    )
    return model, tokenizer, info
