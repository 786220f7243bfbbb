"""The engine's side of serving: one worker thread batches every request's steps (scheduler.py), sizes prompt chunks
(chunk_sizer.py), routes each sequence to its drafter (router.py), caps draft length by measured costs (policy.py,
cost_store.py) and counts (metrics.py). Nothing here knows HTTP."""
