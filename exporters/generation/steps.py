"""How each input of a decode step follows from the call before it, read off the calls ``generate``
made, and checked on every pair of them: the generator replays these rules with the artifacts only.

Rules (``RULES``), tried in this order for each input of the decode step:
- ``outputs``: a tree (the cache, a recurrent state) is the previous call's output of the same name;
- ``token``: ``input_ids`` / ``decoder_input_ids`` are the token chosen at the previous step;
- ``append_one``: the previous value with a column of ones appended (``attention_mask``);
- ``next_position``: the previous value's last position plus one (``cache_position``, ``position_ids``);
- ``same``: the value the previous call had (encoder outputs, a speaker embedding);
- ``repeat_last``: the previous value's last position (``token_type_ids``: the new token's segment);
- ``repeat_last_row``: the previous value's last position along dim 1, the sequence dim of a mask over
  (batch, text position, image...): Idefics' ``image_attention_mask``, Mllama's ``cross_attention_mask``;
- ``ones_column``: a column of ones, whatever came before (PaliGemma's ``token_type_ids``: a generated token
  belongs to the causal suffix, 1, after a prompt of 0s);
- ``updated``: a tree the previous call was given, as that call left it: a cache the model fills in place
  and does not return (a decoder whose config turns ``use_cache`` off), an encoder output it adds to in
  place; the components return such a tree after the call, so the loop reads it off their outputs;
- ``previous_output``: one of the previous call's output tensors, under another name (Idefics'
  ``image_encoder_embeddings`` is the ``image_hidden_states`` the call before returned); kept as
  ``previous_output:<output name>``;
- for a model whose generate keeps no cache and feeds the whole sequence at every call (OpenAIGPT,
  CpmAnt): ``append_token`` (the ids so far, then the chosen token), ``append_position`` (the positions,
  then the next one) and ``append_last`` (``token_type_ids``: the last segment again). Such a decode
  step is the prefill's graph over one more token; the loop replays generate's own recomputation.
  ``insert_token`` (the ids so far with the chosen token put before their last column) is the same for a
  generate that re-feeds the sequence followed by a column it appends at every call (XLM's mask token): it is
  tried only for a token input whose prefill rule is ``append_column``, and where the captured tokens all equal
  that column's id (so ``append_token`` holds as well) the export refuses to choose (``AmbiguousTokenRule``; the
  export captures again with that id suppressed).
- for a generate that re-feeds a window of its last tokens before such a column and keeps a state of its own
  (XLNet: the last token fed, the chosen one and a dummy 0, ``mems`` cut by two): ``window_token:<k>`` (the last
  k tokens of the call before, the chosen token, the column; k read off the decode step's width),
  ``outputs_trimmed:<n>`` (a tree: the previous call's output less its last n positions along dim 0; n read off
  the first pair) and ``as_prefill`` (an input the step makes from its own ids by the input's prefill rule
  ``last_onehot``: XLNet's ``perm_mask`` and ``target_mapping``).
An input that none explains stops the export with an error naming it: nothing is guessed. Besides the
forward's own inputs, a decode step may take the tree ``module_state`` under rule ``attributes``: tensors the
model keeps in module attributes its forward sets (RecurrentGemma's recurrent and conv states), which the
components take in and return (exporters/generation/module_state.py); ``check_no_module_state`` refuses any
such state the components do not carry.

The prefill's inputs are the caller's, except those ``generate`` derives from them
(``PREFILL_RULES``): ``position_ids`` as the running count of attended positions
(``attention_mask.cumsum(-1) - 1``, 0 on padding; one more where the model counts from 1, PaliGemma)
and an encoder-decoder's ``decoder_input_ids`` (the start token, then the caller's decoder prompt),
checked against the captured prefill call. ``last_tokens:<input>:<n>``: the caller's ``<input>`` cut to its last n
columns, n read off the call (MusicgenForCausalLM's prepare_inputs_for_generation keeps the last token whenever it is
given a cache, and generate gives the first call an empty one: its prefill runs on the prompt's last token); the
sequences still start with the caller's ids, and generate's processors count the caller's prompt. Two carry a
constant read off that call:
``append_column:<input>:<value>`` (the caller's ``<input>`` with a column of one id appended, the same in every
row: XLM's ``mask_token_id``) and ``filled_like:<input>:<value>`` (a tensor shaped like the prefill's ``<input>``,
derived or given, every element one value: XLM's ``langs``, filled with ``lang_id``); ``last_onehot:<input>:<rows>:<dtype>``
(zeros ``[batch, rows or S, S]`` over the prefill's ``<input>`` of length S, 1 at the last of S: XLNet's
``perm_mask`` keeps every position from seeing the dummy, its ``target_mapping`` predicts it). The constant is then checked
on every decode pair through the decode rules (the appended column stays last under ``insert_token``, the fill is
repeated by ``append_last``).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from exporters.generation.capture import Call, GenerationError, flatten_tree, forward_wrapped
from exporters.generation.chosen import TOKEN_INPUTS, step_tokens
from exporters.pytrees import leaf_names_and_values

RULES = ("outputs", "token", "append_one", "next_position", "same", "repeat_last", "insert_token", "append_token",
         "append_position", "append_last", "repeat_last_row", "ones_column", "updated", "previous_output",
         "window_token", "outputs_trimmed", "as_prefill")
WINDOW, TRIMMED = "window_token:", "outputs_trimmed:"  # kept with their count: window_token:1, outputs_trimmed:2
def carried_tree(rule: str) -> bool:
    """Whether a tree under ``rule`` is state the components return and the next call takes (a cache)."""
    return rule == "outputs" or rule.startswith(TRIMMED)


# decode rules of a step that re-reads the whole sequence (no cache): the prefill's graph over one more token
WHOLE_SEQUENCE_RULES = ("append_token", "insert_token")
PREVIOUS_OUTPUT = "previous_output:"  # the kept rule of an input read off a previous output: this, then its name
# the tree of module attributes the components carry (module_state.py) and its rule: the previous component's
# outputs of that name, as for a cache, though not a cache the model returns (eager's past_key_values lacks it)
MODULE_STATE, ATTRIBUTES = "module_state", "attributes"


@dataclasses.dataclass
class Returned:
    """What one forward call of ``generate`` left: the trees it was given as it left them (a cache it
    updated in place), and its output tensors by artifact name."""

    trees: dict[str, list[torch.Tensor]]
    outputs: dict[str, torch.Tensor]
    # tensors kept as plain module attributes (not parameters, buffers or inputs): state a forward may set
    attributes: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    # the same attributes as the call found them (what it started from)
    before: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


def module_attributes(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor kept as a plain attribute of ``model`` or a submodule, by dotted path, cloned."""
    return {f"{prefix}.{k}".lstrip("."): v.detach().clone() for prefix, module in model.named_modules()
            for k, v in vars(module).items() if isinstance(v, torch.Tensor)}


