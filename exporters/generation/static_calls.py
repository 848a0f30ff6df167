"""What the model's own ``generate`` passes to its forward calls over a static cache, beyond the step's own
inputs (exporters/generation/static.py reads the calls off ``generate(cache_implementation='static')``):
per-token inputs shaped like ``input_ids`` whose next value a step rule gives (``per_token_extras``), and
inputs passed unchanged to every call (``fixed_inputs``), plain values passed unchanged to every call, which the
step bakes (``fixed_constants``), and inputs of the calls after the prompt's that are one of the prompt call's
outputs (``from_prompt``: Idefics' image_hidden_states, handed back as image_encoder_embeddings)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
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
# (``repeat_last_row``: a [batch, S, k] input whose next value is its last row, Idefics' image_attention_mask)
EXTRA_RULES = ("repeat_last", "ones_column", "same", "repeat_last_row")


def per_token_extras(calls: list[dict[str, Any]]) -> dict[str, str]:
    """The inputs besides the step's own that ``generate`` passes to every forward call as ``[batch, S]``
    tensors shaped like that call's ``input_ids`` (``token_type_ids``), or ``[batch, S, ...]``, each with the first rule of
    ``EXTRA_RULES`` that gives every call's value from the call before (checked on every pair)."""
    ids = [c.get("input_ids") for c in calls]
    names = {k for c in calls for k in c if k not in STEP_INPUTS and k not in STEP_FLAGS}
    extras = {}
    for key in sorted(names):
        values = [c.get(key) for c in calls]
        if not all(isinstance(v, torch.Tensor) and isinstance(i, torch.Tensor) and v.shape[:2] == i.shape
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


@dataclasses.dataclass
class Seen:
    """What ``_forward_arguments`` (static.py) keeps beside the calls, which record a plain value as True: each
    call's plain values (bool, int, float, str) and the tensors it returned, by leaf name."""

    plain: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    outputs: list[dict[str, torch.Tensor]] = dataclasses.field(default_factory=list)
    cache: Any = None  # the cache generate passes (the first call's)
    # its layers of a length of their own: layer -> (key shape, value shape), ``fixed_layers``
    fixed: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = dataclasses.field(default_factory=dict)
    patched: bool = False  # the calls were read under the export's model patches (static.py's _forward_arguments)
    # the cache slots the calls wrote beyond the tokens they fed (``extra_slots``: Git's image positions)
    extra: int = 0

    def note(self, kwargs: dict[str, Any]) -> None:
        self.plain.append({k: v for k, v in kwargs.items() if isinstance(v, (bool, int, float, str))})
        if self.cache is None:
            self.cache = next((kwargs[a] for a in CACHE_ARGS if kwargs.get(a) is not None), None)


def fed_tokens(calls: list[dict[str, Any]]) -> int:
    """The tokens ``calls`` fed: each call's ``input_ids`` (or ``inputs_embeds``) length, summed."""
    tokens = [c["input_ids"] if "input_ids" in c else c.get("inputs_embeds") for c in calls]
    return sum(int(t.shape[1]) for t in tokens if isinstance(t, torch.Tensor) and t.dim() > 1)


def _written(cache: Any) -> list[tuple[int, Any]]:
    from transformers.cache_utils import StaticLayer

    return [(i, layer) for i, layer in enumerate(getattr(cache, "layers", ()))
            if type(layer) is StaticLayer and layer.is_initialized]


def extra_slots(cache: Any, calls: list[dict[str, Any]]) -> int:
    """The slots of the model's own static cache, as its ``generate`` left it after ``calls``, written beyond the
    tokens the calls fed: positions the model writes with no token for them (GIT writes its ``image_patch_tokens``
    image positions ahead of the prompt's text at the prompt's call: 17 in the sweep's tiny config, 24 slots for 7
    ids). Counted on the text's layers, those written with every token the calls fed: the fewest written beyond them
    over the layers written with at least that many (a layer written with fewer holds something else, sized apart:
    ``fixed_layers``). 0 where every text layer holds one slot a token, or where no layer says (no static layer)."""
    fed = fed_tokens(calls)
    beyond = [int(layer.cumulative_length) - fed for _, layer in _written(cache) if int(layer.cumulative_length) >= fed]
    return min(beyond, default=0)


def fixed_layers(cache: Any, calls: list[dict[str, Any]],
                 extra: int = 0) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """The layers of the model's own static cache, as its ``generate`` left it after ``calls``, that its text did not
    write: layer -> (key shape, value shape). A text layer has had every token the calls fed written (its
    ``cumulative_length``), one slot each and the ``extra`` slots the model writes beyond them (``extra_slots``), in a
    layer of generate's ``max_cache_len``; a layer written with another count, and of another length than the text's
    layers, holds something else, sized apart from the text (Mllama's ``_prepare_static_cache`` gives its
    cross-attention layers the image's length: one slot a vision position, written at the prompt's call only). The step
    keeps such a layer at that length (static_layers.py), not ``max_cache_len``. Empty where no layer counts the text's
    tokens (nothing to tell the text's layers by)."""
    written = fed_tokens(calls) + extra
    layers = _written(cache)
    text = {layer.max_cache_len for _, layer in layers if int(layer.cumulative_length) == written}
    if not text:
        return {}
    return {i: (tuple(layer.keys.shape), tuple(layer.values.shape)) for i, layer in layers
            if int(layer.cumulative_length) != written and layer.max_cache_len not in text}


def prompt_handoff(name: str, calls: list[dict[str, Any]], seen: Seen | None,
                   extras: dict[str, str]) -> tuple[dict[str, str], dict[str, Any], dict[str, Any] | None]:
    """``from_prompt`` and ``fixed_constants``, and where the later calls take the prompt's outputs, what the step's
    one-token sizing call (static_layers.py's ``static_cache``) is given: a later call's values of those, its extras' first
    column and the constants (a model that refuses a token without them: Idefics without image features); else None."""
    handed, constants = from_prompt(name, calls, seen), fixed_constants(calls, seen)
    if not handed:
        return handed, constants, None
    return handed, constants, {**{k: calls[1][k] for k in handed}, **{k: calls[1][k][:, :1] for k in extras}, **constants}


def fixed_constants(calls: list[dict[str, Any]], seen: Seen | None) -> dict[str, Any]:
    """The plain values besides the step's own flags that ``generate`` passes to every forward call, the same at
    each (Idefics' interpolate_pos_encoding): the step passes them to the model as constants its trace bakes."""
    if seen is None or len(seen.plain) != len(calls):
        return {}
    first = seen.plain[0]
    return {k: v for k, v in sorted(first.items()) if k not in STEP_INPUTS and k not in STEP_FLAGS
            and all(k in p and type(p[k]) is type(v) and p[k] == v for p in seen.plain[1:])}


def from_prompt(name: str, calls: list[dict[str, Any]], seen: Seen | None) -> dict[str, str]:
    """The inputs ``generate`` passes to every call after the prompt's and not to the prompt's, each equal at every
    such call to one of the prompt call's outputs (Idefics: image_encoder_embeddings, the prompt's
    image_hidden_states): input -> output name. The prompt component returns that output, and the step takes it
    at every call (static_prefill.py). An input of later calls that is none of them is refused by name."""
    if len(calls) < 2:
        return {}
    later = sorted(k for k in calls[1] if k not in calls[0] and k not in STEP_INPUTS and k not in STEP_FLAGS)
    outputs = seen.outputs[0] if seen is not None and len(seen.outputs) == len(calls) else {}
    handed = {}
    for key in later:
        values = [c.get(key) for c in calls[1:]]
        found = next((out for out, t in outputs.items() if out.isidentifier() and out not in ("logits", "past_key_values")
                      and all(isinstance(v, torch.Tensor) and v.shape == t.shape and torch.equal(v, t) for v in values)),
                     None)
        if found is None:
            raise GenerationError(f"{name}.generate passes {key!r} to its forward calls after the prompt's and not to "
                                  "the prompt's, and it is not one of the prompt call's outputs "
                                  f"({sorted(outputs)[:8]}) at every such call: the static form hands later calls "
                                  "only what the prompt call returned")
        handed[key] = found
    return handed


def prompt_extra_slots(model: torch.nn.Module, inputs: Mapping[str, Any], settings: Mapping[str, Any] | None = None) -> int:
    """The cache slots the prompt's call writes beyond the prompt's ids, measured over the model's default cache (its
    own ``generate``, one new token: the prompt's call alone): its written length less the ids (Git: 17 image positions
    ahead of 7 ids, 24 slots). 0 where the cache tells no length (none returned, no ``get_seq_length``) or generate
    fails: where a static cache of a slot a token fails for another reason, that failure stands."""
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return 0
    try:
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=1, min_new_tokens=1, do_sample=False,
                                 return_dict_in_generate=True, **(settings or {}))
        written = out.past_key_values.get_seq_length()
    except Exception:  # noqa: BLE001 - nothing measured: the static cache's own failure is the one reported
        return 0
    return max(int(written) - int(ids.shape[1]), 0)
