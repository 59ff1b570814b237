"""Open a built engine dir and prove it is the one its manifest describes.

    >>> from eagle_trt.engine import open_engine
    >>> eng = open_engine("engines/smollm2-135m-eagle3")        # doctest: +SKIP
    >>> eng.config.draft_length, eng.manifest.target.vocab_size  # doctest: +SKIP
    (6, 49152)
    >>> eng.draft_dir / "model.safetensors"                      # doctest: +SKIP
    PosixPath('engines/smollm2-135m-eagle3/draft/model.safetensors')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagle_trt.config import EagleConfig, load_config
from eagle_trt.engine.manifest import MANIFEST_NAME, Manifest, read_manifest, sha256_file
from eagle_trt import private_cache
from eagle_trt.private_cache import WeightSource
from eagle_trt.engine import verified
from eagle_trt.errors import CheckpointError, EngineIntegrityError

REQUIRED_FILES = (
    "eagle_config.yaml",
    "target/config.json",
    ("target/model.safetensors", "target/model.safetensors.index.json"),  # one file, or shards and their index
    "draft/config.json",
    "draft/model.safetensors",
)
# A trtllm engine holds either the LLM-API bundle (EAGLE-3) or the legacy checkpoint (EAGLE-1/2).
TRTLLM_REQUIRED = (("extra_llm_api_options.yaml", "serve.sh"), ("legacy_trt/config.json", "legacy_trt/trtllm_build.sh"))
# Files a runtime could load as weights: one the manifest does not list was put there by hand.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".engine", ".onnx", ".npz")
_HINT = "rebuild the engine with `eagle-trt build`"


@dataclass(frozen=True)
class EngineDir:
    """A verified engine dir. Paths are under root; manifest and config are parsed."""

    root: Path
    manifest: Manifest
    config: EagleConfig
    # Files (manifest paths) found holding their manifest bytes when opened, with their stamps then; empty when
    # opened without verify.
    checked: dict = field(default_factory=dict)

    @property
    def target_dir(self) -> Path:
        return self.root / "target"

    @property
    def draft_dir(self) -> Path:
        return self.root / "draft"

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    def weight_source(self, sub: str) -> WeightSource:
        """What the runtime weight cache needs to know of the model in `sub` ("target", "draft"): each file's sha256
        from the manifest and the stamps of those proven to hold it."""
        prefix = f"{sub}/"
        hashes = {rel[len(prefix):]: e.sha256 for rel, e in self.manifest.files.items() if rel.startswith(prefix)}
        checked = {rel[len(prefix):]: s for rel, s in self.checked.items() if rel.startswith(prefix)}
        return WeightSource(self.root / sub, hashes, checked, owner=self.root)


def open_engine(path: str | Path, verify: bool = True, rehash: bool = False, just_written: bool = False) -> EngineDir:
    """Check path against its manifest and return an EngineDir.

    Always: manifest parses, required and listed files exist with the recorded sizes, no unlisted
    weight files. verify=True also hashes every file this machine has not hashed since it was last written
    (`verified.py`); rehash=True hashes every file. just_written: this process wrote the files moments ago (`build`)
    and nobody else has had them, so a stamp younger than the timestamps' granularity still proves them unchanged.
    """
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"engine dir '{root}' not found", hint="build one with `eagle-trt build`")
    if not root.is_dir():
        raise CheckpointError(f"engine path '{root}' is not a directory")
    manifest = read_manifest(root)
    for rel in REQUIRED_FILES:
        choices = (rel,) if isinstance(rel, str) else rel
        if not any(r in manifest.files for r in choices):
            raise EngineIntegrityError(f"'{root / MANIFEST_NAME}' does not list required file "
                                       f"'{' or '.join(choices)}'", hint=_HINT)
    if manifest.backend == "trtllm" and not any(all(r in manifest.files for r in group) for group in TRTLLM_REQUIRED):
        raise EngineIntegrityError(
            f"'{root / MANIFEST_NAME}' lists no TensorRT-LLM bundle ({' + '.join(TRTLLM_REQUIRED[0])})", hint=_HINT
        )
    for rel, entry in manifest.files.items():
        file = root / rel
        if not file.is_file():
            raise EngineIntegrityError(f"engine file '{file}' is missing (listed in {MANIFEST_NAME})", hint=_HINT)
        size = file.stat().st_size
        if size != entry.bytes:
            raise EngineIntegrityError(
                f"engine file '{file}' has {size} bytes, {MANIFEST_NAME} says {entry.bytes} "
                "(truncated or replaced)",
                hint=_HINT,
            )
    for file in sorted(root.rglob("*")):
        rel = file.relative_to(root).as_posix()
        if file.is_file() and file.suffix in WEIGHT_SUFFIXES and rel not in manifest.files:
            raise EngineIntegrityError(f"engine dir '{root}' has a weight file not in {MANIFEST_NAME}: '{rel}'", hint=_HINT)
    checked = _verify(root, manifest, rehash, just_written) if verify else {}
    return EngineDir(root=root, manifest=manifest, config=load_config(root / "eagle_config.yaml"), checked=checked)


def _verify(root: Path, manifest: Manifest, rehash: bool, just_written: bool) -> dict[str, list[int]]:
    """Hash every listed file (sizes matched, so this is the slow, definitive check: any flipped byte shows here),
    except one this machine hashed before and no write has touched since (`verified.py`). Returns the stamp of each
    file proven to hold its manifest bytes, which stays valid while the stamp does: only bytes proven this way are
    made into a stored runtime layout (`models/weight_cache.py`)."""
    seen = {} if rehash else verified.load(root)
    checked: dict[str, list[int]] = {}
    for rel, entry in manifest.files.items():
        file = root / rel
        stamp = verified.unchanged(seen, file, entry.sha256)
        if stamp is None:
            before = private_cache.stamp(file)
            digest = sha256_file(file)
            if digest != entry.sha256:
                raise EngineIntegrityError(
                    f"engine file '{file}' does not match its sha256 in {MANIFEST_NAME} "
                    f"({digest[:12]}... != {entry.sha256[:12]}...): modified after the build",
                    hint=_HINT,
                )
            after = private_cache.stamp(file)
            stamp = after if after == before else None  # written while hashed: the digest proves no one state
            if stamp is not None:
                verified.record(seen, file, digest, stamp)
        if stamp is not None and (just_written or verified.settled(stamp)):
            checked[rel] = stamp
    verified.save(root, seen)
    return checked