@contextlib.contextmanager
def record_returns(model: torch.nn.Module, returned: list[Returned]):
    """Within the block, every call of ``model.forward`` appends what it left to ``returned``. Entered
    before ``capture_generate``, whose recorder then wraps this one: one entry per captured call."""

    def record(forward, args, kwargs):
        before = module_attributes(model)
        out = forward(*args, **kwargs)
        trees = {}
        for name, value in kwargs.items():
            if value is not None and not isinstance(value, (torch.Tensor, bool, int, float, str)):
                try:
                    trees[name] = [v.detach().clone() for v in flatten_tree(name, value)[0]]
                except GenerationError:
                    continue
        outputs = {n: v.detach().clone() for n, v in leaf_names_and_values(out) if isinstance(v, torch.Tensor)}
        returned.append(Returned(trees, outputs, module_attributes(model), before))
        return out

    with forward_wrapped(model, record):
        yield


def module_state(returned: list[Returned], batch: int) -> list[str]:
    """The module attributes that carry per-sequence state from one decode step to the next (a recurrent or
    convolution state a forward sets on ``self``): attributes of ``batch`` rows whose value the second decode
    step changed."""
    if len(returned) < 3:
        return []
    before, after = returned[1].attributes, returned[2].attributes
    return sorted(k for k, v in after.items() if v.dim() and v.shape[0] == batch
                  and (k not in before or not _equal(before[k], v)))


