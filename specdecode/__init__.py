"""specdecode: lossless speculative decoding for Hugging Face causal LMs.

Layers, each importing only those below it: config and errors; backends (cpu, cuda); the decoding core; model
loading; drafters; the library API (api.py); server, training, benchmark; the command line (cli/)."""
from specdecode.api import SpecDecoder
from specdecode.config import DrafterConfig, GenerationConfig, ModelConfig, SamplingConfig, SpecConfig, Structure
from specdecode.core.engine import Engine
from specdecode.core.sequence import Result
from specdecode.errors import ConfigError, ModelError

__all__ = ["ConfigError", "DrafterConfig", "Engine", "GenerationConfig", "ModelConfig", "ModelError", "Result",
           "SamplingConfig", "SpecConfig", "SpecDecoder", "Structure"]
__version__ = "0.1.0"
