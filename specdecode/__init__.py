"""specdecode: lossless speculative decoding for Hugging Face causal LMs."""
from .api import SpecDecoder
from .config import ConfigError, GenerationConfig, SamplingConfig, SpecConfig
from .engine import Engine, Result

__all__ = ["ConfigError", "Engine", "GenerationConfig", "Result", "SamplingConfig", "SpecConfig", "SpecDecoder"]
__version__ = "0.1.0"
