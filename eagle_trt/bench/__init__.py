"""Benchmarks and tuning: `eagle-trt bench` (methods x prompts, lossless check, report) and `eagle-trt tune`.

    prompts.py   prompt sets (chat, humaneval, .jsonl)
    methods.py   hf, hf-assisted, ar, chain, tree, tree-untuned behind one run() call
    harness.py   the run loop, the losslessness check, aggregation, bench_engine()
    stats.py     pure statistics: summaries, per-repeat speedups, acceptance, interpolation
    roofline.py  bandwidth, weight bytes and forward-cost curves measured on this machine
    report.py    results.json, report.md, the rich table; plots.py: the PNGs
    tune.py      measure costs and acceptance, choose tree settings, store them in the engine
"""
