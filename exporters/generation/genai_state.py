"""The onnxruntime-genai graph of a model that keeps a recurrent state of its own instead of a transformers
Cache (Rwkv's ``state`` list; exporters/generation/static_state.py reads it the same way).

onnxruntime-genai carries a recurrent state by name, starting at zero (exporters/generation/genai.py).
Here the whole state is one slot: inputs ``past_key_values.0.recurrent_state`` [batch, 1, 1, R], every
floating tensor of the model's state object flattened and concatenated per row, and
``past_key_values.0.conv_state`` [batch, 1, 1], which nothing reads and which comes back unchanged (the
runner pairs the two); outputs ``present.0.*`` of the same shapes and ``logits`` [batch, S, vocab].
genai_config.json names one layer and no key/value inputs.

One graph serves the prompt and every step, as for linear-attention layers: it is traced from a sequence
of 2, so the model takes its multi-token path, which continues from the given state (a model whose
multi-token path ignores it is refused by genai.py's eager check). Where the call has no past (the mask is
as long as the new tokens) the graph starts from the model's own starting state, kept in it as a constant,
not from the runner's zeros: Rwkv's running maximum starts at -1e30. A model whose multi-token path is a
Python loop over the sequence (Rwkv's CPU attention) or splits it into chunks in Python (xLSTM's mLSTM kernel)
is traced with that path in closed form (exporters/workarounds/models/rwkv_wkv.py, xlstm_mlstm.py).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError
from exporters.generation.static_state import initial_state, keeps_own_state, rebuilt, state_leaves

# the arguments a model's own state goes in by here (MiniMax's own cache goes in by past_key_values: refused
# by genai.py's layout check, which names it)
GENAI_OWN_STATE_ARGS = ("state", "cache_params")
RECURRENT, CONV = "past_key_values.0.recurrent_state", "past_key_values.0.conv_state"


def own_state_argument_of(model: torch.nn.Module) -> str | None:
    """The argument ``model`` takes its own state by, where it keeps one (``keeps_own_state``), else None."""
    if not keeps_own_state(model):
        return None
    params = inspect.signature(model.forward).parameters
    return next((arg for arg in GENAI_OWN_STATE_ARGS if arg in params), None)


def _one_slot_export(exporter, step, ids: torch.Tensor, limit: int, seq_from: int, config):
    """The example, dynamic shapes and config of a one-slot graph (batch and sequence dynamic, the past through the
    mask's length): traced at a batch of 2 or more and a sequence of ``seq_from`` or more, a past of 3."""
    import dataclasses

    from torch.export import Dim

    if ids.shape[0] < 2:  # a traced batch of 1 would be specialized
        ids = ids.expand(2, -1)
    if ids.shape[1] < seq_from:
        ids = torch.cat([ids] * seq_from, dim=1)
    batch, past = ids.shape[0], 3
    example = {"input_ids": ids, "attention_mask": torch.ones(batch, past + ids.shape[1], dtype=torch.long),
               **step.zero_past(batch, past)}
    b, s = Dim("batch", min=1, max=limit), Dim("seq", min=seq_from, max=limit)
    shapes = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: Dim.AUTO}, CONV: {0: b}, RECURRENT: {0: b}}
    config = config if config is not None else exporter.config_class()
    return example, dataclasses.replace(config, dynamic=False, dynamic_shapes=shapes, accept_size_one=True)


def _one_slot_layout(size: int, **extra: Any) -> dict[str, Any]:
    """genai.py's layout of a one-slot graph: one layer, no key/value inputs, the slot's recurrent size."""
    return {"layers": 1, "kv_heads": 1, "head_size": 1, "takes_positions": False, "attention_layers": [],
            "recurrent_size": size, "conv_size": 1, **extra}


