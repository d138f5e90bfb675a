"""goodspeed engine: `from engine import LLM, SamplingParams`.

Imports are lazy so that the pure-Python core (scheduler, block manager, requests, policies)
can be imported without torch.
"""

from engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "EngineConfig"]


def __getattr__(name: str):
    if name == "LLM":
        from engine.front.llm import LLM

        return LLM
    if name == "EngineConfig":
        from engine.config import EngineConfig

        return EngineConfig
    raise AttributeError(name)
