"""Convert a Hugging Face causal LM (HF dir or .gguf) into a checkpoint with an EAGLE-3 draft head.

    from eagle_trt.convert import convert_model
    result = convert_model("/tmp/tiny-llama", "/tmp/tiny-ckpt", steps=0)
"""

from .pipeline import convert_model
from .result import ConvertResult

__all__ = ["ConvertResult", "convert_model"]
