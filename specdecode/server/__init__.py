"""`specdecode serve`: an OpenAI-compatible HTTP server with batched speculative decoding.

Its folders, lowest first (a folder imports only those below it):
- scheduling/: the engine's side. scheduler.py (one worker thread owns the Engine: continuous batching, failure
  isolation), chunk_sizer.py (prompt chunks beside decoding streams), router.py (per-request drafter choice inside
  one batch), policy.py and cost_store.py (per-step draft length from a measured cost table), metrics.py.
- protocol/: the wire. schemas.py (request/response bodies, validation policy), errors.py (OpenAI-shaped errors),
  bodies.py (bounded reading), replies.py and logprobs.py (response bodies, SSE), tools.py (tool calls),
  as_chat.py (other APIs as a chat request), pages.py (list pages), batch_file.py (the batch file format).
- stores/: what the server keeps between requests: files, batches, kept responses, conversations.
- routes/: the APIs beyond completions: Responses, Messages, Conversations, Files and Batches.
Here: service.py (what `serve` builds, ServeConfig), jobs.py (a request's Job), app.py (the FastAPI app and its
core routes; openapi.py describes them, playground.py serves GET / from static/), connections.py and
background.py (uvicorn that an idle client cannot exhaust), heap.py (a serving process's loaded objects out of the
collector's walk), replicas.py (Ray Serve), batch.py (`specdecode batch`, offline).
"""
