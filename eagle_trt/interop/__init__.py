"""EAGLE-3 heads in other serving engines' layouts: `eagle-trt export` and `convert --head`'s import (docs/interop.md).

    from eagle_trt.interop.export import export_head
    note = export_head(Path("engines/smol"), "vllm", Path("/tmp/smol-vllm"))
"""
