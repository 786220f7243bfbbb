"""A request's way in: its prompts as token ids and its Job (sampling, limits, stops, structure), each check a 400
naming the field; the handlers (app.py) queue what comes out."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specdecode.config import GenerationConfig, SamplingConfig, Structure
from specdecode.core.infill import infill_prompt
from specdecode.core.penalties import check_bias
from specdecode.errors import ConfigError
from specdecode.server.protocol import schemas as s
from specdecode.server.protocol.errors import APIError, bad_request, empty_content, shown
from specdecode.server.protocol.tools import ToolError, ToolUse, template_messages, tool_use
from specdecode.server.scheduling.scheduler import NO_SPECULATION, Job
from specdecode.server.service import Service


def seeded_choices(job: Job, n: int) -> list[Job]:
    """A prompt's n choices: choice j of a seeded request samples with seed + j (wrapping within the seed's
    range), so each is reproducible and they differ; unseeded choices each draw their own."""
    seed = job.sampling.seed
    if seed is None:
        return [job] * n
    return [dataclasses.replace(job, sampling=dataclasses.replace(job.sampling, seed=_wrapped(seed + j)))
            for j in range(n)]


def _wrapped(seed: int) -> int:
    return seed - (1 << 64) if seed >= 1 << 64 else seed


def encode(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest, tools: ToolUse) -> list[list[int]]:
    """The request's prompts as token ids (a chat request has one)."""
    with service.tokenizer_lock:
        if isinstance(req, s.ChatCompletionRequest):
            return [_encode_chat(service, req, tools)]
        if req.suffix:
            return [_encode_infill(service, prompt, req.suffix) for prompt in req.prompts()]
        return [encode_prompt(service, prompt) for prompt in req.prompts()]  # type: ignore[union-attr]


def _encode_infill(service: Service, prompt: str | list[int], suffix: str) -> list[int]:
    """A fill-in-the-middle prompt: the middle between the prompt and the suffix (core/infill.py); an empty prompt
    is a middle at the start of the text."""
    if isinstance(prompt, list):
        _check_ids(service, prompt)
    try:
        return infill_prompt(service.target.tokenizer, service.fim, prompt, suffix)
    except ConfigError as error:
        raise bad_request(str(error), "suffix", "unsupported") from None


def encode_prompt(service: Service, prompt: str | list[int], special: bool = True) -> list[int]:
    """A completion prompt's token ids (special: the tokenizer adds its special tokens to a text, as completions
    do; /tokenize may ask it not to)."""
    if not prompt:
        raise bad_request("the prompt is empty", "prompt", "invalid_value")
    if isinstance(prompt, list):
        _check_ids(service, prompt)
        return list(prompt)
    return [int(i) for i in service.target.tokenizer(prompt, add_special_tokens=special)["input_ids"]]


def _check_ids(service: Service, ids: list[int]) -> None:
    vocab = service.target.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise bad_request(f"prompt token ids must be in [0, {vocab})", "prompt", "invalid_value")


def echo_texts(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest,
            prompts: list[list[int]]) -> list[str]:
    """What leads each prompt's choices: its text under completions' `echo` (token ids are decoded), else ""."""
    if not getattr(req, "echo", False):
        return [""] * len(prompts)
    with service.tokenizer_lock:
        return [prompt if isinstance(prompt, str) else service.target.tokenizer.decode(ids)
                for prompt, ids in zip(req.prompts(), prompts)]  # type: ignore[union-attr]


