"""``python -m neural_arch.serve --model DIR``: a TabGPT folder behind an HTTP endpoint.

``POST /predict`` takes JSON rows and answers predictions, every request's rows run through the
``DynamicBatcher`` with those of concurrent requests; ``GET /health`` describes the model and
its columns. The server library (Starlette on uvicorn) is the ``serve`` extra: ``pip install
"neural-arch[serve]"``. Only ``app`` and ``cli`` import it, so ``rows`` and ``predictor`` (the
request format and the model behind it) load without it.
"""