def uncarriable(returned: list[Returned], name: str) -> str | None:
    """Why the module attribute ``name`` cannot be carried as state from call to call (None: it can): a
    component takes it in and returns it (exporters/generation/module_state.py) where it is there after every
    call with one shape and dtype, and every call after the prefill starts from what the call before left."""
    values = [r.attributes.get(name) for r in returned]
    if any(v is None for v in values) or len({(tuple(v.shape), v.dtype) for v in values}) != 1:
        return "not one shape and dtype after every call"
    if not all(_equal(r.before.get(name), prev.attributes[name]) for prev, r in zip(returned, returned[1:])):
        return "set between the calls, not only by them"
    return None


def check_no_module_state(returned: list[Returned], batch: int, model_name: str, carried=()) -> None:
    """Refuse a model that carries per-sequence state from one decode step to the next in plain module
    attributes (``module_state``) that the components do not carry (``carried``, the attribute paths they
    take in and return): neither given nor returned, it would be a constant of the decode component, its
    value at export."""
    _refuse_uncarried(returned, [k for k in module_state(returned, batch) if k not in carried], model_name)


def carried_module_state(returned: list[Returned], batch: int, model_name: str, carry: bool = True) -> list[str]:
    """The module attributes that carry state from call to call (``module_state``) and can be carried
    (``uncarriable`` None), which the components then take in and return (module_state.py); any other such
    attribute, or every one where ``carry`` is False (a step form that cannot carry them), is refused as
    ``check_no_module_state`` refuses it."""
    changed = module_state(returned, batch)
    carried = [k for k in changed if carry and uncarriable(returned, k) is None]
    _refuse_uncarried(returned, [k for k in changed if k not in carried], model_name)
    return carried


def _refuse_uncarried(returned: list[Returned], changed: list[str], model_name: str) -> None:
    if changed:
        why = {k: uncarriable(returned, k) for k in changed}
        reasons = "; ".join(sorted({f"{k}: {v}" for k, v in why.items() if v}))[:300]
        raise GenerationError(f"{model_name} carries state from step to step in module attributes its forward sets "
                              f"({changed[:4]}{' ...' if len(changed) > 4 else ''}), neither passed in nor returned: "
                              "an exported decode step would keep their value at export"
                              + (f" (not carried: {reasons})" if reasons else ""))


def _equal(a, b) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def apply_tensor_rule(rule: str, previous: torch.Tensor | None, token: torch.Tensor) -> torch.Tensor:
    if rule == "token":
        return token.reshape(-1, 1)
    if previous is None:
        raise GenerationError(f"rule {rule!r} needs the previous value")
    if rule == "append_one":
        ones = torch.ones(*previous.shape[:-1], 1, dtype=previous.dtype)
        return torch.cat([previous, ones], dim=-1)
    if rule == "next_position":
        return previous[..., -1:] + 1
    if rule == "same":
        return previous
    if rule == "repeat_last":
        return previous[..., -1:]
    if rule == "ones_column":
        return torch.ones_like(previous[..., -1:])
    if rule == "repeat_last_row":
        return previous[:, -1:]
    if rule == "append_token":
        return torch.cat([previous, token.reshape(-1, 1).to(previous.dtype)], dim=-1)
    if rule.startswith(WINDOW):  # the last k tokens fed, the chosen one, the trailing column (XLNet's offset 2)
        k = int(rule[len(WINDOW):])
        return torch.cat([previous[..., -k - 1:-1], token.reshape(-1, 1).to(previous.dtype), previous[..., -1:]], dim=-1)
    if rule == "insert_token":  # before the trailing column generate appends at every call (XLM's mask token)
        return torch.cat([previous[..., :-1], token.reshape(-1, 1).to(previous.dtype), previous[..., -1:]], dim=-1)
    if rule == "append_position":
        return torch.cat([previous, previous[..., -1:] + 1], dim=-1)
    if rule == "append_last":
        return torch.cat([previous, previous[..., -1:]], dim=-1)
    raise GenerationError(f"unknown step rule {rule!r}")


PREFILL_RULES = ("positions_from_mask", "decoder_start", "positions_from_mask_1", "append_column", "last_tokens",
                 "filled_like", "last_onehot")
APPEND_COLUMN, FILLED_LIKE = "append_column:", "filled_like:"  # kept with their input and value: append_column:input_ids:0
LAST_TOKENS = "last_tokens:"  # last_tokens:<input>:<n>: the caller's <input>, its last n columns
LAST_ONEHOT = "last_onehot:"  # last_onehot:<input>:<rows, or "all">:<dtype>


