"""What the model's own ``generate`` passes to its forward calls over a static cache, beyond the step's own
inputs (exporters/generation/static.py reads the calls off ``generate(cache_implementation='static')``):
per-token inputs shaped like ``input_ids`` whose next value a step rule gives (``per_token_extras``), and
inputs passed unchanged to every call (``fixed_inputs``)."""

from __future__ import annotations

from typing import Any

import torch

from exporters.generation.capture import GenerationError
from exporters.generation.steps import apply_tensor_rule

STEP_INPUTS = ("input_ids", "cache_position", "position_ids", "attention_mask")
# flags generate passes to forward that the step sets itself
# the names a model's forward takes its cache by: past_key_values, or cache_params (state-space models)
CACHE_ARGS = ("past_key_values", "cache_params")
STEP_FLAGS = (*CACHE_ARGS, "use_cache", "return_dict", "logits_to_keep", "output_attentions",
              "output_hidden_states")


def fixed_inputs(calls: list[dict[str, Any]]) -> list[str]:
    """The tensors besides the step's own that ``generate`` passes to every forward call with one value."""
    first = calls[0]
    return sorted(k for k, v in first.items() if k not in STEP_INPUTS and k not in STEP_FLAGS
                  and isinstance(v, torch.Tensor)
                  and all(isinstance(c.get(k), torch.Tensor) and c[k].shape == v.shape and torch.equal(c[k], v)
                          for c in calls[1:]))


# how a per-token extra's next value follows from the last one (exporters/generation/steps.py's rules)
EXTRA_RULES = ("repeat_last", "ones_column", "same")


def per_token_extras(calls: list[dict[str, Any]]) -> dict[str, str]:
    """The inputs besides the step's own that ``generate`` passes to every forward call as ``[batch, S]``
    tensors shaped like that call's ``input_ids`` (``token_type_ids``), each with the first rule of
    ``EXTRA_RULES`` that gives every call's value from the call before (checked on every pair)."""
    ids = [c.get("input_ids") for c in calls]
    names = {k for c in calls for k in c if k not in STEP_INPUTS and k not in STEP_FLAGS}
    extras = {}
    for key in sorted(names):
        values = [c.get(key) for c in calls]
        if not all(isinstance(v, torch.Tensor) and isinstance(i, torch.Tensor) and v.shape == i.shape
                   for v, i in zip(values, ids)):
            continue
        for rule in EXTRA_RULES:
            if all(_rule_gives(rule, a, b) for a, b in zip(values, values[1:])):
                extras[key] = rule
                break
    return extras


def _rule_gives(rule: str, previous: torch.Tensor, current: torch.Tensor) -> bool:
    try:
        got = apply_tensor_rule(rule, previous, previous[..., -1])
    except (GenerationError, IndexError, RuntimeError):
        return False
    return got.shape == current.shape and torch.equal(got, current)
