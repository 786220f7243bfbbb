"""The CUDA backend: the fast path's fixed-shape compiled steps (fast_path.py) recorded in our own CUDA graphs
(graphs.py)."""
