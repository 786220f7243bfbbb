"""`specdecode serve`: an OpenAI-compatible HTTP server with batched speculative decoding.

schemas.py (request/response bodies, validation policy) -> app.py (routes, SSE; jobs.py turns a request into the Job
it queues, openapi.py describes the routes) -> scheduler.py (one worker
thread owns the Engine: continuous batching, failure isolation) -> router.py (per-request drafter choice inside
one batch) and policy.py (per-step draft length from a measured cost table); metrics.py (Prometheus); playground.py
(GET /: a static page over the API, from static/).
"""
