"""Weight-only quantized linear layers for decoding on the CPU: formats, packing and the native kernel."""