def _encode_chat(service: Service, req: s.ChatCompletionRequest, tools: ToolUse) -> list[int]:
    tokenizer = service.target.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions", "messages", "no_chat_template")
    for i, m in enumerate(req.messages):
        if m.content is None and m.role != "assistant":
            raise bad_request(f"a {m.role} message needs content", f"messages.{i}.content", "invalid_value")
        if m.content == []:
            raise empty_content(f"messages.{i}.content", "text part")
    # OpenAI's "developer" role is its newer name for "system"; a template that does not know it gets "system"
    developer = "developer" if "developer" in str(tokenizer.chat_template) else "system"
    try:
        messages = template_messages(req.messages, developer)
    except ToolError as error:
        raise bad_request(str(error), error.param, "invalid_value") from None
    own = sorted(set(req.chat_template_kwargs or {}) & s.ChatCompletionRequest.TEMPLATE_OWN)
    if own:
        raise bad_request(f"chat_template_kwargs may not set {own[0]!r}: the request's own fields do",
                          f"chat_template_kwargs.{own[0]}", "invalid_value")
    if req.continue_final_message:
        if req.add_generation_prompt and "add_generation_prompt" in req.model_fields_set:
            raise bad_request("continue_final_message and add_generation_prompt cannot both be true",
                              "continue_final_message", "invalid_value")
        if req.messages[-1].role != "assistant" or not req.messages[-1].text():
            raise bad_request("continue_final_message continues the last message: it must be an assistant's, with "
                              "content", "continue_final_message", "invalid_value")
    try:
        encoded = tokenizer.apply_chat_template(
            messages, tools=tools.tools, tokenize=True, continue_final_message=bool(req.continue_final_message),
            add_generation_prompt=bool(req.add_generation_prompt) and not req.continue_final_message,
            **(req.chat_template_kwargs or {}))
    except Exception as error:  # noqa: BLE001 - a template may reject a conversation (e.g. role order)
        raise bad_request(f"the chat template rejected the messages: {error}", "messages", "invalid_value") from None
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


@dataclass(frozen=True)
class OutputShape:
    """What a request asks of its output beyond text: a structure, logprobs (top-N), and its use of tools."""

    structure: Structure | None
    logprobs: int | None
    tools: ToolUse = ToolUse()


def output_shape(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest) -> OutputShape:
    """The request's structure, compiled once here so that a bad schema, regex or grammar is a 400 naming it."""
    try:
        asked = req.structure()
        logprobs = req.top_logprobs_wanted()
        tools = (tool_use(req, service.tool_format, service.added_tokens)
                 if isinstance(req, s.ChatCompletionRequest) else ToolUse())
    except s.StructureError as error:
        raise bad_request(str(error), error.param, "invalid_structure") from None
    except ToolError as error:
        raise bad_request(str(error), error.param, "invalid_value") from None
    except ValueError as error:
        raise bad_request(str(error), "top_logprobs", "invalid_value") from None
    if asked is not None and tools.structure is not None:
        raise bad_request(f"{asked[0]} and tool_choice both shape the reply; send one of them", "tool_choice",
                          "invalid_value")
    if tools.structure is not None:
        asked = ("tools", tools.structure)
    if asked is None:
        return OutputShape(None, logprobs, tools)
    param, structure = asked
    try:
        service.scheduler.engine.grammars.check(structure)
    except ValueError as error:  # ConfigError, or a grammar front end's own error: the request's text is at fault
        if param == "tools":
            raise _bad_tool(service, req) or bad_request(str(error), param, "invalid_structure") from None
        raise bad_request(str(error), param, "invalid_structure") from None
    return OutputShape(structure, logprobs, tools)


def _bad_tool(service: Service, req: s.ChatCompletionRequest) -> APIError | None:
    """The 400 naming the first tool whose arguments' schema does not compile alone, if one does not."""
    for i, tool in enumerate(req.tools or []):
        try:
            service.scheduler.engine.grammars.check(Structure.json_schema(tool.function.parameters or {}))
        except ValueError as error:
            return bad_request(str(error), f"tools.{i}.function.parameters", "invalid_structure")
    return None


def token_text(service: Service, token: int) -> str:
    with service.tokenizer_lock:
        return service.target.tokenizer.decode([token])


