"""Per-token inputs that a multimodal model's ``generate`` passes to the prompt call only, and that its forward
reads beyond the embeddings: the static step over embeddings takes them at every call.

Molmo2's ``mm_token_type_ids`` ([batch, S], 1 at image tokens) makes the prompt's image tokens attend to each
other (a block mask over positions, ``block_sequence_ids``: models/molmo2/modeling_molmo2.py:872-876), and its
``prepare_inputs_for_generation`` passes it to the first call only (lines 1048-1052). The embed component reads it
with the prompt, but it does not reach the mask through the embeddings: a step without it gives the prompt a plain
causal mask, and the logits differ from the first one on.

An input is taken (``read_beyond_embeddings``) where the model's forward over the embed component's outputs gives
other prompt logits with it than without. The step then needs a value for it at each new token, where ``generate``
passes none: the first rule of ``DECODE_RULES`` (exporters/generation/steps.py) under which ``generate`` over the
step's own cache computes the same logits, bit for bit, as without it (``decode_rule``). Molmo2 reads the block ids
at the query's position, past the new token's own: any value adds nothing there. A model whose new-token logits
every rule changes is refused, naming the input: nothing is guessed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError, forward_wrapped
from exporters.generation.steps import apply_tensor_rule

# per-token rules for a new token's value ([batch, 1]), tried in this order
DECODE_RULES = ("repeat_last", "ones_column")
CHECKED_TOKENS = 3


def prompt_token_candidates(model: torch.nn.Module, first_call: Mapping[str, Any], prompt_only: list[str]) -> list[str]:
    """The prompt-only inputs shaped like the prompt's ``input_ids`` that the model's forward takes by name."""
    ids = first_call.get("input_ids")
    takes = inspect.signature(model.forward).parameters
    return [k for k in prompt_only if k in takes and isinstance(first_call.get(k), torch.Tensor)
            and isinstance(ids, torch.Tensor) and first_call[k].shape == ids.shape]


def read_beyond_embeddings(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], embedded: Mapping[str, torch.Tensor],
                           candidates: list[str]) -> list[str]:
    """The candidates with which the forward over the embed component's outputs (and the caller's mask) gives
    other logits than without: the prompt call reads them beyond the embeddings."""
    base = {"inputs_embeds": embedded["inputs_embeds"], "use_cache": False}
    if isinstance(embedded.get("position_ids"), torch.Tensor):
        base["position_ids"] = embedded["position_ids"]
    if isinstance(inputs.get("attention_mask"), torch.Tensor):
        base["attention_mask"] = inputs["attention_mask"]
    read = []
    with torch.no_grad():
        try:
            without = model(**base).logits
        except Exception:  # noqa: BLE001 - the forward takes no embeddings alone: the step's checks say why
            return []
        for name in candidates:
            try:
                given = model(**base, **{name: inputs[name]}).logits
            except Exception:  # noqa: BLE001 - not readable beside the embeddings: left to the embed component
                continue
            if given.shape != without.shape or not torch.equal(given, without):
                read.append(name)
    return read


def decode_rule(model: torch.nn.Module, inputs: Mapping[str, Any], name: str, step_cache: Callable[[], Any]) -> str:
    """The first of ``DECODE_RULES`` whose value at each new token leaves generate's logits as they are without
    ``name`` there; ``step_cache()`` makes the step's own cache (a fresh one per run)."""

    def logits(rule: str | None) -> tuple[torch.Tensor, ...]:
        last: dict[str, torch.Tensor] = {}

        def around(forward, args, kwargs):
            if rule is not None:
                if kwargs.get(name) is not None:  # the prompt call: generate's own value, the rule's start
                    last["value"] = kwargs[name]
                elif "value" in last:
                    last["value"] = apply_tensor_rule(rule, last["value"], last["value"][..., -1])
                    kwargs = {**kwargs, name: last["value"]}
            return forward(*args, **kwargs)

        with forward_wrapped(model, around), torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=CHECKED_TOKENS, min_new_tokens=CHECKED_TOKENS, do_sample=False,
                                 past_key_values=step_cache(), return_dict_in_generate=True, output_logits=True)
        return tuple(out.logits)

    want = logits(None)
    for rule in DECODE_RULES:
        got = logits(rule)
        if len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want)):
            return rule
    raise GenerationError(f"{type(model).__name__}'s prompt call reads {name!r} beyond the embeddings, which its generate "
                          f"passes to no later call, and each value the static step could give a new token ({DECODE_RULES}) "
                          "changes the new token's logits")
