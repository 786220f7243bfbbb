"""Model loading: what a name means (names.py, packages.py), a GGUF converted once (gguf.py), the linear
layers' weight formats (formats.py) and packed copies kept in the user cache (packed_cache.py), all put
together by load.py."""
