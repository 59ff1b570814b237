"""Engine dirs: build one from a converted checkpoint, open and verify one for the runtime.

    >>> from eagle_trt.config import load_config
    >>> from eagle_trt.engine import build_engine, open_engine
    >>> summary = build_engine(load_config("configs/eagle_config.yaml"))  # doctest: +SKIP
    >>> open_engine(summary.engine_dir).draft_dir                        # doctest: +SKIP
    PosixPath('engines/smollm2-135m-eagle3/draft')

torch and safetensors are imported only when a build or a hash needs them; tensorrt_llm only
inside eagle_trt.engine.trtllm_backend, when a trtllm engine is validated or run.
"""

from eagle_trt.engine.builder import BuildSummary, build_engine
from eagle_trt.engine.checkpoint import inspect_checkpoint
from eagle_trt.engine.engine_dir import EngineDir, open_engine
from eagle_trt.engine.manifest import Manifest, read_manifest, sha256_file, write_manifest

__all__ = [
    "BuildSummary",
    "EngineDir",
    "Manifest",
    "build_engine",
    "inspect_checkpoint",
    "open_engine",
    "read_manifest",
    "sha256_file",
    "write_manifest",
]
