"""Offline API: `LLM(model=...).generate(prompts, params) -> list[RequestOutput]`.

Prompts may be strings, token-id lists, or lists of either. The result holds one complete
RequestOutput per prompt (and per choice when n > 1: ordered by prompt, then index), with all
token ids, text, logprobs and the finish reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(
        self, model: str | None = None, config: EngineConfig | None = None, **flat: Any
    ) -> None:
        config = config or EngineConfig()
        if model is not None:
            flat["model"] = model
        if flat:
            config = config.replace(**flat)
        self.engine = LLMEngine.from_config(config)
        self._counter = 0

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.engine.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass token ids instead of text")
            return self.engine.tokenizer.encode(prompt)
        return list(prompt)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        on_output: Callable[[RequestOutput], None] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params_list = _broadcast(params, len(prompts))
        order: list[str] = []
        for prompt, sp in zip(prompts, params_list):
            request_id = f"offline-{self._counter}"
            self._counter += 1
            final_only = on_output is None  # nobody watches the steps: one output each
            self.engine.add_request(request_id, self.encode(prompt), sp, final_only=final_only)
            order.extend([request_id] if sp.n == 1 else [f"{request_id}-{i}" for i in range(sp.n)])
        finals = self._run(len(order), use_tqdm, on_output)
        return [finals[request_id] for request_id in order]

    def chat(
        self, messages: list[dict[str, str]], params: SamplingParams | None = None, **kw: Any
    ) -> list[RequestOutput]:
        if self.engine.tokenizer is None:
            raise ValueError("this model has no tokenizer, so it has no chat template")
        return self.generate([self.engine.tokenizer.apply_chat_template(messages)], params, **kw)

    def _run(self, total: int, use_tqdm: bool, on_output) -> dict[str, RequestOutput]:
        finals: dict[str, RequestOutput] = {}
        logprobs: dict[str, list] = {}
        bar = tqdm(total=total, desc="generate", unit="req", disable=not use_tqdm)
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if on_output is not None:
                    on_output(output)
                if output.logprobs:
                    logprobs.setdefault(output.request_id, []).extend(output.logprobs)
                if output.prompt_logprobs is not None:
                    logprobs.setdefault(output.request_id + "#prompt", output.prompt_logprobs)
                if output.finished:
                    output.logprobs = (
                        logprobs.pop(output.request_id, None)
                        if output.logprobs is not None
                        else None
                    )
                    output.prompt_logprobs = logprobs.pop(output.request_id + "#prompt", None)
                    output.new_token_ids = list(output.output_token_ids)
                    output.new_text = output.text
                    finals[output.request_id] = output
                    bar.update(1)
        bar.close()
        return finals


def _broadcast(
    params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    if len(params) != count:
        raise ValueError(f"got {len(params)} SamplingParams for {count} prompts")
    return list(params)
