"""The static form of a model whose ``generate`` keeps no cache and feeds the whole sequence at every call
(OpenAIGPT, Mpt): one ``step`` component over the sequence so far, ``input_ids`` ``[batch, S]`` with S
from 1 to ``max_cache_len`` (the longest sequence the loop will feed), returning the last position's
``logits``. Nothing is kept between calls; each call recomputes the sequence, as the model's own
generate does.

Read off the model's own ``generate(cache_implementation='static')`` calls (``rereads_sequence``): every
call's ``input_ids`` must be the previous call's with one token appended, and besides them the calls may
pass only positions (the running count of attended positions, as generate counts them), a mask and
generate's own bookkeeping flags; anything else is refused by name. A cache object generate passes along
is left out: the model re-reads the sequence, so it holds nothing a call needs (the sweep compares the
tokens with eager generate's).

A model whose generate feeds the sequence so far followed by a column of one id it appends at every call, and
inputs filled with one value shaped like that (XLM: mask_token_id, langs filled with lang_id; ``appended_column``,
``filled_inputs``), gets the same step over the plain sequence: the step appends the column and builds the filled
inputs itself, so the loop (and a runner) feeds the tokens only.

A batch of one without padding is the runner form: the step takes ``input_ids`` only and builds the
positions (``0 .. S-1``) and the all-ones mask itself. That is the program ExecuTorch's LLM runner runs
without a KV cache (``use_kv_cache`` False: its ``forward`` has one input, which the runner feeds the
prompt, then the prompt and every token so far; extension/llm/runner/text_decoder_runner.cpp,
text_token_generator.h).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError
from exporters.generation.steps import apply_tensor_rule, derive_prefill_input

# what generate passes besides the model's inputs: flags, and a cache object a model that re-reads the sequence
# does not use (OpenAIGPT is handed one and ignores it)
WHOLE_FLAGS = ("past_key_values", "cache_params", "use_cache", "return_dict", "logits_to_keep", "output_attentions",
               "output_hidden_states", "next_sequence_length", "is_first_iteration")
WHOLE_INPUTS = ("input_ids", "attention_mask", "position_ids")
# how a per-token input shaped like input_ids (token_type_ids) grows by one column a call (steps.py's rules)
EXTRA_RULES = ("append_last", "append_one")


def rereads_sequence(calls: list[dict[str, Any]]) -> bool:
    """Whether every call's ``input_ids`` is the previous call's with one token appended."""
    ids = [c.get("input_ids") for c in calls]
    if len(ids) < 2 or not all(isinstance(i, torch.Tensor) and i.dim() == 2 for i in ids):
        return False
    return all(b.shape[1] == a.shape[1] + 1 and torch.equal(b[:, :-1], a) for a, b in zip(ids, ids[1:]))


def appended_column(calls: list[dict[str, Any]], inputs: Mapping[str, Any]) -> int | None:
    """The id generate appends to the ids at every call, where the first call's ``input_ids`` are the caller's
    with a column of that one id and every later call's end with that column and, without it, re-read the sequence
    (XLM's mask token); else None. Where the tokens generate chose were all that id, the calls also read as a plain
    re-fed sequence (``rereads_sequence``): the caller captures again with the id suppressed."""
    given = inputs.get("input_ids")
    ids = [c.get("input_ids") for c in calls]
    if not isinstance(given, torch.Tensor) or len(ids) < 2 or not all(
            isinstance(i, torch.Tensor) and i.dim() == 2 and i.shape[1] > 1 for i in ids):
        return None
    first = ids[0]
    if first.shape[1] != given.shape[1] + 1 or not torch.equal(first[:, :-1], given):
        return None
    value = first[0, -1]
    if not all(bool((i[:, -1] == value).all()) for i in ids):
        return None
    return int(value) if rereads_sequence([{"input_ids": i[:, :-1]} for i in ids]) else None


def read_appended(name: str, calls: list[dict[str, Any]], inputs: Mapping[str, Any],
                  recapture: Callable[[int], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], int | None]:
    """``calls`` and the id generate appends to the ids at every call (``appended_column``), else None. Where the
    calls read both ways (every token chosen was that id), ``recapture(id)`` captures them again with the id
    suppressed; a capture that still reads both ways, or no longer keeps the column last, is refused."""
    appended = appended_column(calls, inputs)
    if appended is not None and rereads_sequence(calls):
        calls = recapture(appended)
        appended = appended_column(calls, inputs)
        if appended is None or rereads_sequence(calls):
            raise GenerationError(f"{name}.generate appends a column of one id to the ids; with that id suppressed its "
                                  "calls neither keep the column last nor re-feed the plain sequence")
    return calls, appended


def filled_inputs(calls: list[dict[str, Any]]) -> dict[str, int | float]:
    """The inputs besides the ids that every call passes shaped like its ``input_ids`` and filled with one value,
    the same at every call (XLM's langs, filled with lang_id): name -> value."""
    filled: dict[str, int | float] = {}
    for key in sorted({k for c in calls for k in c if k not in WHOLE_INPUTS and k not in WHOLE_FLAGS}):
        values = [c.get(key) for c in calls]
        if not all(isinstance(v, torch.Tensor) and v.shape == c["input_ids"].shape and v.numel() for v, c in zip(values, calls)):
            continue
        one = values[0].reshape(-1)[0]
        if all(v.dtype == values[0].dtype and bool((v == one).all()) for v in values):
            filled[key] = one.item()
    return filled


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Generate's positions: the prefill rule ``positions_from_mask`` (steps.py: the running count of attended
    positions, 0 on padding, which no attended position reads; ``whole_sequence_step_for`` compares the
    attended ones only)."""
    return derive_prefill_input("positions_from_mask", {"attention_mask": mask})


class WholeSequenceStep(torch.nn.Module):
    """``model`` over the whole sequence so far: the last position's logits (module docstring)."""

    use_cache_asked: str | None = None  # why generate was asked for a cache its config turns off (static_step_for)
    same: tuple[str, ...] = ()  # no unchanged caller inputs beside the sequence (static.py's ``same``)

    def __init__(self, model: torch.nn.Module, batch: int, max_len: int, takes_positions: bool, takes_mask: bool,
                 reads_mask: bool, extras: Mapping[str, str] | None = None, appended: int | None = None,
                 filled: Mapping[str, int | float] | None = None):
        """``extras``: the other per-token inputs generate passes (``token_type_ids``), shaped like the call's
        ``input_ids``, each with the rule (``EXTRA_RULES``) by which the next call's value grows; ``appended``: the
        id generate appends to the ids at every call, ``filled``: inputs it fills with one value (module docstring),
        both made inside the step."""
        super().__init__()
        self.appended, self.filled = appended, dict(filled or {})
        self.model, self.batch, self.max_len = model, batch, max_len
        self.takes_positions, self.takes_mask, self.reads_mask = takes_positions, takes_mask, reads_mask
        self.extras = dict(extras or {})
        self.runner_form = batch == 1 and not takes_mask and not self.extras
        self.keeps_last = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.min_len = 1  # raised where the model computes only longer sequences (``shortest_sequence``)

    def input_names(self) -> list[str]:
        if self.runner_form:
            return ["input_ids"]
        return ["input_ids", *(["attention_mask"] if self.takes_mask else []),
                *(["position_ids"] if self.takes_positions else []), *self.extras]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, **extras: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.appended is not None:  # generate's own column after the sequence (XLM's mask token)
            column = torch.full((input_ids.shape[0], 1), self.appended, dtype=input_ids.dtype, device=input_ids.device)
            input_ids = torch.cat([input_ids, column], dim=1)
        kwargs: dict[str, Any] = {"input_ids": input_ids, **{k: extras[k] for k in self.extras},
                                  **{k: torch.full_like(input_ids, v) for k, v in self.filled.items()}}
        if self.runner_form:  # one unpadded row: generate's all-ones mask and its positions 0 .. S-1
            if self.reads_mask:
                attention_mask = torch.ones_like(input_ids)
            if self.takes_positions:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        if self.reads_mask and attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if self.takes_positions and position_ids is not None:
            kwargs["position_ids"] = position_ids
        if self.keeps_last:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs, use_cache=False, return_dict=True)
        return {"logits": out.logits[:, -1, :]}

    def example(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                extras: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        given = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions_from_mask(mask), **(extras or {})}
        return {k: given[k] for k in self.input_names()}

    def dynamic_shapes(self, example: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        seq = torch.export.Dim("S", min=self.min_len, max=self.max_len)
        return {name: {1: seq} for name in example}


def shortest_sequence(exc: BaseException, name: str, max_len: int) -> int | None:
    """The least length torch says the traced step computes, where an export over ``[1, max_len]`` failed only
    because the model needs longer sequences (Blt's byte n-gram hashing guards S >= 3): torch's suggested fix for
    ``name`` names the same maximum and a larger minimum. None otherwise."""
    text = str(exc)
    if "Constraints violated" not in text:
        return None
    found = re.search(rf"{name} = Dim\('{name}', min=(\d+)(?:, max=(\d+))?\)", text)
    if found is None or (found.group(2) is not None and int(found.group(2)) != max_len):
        return None
    least = int(found.group(1))
    return least if 1 < least <= max_len else None


def whole_sequence_step_for(model: torch.nn.Module, calls: list[dict[str, Any]], inputs: Mapping[str, Any],
                            max_len: int, batch: int | None = None, appended: int | None = None) -> WholeSequenceStep:
    """The step of a model whose generate re-reads the sequence (``rereads_sequence(calls)``, or with a column of
    ``appended`` after it: ``appended_column``), checked against every captured call: only tokens, positions
    generate counts from the mask, a mask, flags and (with ``appended``) inputs filled with one value."""
    name = type(model).__name__
    filled = filled_inputs(calls) if appended is not None else {}
    if appended is not None and any(k in c for c in calls for k in ("attention_mask", "position_ids")):
        raise GenerationError(f"{name}.generate appends a column of {appended} to the ids and passes a mask or "
                              "positions over it; the whole-sequence step builds that column for ids only")
    extras = {}
    for key in sorted({k for c in calls for k in c if k not in WHOLE_INPUTS and k not in WHOLE_FLAGS and k not in filled}):
        values = [c.get(key) for c in calls]
        if not all(isinstance(v, torch.Tensor) and v.shape == c["input_ids"].shape for v, c in zip(values, calls)):
            continue
        for rule in EXTRA_RULES:
            if all(torch.equal(apply_tensor_rule(rule, a, c["input_ids"][:, -1]), b)
                   for a, b, c in zip(values, values[1:], calls[1:])):
                extras[key] = rule
                break
    for i, call in enumerate(calls):
        other = sorted(k for k in call if k not in WHOLE_INPUTS and k not in WHOLE_FLAGS and k not in extras
                       and k not in filled)
        if other:
            raise GenerationError(f"{name}.generate re-feeds the whole sequence and passes {other} to forward; the "
                                  f"static step of such a model takes only {WHOLE_INPUTS} and inputs shaped like "
                                  f"input_ids that grow by one of {EXTRA_RULES}")
        ids = call["input_ids"]
        mask = call.get("attention_mask")
        mask = mask if isinstance(mask, torch.Tensor) else torch.ones_like(ids)
        positions = call.get("position_ids")
        attended = mask == 1
        if isinstance(positions, torch.Tensor) and (positions.shape != mask.shape or not torch.equal(
                positions[attended], positions_from_mask(mask)[attended])):
            raise GenerationError(f"{name}.generate's call {i} passes position_ids other than the running count of "
                                  "attended positions; the static step derives them so")
    batch = batch if batch is not None else int(inputs["input_ids"].shape[0])
    mask = inputs.get("attention_mask")
    unpadded = mask is None or bool((mask == 1).all())
    reads_mask = any("attention_mask" in c for c in calls)
    takes_positions = any("position_ids" in c for c in calls)
    return WholeSequenceStep(model, batch, max_len, takes_positions, reads_mask and not (batch == 1 and unpadded),
                             reads_mask, extras, appended, filled).eval()