class GenaiOwnStateStep(torch.nn.Module):
    """``model`` over its own state from the graph's one recurrent-state input (module docstring)."""

    takes_positions = False

    def __init__(self, model: torch.nn.Module, arg: str):
        super().__init__()
        self.model, self.arg = model, arg
        self.template, initial = initial_state(model, arg, batch=1)
        self.paths = list(initial)
        self.shapes = {p: tuple(t.shape[1:]) for p, t in initial.items()}
        self.size = sum(math.prod(s) for s in self.shapes.values())
        self.dtype = next(iter(initial.values())).dtype
        odd = sorted({str(t.dtype) for t in initial.values()} - {str(self.dtype)})
        if odd:
            raise GenerationError(f"{type(model).__name__}'s {arg} mixes dtypes ({odd} beside {self.dtype}); the graph "
                                  "packs it into one tensor of one dtype")
        for j, path in enumerate(self.paths):
            self.register_buffer(f"initial_{j}", initial[path][0], persistent=False)
        self.states = {0: [("recurrent_0", (self.size,))]}  # for genai.py's eager check: one kind of state

    def zero_past(self, batch: int, past: int) -> dict[str, torch.Tensor]:
        """The graph's state inputs as onnxruntime-genai starts them: zeros."""
        return {CONV: torch.zeros(batch, 1, 1, dtype=self.dtype),
                RECURRENT: torch.zeros(batch, 1, 1, self.size, dtype=self.dtype)}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **past: torch.Tensor) -> dict[str, torch.Tensor]:
        batch, new = input_ids.shape
        # a past of 0 (the prompt's call): the model's own starting state, not the runner's zeros
        going_on = torch.ones(attention_mask.shape[1] - new, device=input_ids.device).sum() > 0
        flat = past[RECURRENT].reshape(batch, self.size)
        values, offset = {}, 0
        for j, path in enumerate(self.paths):
            shape, n = self.shapes[path], math.prod(self.shapes[path])
            held = flat[:, offset:offset + n].reshape(batch, *shape)
            offset += n
            values[path] = torch.where(going_on, held, getattr(self, f"initial_{j}").expand(batch, *shape))
        out = self.model(input_ids=input_ids, **{self.arg: rebuilt(self.template, values)}, use_cache=True,
                         return_dict=True)
        updated = dict(state_leaves(getattr(out, self.arg)))
        packed = torch.cat([updated[path].reshape(batch, -1) for path in self.paths], dim=1)
        return {"logits": out.logits, "present.0.conv_state": past[CONV].clone(),
                "present.0.recurrent_state": packed.reshape(batch, 1, 1, self.size)}


def export_genai_own_state(exporter, model: torch.nn.Module, inputs: Mapping[str, Any], arg: str, config, check):
    """The GenaiOwnStateStep of ``model`` exported (batch dynamic, sequence from 2, relaxed to 1 after: module
    docstring), after ``check(step, prompt)`` (genai.py's eager one-graph check). Returns (artifact, layout)."""
    from exporters.workarounds.models._one_graph import one_graph_export

    step = GenaiOwnStateStep(model, arg).eval()
    ids = inputs["input_ids"]
    with one_graph_export():  # the closed forms of rwkv_wkv.py and xlstm_mlstm.py act
        check(step, ids[:1])
        example, config = _one_slot_export(exporter, step, ids, config.max_dim if config is not None else 1024, 2,
                                           config)
        artifact = exporter.export(step, example, config)
    dims = artifact.input_specs.get("input_ids", ((), None, {}))[2]
    if 1 in dims:
        dims[1]["min"] = 1
    layout = _one_slot_layout(step.size, own_state={
        "argument": arg, "parts": [[list(map(str, p)), list(s)] for p, s in step.shapes.items()]})
    artifact.extra_metadata.update({"component": "genai_decoder", "cache_layout": layout})
    return artifact, layout


