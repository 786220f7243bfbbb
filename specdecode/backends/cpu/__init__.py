"""The CPU backend: packed 4/8-bit linear layers and decoder layers in native code (kernels.c, layers.c,
reached through native.py), torch's int8 kernel where those cannot run, the few-row matrix kernel, and how
many threads a pass may use on a shared machine."""