def build_job(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest, prompt_ids: list[int],
         shape: OutputShape) -> Job:
    if not prompt_ids:
        raise bad_request("the prompt is empty", "prompt" if isinstance(req, s.CompletionRequest) else "messages")
    context = service.target.max_positions
    room = context - len(prompt_ids)
    param, max_tokens = "max_tokens", req.max_tokens
    if isinstance(req, s.ChatCompletionRequest) and req.max_completion_tokens is not None:
        if max_tokens is not None and max_tokens != req.max_completion_tokens:
            raise bad_request(f"max_tokens ({max_tokens}) and max_completion_tokens ({req.max_completion_tokens}) "
                              "disagree; send one of them", "max_completion_tokens", "invalid_value")
        param, max_tokens = "max_completion_tokens", req.max_completion_tokens
    echo = isinstance(req, s.CompletionRequest) and bool(req.echo)
    prompt_only = echo and max_tokens == 0  # the prompt scored, nothing generated (an evaluation's loglikelihood)
    if max_tokens is not None and max_tokens <= 0 and not prompt_only:
        with_echo = " (0 only with echo)" if isinstance(req, s.CompletionRequest) else ""  # completions' field
        raise bad_request(f"{param} must be a positive integer{with_echo}, got {max_tokens}", param, "invalid_value")
    if room < 1:
        raise bad_request(f"the prompt ({len(prompt_ids)} tokens) leaves no room in the model's context of {context} "
                          "tokens", "messages" if isinstance(req, s.ChatCompletionRequest) else "prompt",
                          "context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        raise bad_request(f"the prompt ({len(prompt_ids)} tokens) plus {param} ({max_tokens}) exceeds the model's "
                          f"context of {context} tokens", param, "context_length_exceeded")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > 4:
        raise bad_request("at most 4 stop sequences are allowed", "stop", "invalid_value")
    if "" in stop:  # it was dropped without a word; the library refuses it too (GenerationConfig)
        raise bad_request("stop sequences must not be empty strings: an empty one matches everywhere and would end "
                          "every text at once", "stop", "invalid_value")
    stops, kept = tuple(stop), bool(req.include_stop_str_in_output)
    vocab = service.target.vocab_size
    if any(not 0 <= token < vocab for token in req.stop_token_ids or ()):
        raise bad_request(f"stop_token_ids must be token ids in [0, {vocab})", "stop_token_ids", "invalid_value")
    least = req.min_tokens or 0
    if least and shape.structure is not None:  # a grammar may allow only the end before min_tokens
        raise bad_request("min_tokens cannot be combined with a structure or a forced tool call", "min_tokens",
                          "invalid_value")
    most = 1 if prompt_only else max_tokens or min(service.config.default_max_tokens, room)
    if least > most:
        raise bad_request(f"min_tokens ({least}) is more than the tokens the request may generate ({most})",
                          "min_tokens", "invalid_value")
    spec = req.speculation or s.SpeculationOptions()
    drafter = spec.drafter or service.scheduler.router.default
    if drafter not in service.drafters:
        raise bad_request(f"drafter {shown(drafter)} is not served here; choose one of: {', '.join(service.drafters)}",
                          "speculation.drafter", "invalid_value")
    if spec.k == 0:
        drafter = NO_SPECULATION
    try:
        bias = req.bias_pairs()
        check_bias(SamplingConfig(logit_bias=bias), service.scheduler.engine.target.vocab_size)
    except ConfigError as error:
        raise bad_request(str(error), "logit_bias", "invalid_value") from None
    try:
        sampling = SamplingConfig(temperature=1.0 if req.temperature is None else req.temperature,
                                  top_k=req.top_k or 0, top_p=1.0 if req.top_p is None else req.top_p, seed=req.seed,
                                  min_p=req.min_p or 0.0, presence_penalty=req.presence_penalty or 0.0,
                                  frequency_penalty=req.frequency_penalty or 0.0,
                                  repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
                                  logit_bias=bias)
        generation = GenerationConfig(max_new_tokens=most, min_new_tokens=least,
                                      stop_on_eos=not req.ignore_eos, stop_strings=() if kept else stops,
                                      stop_after=shape.tools.stop_after + (stops if kept else ()),
                                      stop_token_ids=tuple(req.stop_token_ids or ()) + _middle_ends(service, req),
                                      structure=shape.structure, logprobs=shape.logprobs, cache_salt=req.cache_salt,
                                      prompt_logprobs=shape.logprobs if echo else None)
    except ConfigError as error:
        raise bad_request(str(error)) from None
    return Job(tuple(prompt_ids), sampling, generation, drafter, spec.k, prompt_only=prompt_only)


def _middle_ends(service: Service, req: s.CompletionRequest | s.ChatCompletionRequest) -> tuple[int, ...]:
    """A filled middle also ends at its format's own end tokens (its pad and file tokens: the model is done)."""
    if isinstance(req, s.CompletionRequest) and req.suffix and service.fim is not None:
        return tuple(sorted(service.fim.ends))
    return ()