class GenaiWholeSequenceStep(torch.nn.Module):
    """A model without a cache (its generate re-feeds the whole sequence: OpenAIGPT) as onnxruntime-genai's one
    graph: the sequence so far is the state. ``past_key_values.0.recurrent_state`` [batch, 1, 1, context] holds the
    token ids fed so far (as floats: exact below 2^24, far above any vocabulary here) in its first ``past``
    places; each call reads them, appends the new tokens, runs the model over the whole sequence, returns the new
    tokens' logits and writes the new ids after the old ones. ``past`` is the mask's length less the new tokens',
    as onnxruntime-genai feeds it; a padded prompt's mask reaches the model as generate passes it, and positions,
    where the model takes them, are the running count of attended positions (exporters/generation/static_whole.py).
    ``appended`` / ``filled``: the column of one id generate appends after the sequence and the inputs it fills
    with one value (XLM's mask token and langs, ``static_whole.appended_column``), made here; the logits are then
    those after each new token, the last one at that column, where generate reads them."""

    takes_positions = False  # onnxruntime-genai feeds none: the graph derives them over the whole sequence

    def __init__(self, model: torch.nn.Module, context: int, takes_positions: bool, reads_mask: bool,
                 appended: int | None = None, filled: Mapping[str, int | float] | None = None):
        super().__init__()
        self.model, self.context = model, context
        self.appended, self.filled = appended, dict(filled or {})
        self.positions, self.reads_mask = takes_positions, reads_mask
        self.states = {0: [("recurrent_0", (context,))]}

    def zero_past(self, batch: int, past: int) -> dict[str, torch.Tensor]:
        return {CONV: torch.zeros(batch, 1, 1), RECURRENT: torch.zeros(batch, 1, 1, self.context)}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **past: torch.Tensor) -> dict[str, torch.Tensor]:
        from exporters.generation.static_whole import positions_from_mask

        total, new = attention_mask.shape[1], input_ids.shape[1]
        held = past[RECURRENT][:, 0, 0]
        earlier = held[:, :total - new]
        ids = torch.cat([earlier.round().to(input_ids.dtype), input_ids], dim=1)
        kwargs: dict[str, Any] = {}
        if self.reads_mask:
            kwargs["attention_mask"] = attention_mask
        if self.positions:
            kwargs["position_ids"] = positions_from_mask(attention_mask)
        shift = 0
        if self.appended is not None:  # generate's own column after the sequence: its position predicts the next
            ids = torch.cat([ids, torch.full_like(ids[:, :1], self.appended)], dim=1)
            kwargs.update({k: torch.full_like(ids, v) for k, v in self.filled.items()})
            shift = 1
        logits = self.model(input_ids=ids, use_cache=False, return_dict=True, **kwargs).logits[:, total - new + shift:]
        kept = torch.cat([earlier, input_ids.to(held.dtype), held[:, total:]], dim=1)
        return {"logits": logits, "present.0.conv_state": past[CONV].clone(),
                "present.0.recurrent_state": kept[:, None, None]}


def export_genai_whole_sequence(exporter, model: torch.nn.Module, inputs: Mapping[str, Any], config, check,
                                why: str = ""):
    """The GenaiWholeSequenceStep of a model whose generate (with a static cache, as the static form reads it)
    re-feeds the whole sequence, exported with batch, sequence and past dynamic within the context
    (``config.max_dim``), after genai.py's eager check. Returns (artifact, layout); refuses, after ``why`` (why
    the cache form does not serve), a model whose generate passes more than ids, mask and positions."""
    import dataclasses

    from exporters.generation.static import _forward_arguments
    from exporters.generation.static_whole import read_appended, rereads_sequence, whole_sequence_step_for

    ids = inputs["input_ids"]
    context = int(config.max_dim if config is not None else 1024)
    prompt = {"input_ids": ids[:1]}
    calls, appended = read_appended(type(model).__name__, _forward_arguments(model, prompt), prompt,
                                    lambda token: _forward_arguments(model, prompt, suppress=token))
    if appended is None and not rereads_sequence(calls):
        raise GenerationError(f"{why or type(model).__name__ + ' keeps no cache the folder can name'}; and its generate "
                              "does not re-feed the whole sequence either (its state lives elsewhere: in its modules, "
                              "say), which the graph could carry instead")
    whole = whole_sequence_step_for(model, calls, prompt, context, batch=1, appended=appended)
    if whole.extras:
        raise GenerationError(f"{type(model).__name__}.generate feeds {sorted(whole.extras)} beside the ids, which "
                              "onnxruntime-genai's decoder inputs have no key for")
    step = GenaiWholeSequenceStep(model, context, whole.takes_positions, whole.reads_mask, whole.appended,
                                  whole.filled).eval()
    check(step, ids[:1])
    example, config = _one_slot_export(exporter, step, ids, context, 1, config)
    try:
        artifact = exporter.export(step, example, config)
        fixed_batch = None
    except Exception as exc:  # noqa: BLE001 - only a model that guards its batch away from 1 is retried
        if "Constraints violated (batch)" not in str(exc) or "!= 1" not in str(exc):
            raise
        # the model's code tells a batch of 1 from others (Blt's patching): one graph for the batch the runner
        # feeds, 1, whose bound the artifact records
        example = {k: v[:1] for k, v in example.items()}
        batch_dynamic = config.dynamic_shapes
        config = dataclasses.replace(config, dynamic_shapes={
            name: {1: dims[1]} if name in ("input_ids", "attention_mask") else None for name, dims in batch_dynamic.items()})
        artifact = exporter.export(step, example, config)
        fixed_batch = f"1: the model's code guards the batch away from 1 ({str(exc).splitlines()[0]})"
    layout = _one_slot_layout(context, whole_sequence={"context": context},
                              **({"batch": fixed_batch} if fixed_batch else {}))
    artifact.extra_metadata.update({"component": "genai_decoder", "cache_layout": layout})
    return artifact, layout
