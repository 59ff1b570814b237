"""`eagle-trt serve`: an OpenAI-compatible HTTP server on an engine.

    wire.py     the OpenAI request and response shapes (pydantic), and its error shape
    stops.py    stop strings across token boundaries (pure)
    worker.py   the engine thread: requests in a bounded queue, decoded one at a time, tokens streamed back
    metrics.py  Prometheus metrics in vLLM's names
    guard.py    the ASGI layer before the app: API key, body bounded as it arrives, drain, catch-all 500
    app.py      the FastAPI app: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics
"""
