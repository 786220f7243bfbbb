"""Machinery under the decoding core, one folder per device: the CPU's quantized layers, native decoder layers,
few-row kernel and thread sharing (cpu/), the CUDA fast path's compiled steps and graphs (cuda/), and the
attention functions registered with transformers that both use (attention.py). Imports nothing above it."""
