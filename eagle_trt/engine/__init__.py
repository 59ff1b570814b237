"""Engine dirs: build one from a converted checkpoint, open and verify one for the runtime.

    >>> from eagle_trt.config import load_config
    >>> from eagle_trt.engine import build_engine, open_engine
    >>> summary = build_engine(load_config("configs/eagle_config.yaml"))  # doctest: +SKIP
    >>> open_engine(summary.engine_dir).draft_dir                        # doctest: +SKIP
    PosixPath('engines/smollm2-135m-eagle3/draft')

torch and transformers are imported only when a build needs them; tensorrt_llm only
inside eagle_trt.engine.trtllm_backend, when a trtllm engine is validated or run.
"""

import importlib

# Imported on first use: opening an engine to run it needs engine_dir alone, not the builder and the TensorRT-LLM
# bundle writers behind it (a start pays only for what it uses).
_WHERE = {
    "BuildSummary": "builder", "build_engine": "builder", "inspect_checkpoint": "checkpoint", "EngineDir": "engine_dir",
    "open_engine": "engine_dir", "Manifest": "manifest", "read_manifest": "manifest", "sha256_file": "manifest",
    "write_manifest": "manifest",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'eagle_trt.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"eagle_trt.engine.{_WHERE[name]}"), name)