# the encoder's main input, or its embeddings where the caller gives those (a generate override's handoff: Pop2Piano)
ENCODER_MAIN_INPUTS = ("input_ids", "input_features", "input_values", "pixel_values", "flattened_patches", "inputs_embeds")


def _batch_of(given: dict[str, torch.Tensor]) -> int:
    """The batch size: dim 0 of the encoder's main input (text, audio features or samples, pixels, patches)."""
    main = next((given[k] for k in ENCODER_MAIN_INPUTS if k in given), None)
    if main is None:
        raise KeyError(f"none of {ENCODER_MAIN_INPUTS}")
    return main.shape[0]


def _parametric(rule: str) -> tuple[str, float | int]:
    """``append_column:<input>:<value>`` / ``filled_like:<input>:<value>``: the input it reads and its value."""
    _, source, text = rule.split(":")
    try:
        return source, int(text)
    except ValueError:
        return source, float(text)


def derive_prefill_input(rule: str, given: dict[str, torch.Tensor], generation: dict | None = None,
                         derived: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The prefill input ``rule`` derives from the caller's tensors ``given``; ``derived``: the prefill inputs
    derived before this one (``filled_like`` reads the prefill's own value of its input, derived or given)."""
    if rule.startswith(APPEND_COLUMN):  # the caller's ids, then a column of one id (XLM's mask token)
        source, value = _parametric(rule)
        base = given[source]
        return torch.cat([base, torch.full((*base.shape[:-1], 1), value, dtype=base.dtype)], dim=-1)
    if rule.startswith(LAST_TOKENS):  # the caller's ids cut to their last n columns (MusicgenForCausalLM's prefill)
        source, n = _parametric(rule)
        return given[source][..., -int(n):]
    if rule.startswith(FILLED_LIKE):  # shaped like the prefill's <input>, one value throughout (XLM's langs)
        source, value = _parametric(rule)
        return torch.full_like({**given, **(derived or {})}[source], value)
    if rule.startswith(LAST_ONEHOT):  # [batch, rows, S] zeros, 1 at the last of S (XLNet's perm_mask, target_mapping)
        _, source, rows, dtype = rule.split(":")
        ids = {**given, **(derived or {})}[source]
        length = ids.shape[-1]
        out = torch.zeros(ids.shape[0], length if rows == "all" else int(rows), length, dtype=getattr(torch, dtype))
        out[..., -1] = 1
        return out
    if rule == "decoder_start":  # an encoder-decoder's decoder prompt: the start token, then any given
        start = (generation or {}).get("decoder_start_token_id")
        if start is None:
            raise KeyError("decoder_start_token_id")
        column = torch.full((_batch_of(given), 1), int(start), dtype=torch.long)
        prompt = given.get("decoder_input_ids")
        return column if prompt is None else torch.cat([column, prompt], dim=-1)
    if rule == "positions_from_mask_1":  # one-indexed positions (PaliGemma adds 1 in prepare_inputs_for_generation)
        return derive_prefill_input("positions_from_mask", given, generation) + 1
    if rule == "positions_from_mask":
        mask = given.get("attention_mask")
        if mask is None:
            ids = given["input_ids"]
            return torch.arange(ids.shape[-1]).unsqueeze(0).expand(ids.shape[0], -1)
        positions = mask.long().cumsum(-1) - 1
        return positions.masked_fill(mask == 0, 0)
    raise GenerationError(f"unknown prefill rule {rule!r}")


def _one_value(t: torch.Tensor) -> str | None:
    """The one value every element of ``t`` holds, as a rule keeps it (an integer dtype's as an int), else None."""
    if t.numel() == 0 or t.dtype == torch.bool or not bool((t == t.reshape(-1)[0]).all()):
        return None
    value = t.reshape(-1)[0].item()
    return str(int(value)) if not t.is_floating_point() else repr(float(value))


def _candidates(rule: str, name: str, value: torch.Tensor, given: dict, derived: dict) -> list[str]:
    """``rule`` as it is tried for the prefill input ``name`` (``value`` at the captured call): a parametric rule
    once per input it may read, its constant read off the call; every other rule as it is."""
    if rule == "append_column":
        base = given.get(name)
        if name not in TOKEN_INPUTS or base is None or value.dim() != base.dim() or value.shape[-1] != base.shape[-1] + 1:
            return []
        column = _one_value(value[..., -1:])
        return [] if column is None else [f"{APPEND_COLUMN}{name}:{column}"]
    if rule == "last_tokens":
        base = given.get(name)
        if name not in TOKEN_INPUTS or base is None or value.dim() != base.dim() or value.shape[:-1] != base.shape[:-1] \
                or not 0 < value.shape[-1] < base.shape[-1]:
            return []
        return [f"{LAST_TOKENS}{name}:{value.shape[-1]}"]
    if rule == "last_onehot":
        if value.dim() != 3 or not value.is_floating_point():
            return []
        rows = "all" if value.shape[1] == value.shape[2] else str(value.shape[1])
        dtype = str(value.dtype).removeprefix("torch.")
        return [f"{LAST_ONEHOT}{k}:{rows}:{dtype}" for k in TOKEN_INPUTS if k in {**given, **derived}]
    if rule == "filled_like":
        fill = _one_value(value)
        prefill = {**given, **derived}
        return [] if fill is None else [f"{FILLED_LIKE}{k}:{fill}" for k, t in prefill.items()
                                        if k != name and t.shape == value.shape and t.dtype == value.dtype]
    return [rule]


def infer_prefill_rules(call: Call, given: dict[str, torch.Tensor], generation: dict | None = None) -> dict[str, str]:
    """How each prefill input the caller does not give (or gives changed) is derived from what it gives, in the
    order the loop derives them (an input ``filled_like`` reads is derived before it)."""
    pending = [name for name, value in call.tensors.items() if not (name in given and _equal(given[name], value))]
    rules: dict[str, str] = {}
    derived: dict[str, torch.Tensor] = {}
    while pending:
        for name in pending:
            value = call.tensors[name]
            rule = next((r for base in PREFILL_RULES for r in _candidates(base, name, value, given, derived)
                         if _derives(r, value, given, generation, derived)), None)
            if rule is not None:
                rules[name], derived[name] = rule, value
                pending.remove(name)
                break
        else:
            raise GenerationError(
                f"the prefill call of generate takes {pending[0]!r}, which the caller does not give and none of "
                f"{PREFILL_RULES} derives from {sorted(given)}; a component that makes it (an encoder) is not built yet"
            )
    return rules


def _derives(rule: str, value: torch.Tensor, given: dict, generation: dict | None, derived: dict) -> bool:
    try:
        made = derive_prefill_input(rule, given, generation, derived)
    except (KeyError, RuntimeError):
        return False
    return _equal(made, value) and made.dtype == value.dtype


def prefill_sources(prefill_rules: dict[str, str]) -> list[str]:
    """The caller's inputs a prefill rule changes under their own name (``append_column``: the caller gives
    ``input_ids``, the prefill takes them with a column appended; ``last_tokens``: their last columns): inputs of the
    loop although derived, and what the returned sequences start with."""
    return [_parametric(r)[0] for r in prefill_rules.values() if r.startswith((APPEND_COLUMN, LAST_TOKENS))]


def last_tokens_rule(name: str, value: torch.Tensor, given: dict[str, torch.Tensor]) -> str | None:
    """``last_tokens:<name>:<n>`` where ``value`` (what generate's first call took as ``name``) is the caller's
    ``name`` cut to its last n columns, found as ``infer_prefill_rules`` finds it; else None. The static form reads
    it off its own capture (exporters/generation/static.py), whose calls are not ``Call``s."""
    return next((r for r in _candidates("last_tokens", name, value, given, {}) if _derives(r, value, given, None, {})),
                None)


def last_tokens_count(rule: str) -> int:
    """n of ``last_tokens:<input>:<n>``."""
    if not rule.startswith(LAST_TOKENS):
        raise GenerationError(f"{rule!r} is not a {LAST_TOKENS}<input>:<n> rule")
    return int(_parametric(rule)[1])


def appended_id(prefill_rules: dict[str, str], name: str) -> int | float | None:
    """The id the prefill appends to ``name`` (``append_column``), else None."""
    rule = prefill_rules.get(name, "")
    return _parametric(rule)[1] if rule.startswith(APPEND_COLUMN) else None


class AmbiguousTokenRule(GenerationError):
    """The captured tokens all equal the column generate appends to the ids: ``insert_token`` and
    ``append_token`` both explain the calls. ``token_id``: that column's id."""

    def __init__(self, name: str, token_id):
        self.token_id = token_id
        super().__init__(f"the decode steps' {name!r} are explained both by the chosen token put before the trailing "
                         f"column of {token_id} that the prefill appends (insert_token) and by the token appended after "
                         f"it (append_token): every captured token is {token_id}; capture with it suppressed to tell them apart")


def infer_rules(calls: list[Call], sequences: torch.Tensor, prompt_length: int,
                returned: list[Returned] | None = None, prefill_rules: dict[str, str] | None = None,
                generation: dict | None = None) -> dict[str, str]:
    """The rule of each input of the decode step (calls[1:]), checked on every consecutive pair;
    ``returned``: what each call left (``record_returns``), for the rules ``updated`` and ``previous_output``;
    ``prefill_rules``: the prefill's (``insert_token`` is tried only for ids the prefill appended a column to).
    ``prompt_length``: the caller's prompt, which the returned sequences start with; where they are not the prompt
    followed by one token per call, each step's token is read off the next call (chosen.step_tokens, checked
    against the greedy choice under ``generation``, the generation config)."""
    if len(calls) < 3:
        raise GenerationError(f"generate made {len(calls)} forward calls; at least a prefill and two decode steps "
                              "are needed to read how the inputs evolve")
    decode = calls[1]
    lengths = [c.query_length() for c in calls]
    uncached = all(b is not None and a is not None and b == a + 1 for a, b in zip(lengths, lengths[1:]))
    appended = dict(prefill_rules or {})
    token_input = next((k for k in TOKEN_INPUTS if k in decode.tensors), None)
    # a window of fixed width before the column the prefill appended (XLNet re-feeds its last tokens): window_token
    window = appended_id(appended, token_input) is not None and len(set(lengths[1:])) == 1 and lengths[1] > 2
    if not uncached and not window and any(n != 1 for n in lengths[1:]):
        raise GenerationError(f"the decode steps feed neither one token per call nor the whole sequence so far "
                              f"(query lengths {lengths}); generation export reads one of the two")
    for name, (_, spec) in decode.trees.items():
        for later in calls[2:]:
            if later.trees.get(name, (None, None))[1] != spec:
                raise GenerationError(
                    f"the decode steps' {name!r} changes structure from step to step: {_first_difference(spec, later.trees[name][1])}; "
                    "a Python value kept in it (not a tensor) would be baked into the decode component at its first value"
                )
    left = list(returned) if returned is not None and len(returned) == len(calls) else [None] * len(calls)
    tokens = step_tokens(calls, sequences, prompt_length, left, generation)  # the token fed after each call
    rules: dict[str, str] = {}

    def everywhere(rule: str, name: str) -> bool:
        own = appended.get(name)
        return all(_holds(rule, name, prev, cur, tokens[i], after, own)
                   for i, (prev, cur, after) in enumerate(zip(calls[1:-1], calls[2:], left[1:-1]), start=1)) \
            and _holds(rule, name, calls[0], calls[1], tokens[0], left[0], own)

    for name in list(decode.tensors) + list(decode.trees):
        for rule in [r for base in RULES for r in _variants(base, name, calls, left, appended)]:
            if rule == "insert_token" and appended_id(appended, name) is None:
                continue  # a trailing column of its own only where the prefill appended one
            if everywhere(rule, name):
                if rule == "insert_token" and everywhere("append_token", name):
                    raise AmbiguousTokenRule(name, appended_id(appended, name))
                rules[name] = rule
                break
        else:
            raise GenerationError(
                f"cannot tell how the decode-step input {name!r} follows from the call before it (none of {RULES} "
                "explains the values generate passed); add a rule to exporters/generation/steps.py"
            )
    return rules


def _first_difference(a, b) -> str:
    """Where two pytree specs first differ, in words (``layers.3.cumulative_length: 6 -> 7``)."""
    text_a, text_b = str(a), str(b)
    i = next((k for k, (x, y) in enumerate(zip(text_a, text_b)) if x != y), min(len(text_a), len(text_b)))
    return f"...{text_a[max(0, i - 80):i + 20]}... becomes ...{text_b[max(0, i - 80):i + 20]}..."


def _variants(rule: str, name: str, calls: list[Call], left: list[Returned | None],
              prefill_rules: dict[str, str] | None = None) -> list[str]:
    """``rule`` as it is tried for input ``name``: ``previous_output`` once per output tensor of the call
    before the first decode step (``previous_output:<output>``); ``window_token`` with the width the decode step
    keeps (``window_token:<k>``, k tokens before the chosen one), where the prefill appended a column to ``name``;
    ``outputs_trimmed`` with the positions dim 0 loses (``outputs_trimmed:<n>``); ``as_prefill`` where ``name``
    has a prefill rule that reads the token input; every other rule as it is."""
    prefill_rules = prefill_rules or {}
    if rule == "window_token":
        width = calls[1].tensors[name].shape[-1] if name in calls[1].tensors else 0
        return [f"{WINDOW}{width - 2}"] if appended_id(prefill_rules, name) is not None and width > 2 else []
    if rule == "outputs_trimmed":
        out, leaves = calls[0].output_trees.get(name), calls[1].trees.get(name)
        if out is None or leaves is None or not out[0] or len(out[0]) != len(leaves[0]) or leaves[0][0].dim() == 0:
            return []
        cut = out[0][0].shape[0] - leaves[0][0].shape[0]
        return [f"{TRIMMED}{cut}"] if cut > 0 else []
    if rule == "as_prefill":
        return [rule] if prefill_rules.get(name, "").startswith(LAST_ONEHOT) else []
    if rule != "previous_output":
        return [rule]
    if name not in calls[1].tensors or left[0] is None:
        return []
    return [PREVIOUS_OUTPUT + out for out in left[0].outputs]


def _holds(rule: str, name: str, prev: Call, cur: Call, token: torch.Tensor, after: Returned | None = None,
           prefill_rule: str | None = None) -> bool:
    if rule == "updated":  # the tree the previous call was given, as that call left it
        leaves = cur.trees.get(name, (None,))[0]
        before = None if after is None else after.trees.get(name)
        return leaves is not None and before is not None and name in prev.trees and len(before) == len(leaves) \
            and all(_equal(a, b) for a, b in zip(before, leaves))
    if rule.startswith(PREVIOUS_OUTPUT):
        out = None if after is None else after.outputs.get(rule[len(PREVIOUS_OUTPUT):])
        return name in cur.tensors and _equal(out, cur.tensors[name])
    if rule.startswith(TRIMMED):  # the previous call's output tree less its last n positions along dim 0 (XLNet's mems)
        out, leaves = prev.output_trees.get(name), cur.trees.get(name, (None,))[0]
        n = int(rule[len(TRIMMED):])
        return out is not None and leaves is not None and len(out[0]) == len(leaves) \
            and all(a.dim() > 0 and _equal(a[:-n], b) for a, b in zip(out[0], leaves))
    if rule == "as_prefill":  # what the prefill rule derives from this call's own token input
        ids = next((cur.tensors[k] for k in TOKEN_INPUTS if k in cur.tensors), None)
        made = None if ids is None or prefill_rule is None else derive_prefill_input(prefill_rule, dict.fromkeys(TOKEN_INPUTS, ids))
        return name in cur.tensors and made is not None and _equal(made, cur.tensors[name]) \
            and made.dtype == cur.tensors[name].dtype
    if name in cur.trees:
        leaves, spec = cur.trees[name]
        if rule == "outputs":
            out = prev.output_trees.get(name)
            return out is not None and out[1] == spec and all(_equal(a, b) for a, b in zip(out[0], leaves))
        if rule == "same" and name in prev.trees:
            before, before_spec = prev.trees[name]
            return before_spec == spec and all(_equal(a, b) for a, b in zip(before, leaves))
        return False
    value = cur.tensors[name]
    if (rule in ("token", "append_token", "insert_token") or rule.startswith(WINDOW)) and name not in TOKEN_INPUTS:
        return False
    if rule == "token":
        return _equal(value, token.reshape(-1, 1))
    if rule == "outputs":
        return False
    previous = prev.tensors.get(name)
    if previous is None:
        return False
    try:
        return _equal(apply_tensor_rule(rule, previous, token), value)
    except (RuntimeError, IndexError):  # a rule that does not apply to this value's shape (dim 1 of a 1-D tensor)
        return False


def tree_output_names(output_names: list[str], tree: str) -> list[str]:
    """The artifact outputs that are the leaves of the output tree ``tree``, in flattening order."""
    return [n for n in output_names if n == tree or n.startswith(tree + ".")]

