"""eagle-trt: lossless EAGLE-3 speculative decoding.

    eagle-trt convert model.gguf --output checkpoints/smollm2
    eagle-trt build --config configs/eagle_config.yaml
    eagle-trt run --engine engines/smollm2 --prompt "Write a haiku about the sea"
"""

__version__ = "0.1.0"
