"""One graph for the prompt and the steps: the decode component run at past length 0 as the prefill.

The dynamic cache form exports ``prefill`` (generate's first call: the prompt, an empty cache) and
``decode`` (a call reading and returning the cache) as two programs. Where the two calls take the same
inputs and the decode step's dynamic new-token dim already holds a prompt, the decode graph called with
every cache leaf empty along its past axis computes what the prefill does, as onnxruntime-genai's one
decoder graph does (genai.py): one export and one lowering instead of two, one set of weights in the
saved folder. A model that branches on the past length (a sliding window, a state-space model's first
call) computes something else there, so the form is taken only where it is measured to hold:

- the calls agree: the prefill takes the decode step's tensor inputs and constants, and no tree but the
  cache it fills (no encoder, no module state, no baked tree, no per-component quantization);
- each cache leaf grows by one along exactly one axis from one decode step to the next (its past axis);
- in eager, under the export's model patches, the decode component over the prompt and empty leaves
  returns the prefill component's outputs (names and values, within the backend's tolerance);
- the decode artifact, exported with each past axis allowed to be 0 (``ExportConfig.may_be_empty``),
  called the same way, returns them too (its runtime may refuse an empty tensor, or its lowering narrow a
  dim: ExecuTorch's memory plan).

Where the backend's lowering narrows a step traced at one token so that it holds no prompt
(``decode_traced_at_one_token``: ExecuTorch's re-trace met a contiguity check ``Eq(32*s70, 32)`` at the
traced size and planned the token dim for [1, 2]), the step is traced at two new tokens instead
(``two_token_call``: the two captured decode steps as one call from the first one's cache), and checked
at the one-token step as well, against eager; where it fails there (torch.export's own guard
``Ne(32*s, 32)`` at a 3-D input of a biased linear, at::linear's contiguity check: BERT-family heads,
CTRL, CodeGen) or over the prompt, the step is exported again at its own call, beside the prefill. Without two decode steps
to join (a one-token prompt) such a backend keeps the two programs. Elsewhere the step is traced at its
own call: there a two-token trace would cost those classes a third export and gain the others nothing
measured.

Where any of these fails the prefill is exported as its own component, as before, and the generator
records why (``metadata["prefill"]``). generator.json keeps each empty leaf's shape (``empty_past``):
the batch dim is taken from the caller's ids, the past axis is 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from exporters.generation.capture import Call
from exporters.generation.component import FlatComponent, flat_call_inputs, leaf_input_name
from exporters.pytrees import flatten_outputs
from exporters.trace_reuse import value_key

PREFILL_BY_DECODE = "decode at past length 0"


def past_axes(calls: list[Call], tree: str) -> list[int] | None:
    """Each leaf's past axis: the one dim that grows by one from the first decode call to the second, or None
    where a leaf does not grow so (a fixed-size state, a window already full, a leaf that is not a tensor)."""
    if len(calls) < 3 or tree not in calls[1].trees or tree not in calls[2].trees:
        return None
    first, second = calls[1].trees[tree][0], calls[2].trees[tree][0]
    if not first or len(first) != len(second):
        return None
    axes = []
    for a, b in zip(first, second):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != b.dim():
            return None
        grown = [d for d, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        if len(grown) != 1 or b.shape[grown[0]] != a.shape[grown[0]] + 1:
            return None
        axes.append(grown[0])
    return axes


def _same_constants(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.keys() == b.keys() and all(value_key(a[k]) == value_key(b[k]) for k in a)


def decided(exporter, model: torch.nn.Module, config, calls: list[Call], rules: Mapping[str, str], patches,
            more_parts: Any) -> tuple[list[int] | None, dict[str, torch.Tensor] | None, Call | None, str | None]:
    """(each cache leaf's past axis, the prefill component's eager outputs, the call the decode step is traced at
    (``decode_example``), None) where the decode graph may run the prompt, as far as the captured calls and an eager
    check tell (the artifact is checked after its export, against those outputs); else (None, None, None, why not).
    ``more_parts``: an encoder call, module state, a baked tree or quantization recipes, any of which keeps the
    prefill its own."""
    why = refusal(calls, rules, more_parts)
    example = decode_example(exporter, calls) if why is None else None
    if why is None and example is None:
        why = exporter.decode_traced_at_one_token
    if why is None and not (config.dynamic and config.dynamic_shapes is None):
        why = "a static-shape export (the past axis cannot take 0)"
    if why is not None:
        return None, None, None, why
    axes = past_axes(calls, cache_tree(calls[1]))
    want = component_outputs(model, calls[0], patches)
    why = eager_problem(model, calls, axes, want, exporter.backend, patches)
    return (axes, want, example, None) if why is None else (None, None, None, why)


def refusal(calls: list[Call], rules: Mapping[str, str], more_parts: Any = None) -> str | None:
    """Why the prefill cannot be the decode graph at past length 0, read off the captured calls; None where it may."""
    prefill, decode = calls[0], calls[1]
    if more_parts:
        return "the prefill takes an encoder's outputs, module state, a baked tree or its own quantization recipe"
    if set(prefill.tensors) != set(decode.tensors) or not _same_constants(prefill.constants, decode.constants):
        return (f"the prefill takes {sorted(prefill.tensors)}, the decode step "
                f"{sorted(decode.tensors)} (or other constants)")
    carried_trees = [k for k in decode.trees if rules.get(k) in ("outputs", "updated")]
    if len(carried_trees) != 1 or set(decode.trees) != set(carried_trees) or prefill.trees.get(carried_trees[0], ([], None))[0]:
        return f"the decode step takes trees {sorted(decode.trees)}, not one cache the prefill starts empty"
    if past_axes(calls, carried_trees[0]) is None:
        return f"a leaf of {carried_trees[0]!r} does not grow by one along one axis a step"
    return None


def cache_tree(decode: Call) -> str:
    return next(iter(decode.trees))


def decode_example(exporter, calls: list[Call]) -> Call | None:
    """The call the one-graph decode step is traced at: two tokens (``two_token_call``) where the backend's one-token
    trace holds no prompt (``decode_traced_at_one_token``; None where the calls join into none), else the captured
    step."""
    return two_token_call(calls) if getattr(exporter, "decode_traced_at_one_token", None) else calls[1]


def two_token_call(calls: list[Call]) -> Call | None:
    """The two captured decode steps as one call over two new tokens from the first step's cache: each input of
    one token per step (ids, positions: the dim where the prompt's size differs from the step's 1) the two
    steps' values joined along that dim; an input growing by one a step (the mask) the second step's; an input
    the steps share, as it is. None where an input fits none of these (a one-token prompt shows no token dim)."""
    if len(calls) < 3:
        return None
    prefill, first, second = calls[0], calls[1], calls[2]
    tensors = {}
    for name, a in first.tensors.items():
        b, p = second.tensors.get(name), prefill.tensors.get(name)
        if b is None or a.dim() != b.dim():
            return None
        grown = [d for d, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        token = [d for d, (x, y) in enumerate(zip(p.shape, a.shape)) if x != y and y == 1] \
            if p is not None and p.dim() == a.dim() else []
        if len(grown) == 1 and b.shape[grown[0]] == a.shape[grown[0]] + 1:
            tensors[name] = b
        elif grown:
            return None
        elif len(token) == 1:
            tensors[name] = torch.cat([a, b], token[0])
        elif torch.equal(a, b):
            tensors[name] = a
        else:
            return None
    return dataclasses.replace(first, tensors=tensors)


def empty_leaves(decode: Call, axes: list[int]) -> dict[str, torch.Tensor]:
    """The decode step's cache leaves, each empty along its past axis, at the captured batch."""
    return zeros_for(empty_past_spec(decode, axes), 0)


def eager_problem(model: torch.nn.Module, calls: list[Call], axes: list[int], want: Mapping[str, torch.Tensor],
                  backend: str, patches) -> str | None:
    """In eager under ``patches``: the decode component over the prompt and empty leaves against the prefill
    component's outputs ``want`` (``component_outputs``); a line naming the first difference, or None."""
    from exporters.utils import apply_patches, exception_headline

    prefill, decode = calls[0], calls[1]
    with torch.no_grad(), apply_patches(patches):
        try:
            got = flatten_outputs(FlatComponent(model, decode).eval()(**flat_call_inputs(prefill), **empty_leaves(decode, axes)))
        except Exception as exc:  # noqa: BLE001  (the model refuses an empty cache: the two-program form stands)
            return f"the decode step raised from an empty cache: {exception_headline(exc)}"
    # a non-finite key at a masked position still reaches the next step's output (0 x NaN): only where the prefill's is
    not_finite = [k for k in want if k in got and bool(got[k].isfinite().all()) < bool(want[k].isfinite().all())]
    if not_finite:
        return f"{not_finite[0]}: not finite from the empty cache, finite from the prefill"
    return _first_difference(dict(want), got, prefill.tensors.get("attention_mask"), backend)


def _first_difference(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor], mask, backend: str) -> str | None:
    """The first line ``compare`` finds between ``want`` and ``got`` at the cache positions attention reads."""
    from exporters.parity import attended, compare

    problems = compare(attended(want, mask), attended(got, mask), backend)
    return problems[0] if problems else None


def component_outputs(model: torch.nn.Module, call: Call, patches) -> dict[str, torch.Tensor]:
    """The eager outputs of the component of ``call`` under ``patches``, named as an artifact names its outputs."""
    from exporters.utils import apply_patches

    with torch.no_grad(), apply_patches(patches):
        return flatten_outputs(FlatComponent(model, call).eval()(**flat_call_inputs(call)))


def batch_dims(artifact, token_input: str, tree: str, count: int) -> list[int | None]:
    """Each cache leaf's batch dim: the dim that shares the token input's dim-0 symbol in the artifact (None: the
    leaf keeps its size whatever the batch)."""
    specs = artifact.input_specs
    symbol = (specs.get(token_input, ((), None, {}))[2].get(0) or {}).get("symbol")
    dims = []
    for i in range(count):
        leaf = specs.get(leaf_input_name(tree, i), ((), None, {}))[2]
        dims.append(next((d for d, s in leaf.items() if symbol is not None and s.get("symbol") == symbol), None))
    return dims


def artifact_problem(artifact, calls: list[Call], axes: list[int], want: Mapping[str, torch.Tensor], backend: str
                     ) -> str | None:
    """The decode artifact over the prompt and empty leaves against the prefill's eager outputs ``want`` (the
    artifact's output names); a line naming the first difference or the refusal, or None."""
    from exporters.utils import exception_headline

    prefill, decode = calls[0], calls[1]
    try:
        got = artifact(**flat_call_inputs(prefill), **empty_leaves(decode, axes))
    except Exception as exc:  # noqa: BLE001  (the runtime's refusal is the finding: the two-program form stands)
        return f"the decode artifact refused empty leaves: {exception_headline(exc)}"
    return _first_difference({k: v for k, v in want.items() if k in artifact.output_names}, got,
                             prefill.tensors.get("attention_mask"), backend)


def export_one_graph(export_decode: Callable[..., Any], export_prefill: Callable[[], Any], calls: list[Call],
                     axes: list[int], want: Mapping[str, torch.Tensor], backend: str, token_input: str,
                     example: Call, eager: Callable[[Call], dict[str, torch.Tensor]]
                     ) -> tuple[dict[str, Any], dict[str, dict[str, Any]] | None, str | None]:
    """The components where ``decided`` took the one-graph form: the decode step exported at ``example``
    (``decode_example``) with every past axis allowed to be 0 (``export_decode(may_be_empty, call)``), checked over
    the prompt, and where ``example`` is not the captured step at that step too (against ``eager(call)``, whose
    failure the record names first); where a check fails the prefill is exported too (``export_prefill()``, before
    the decode as generate calls them), and a two-token step again at its own call. Returns (components, the empty_past record or
    None, why the prefill is its own or None)."""
    from exporters.utils import exception_headline

    decode = calls[1]
    tree = cache_tree(decode)
    try:
        artifact = export_decode([(leaf_input_name(tree, i), a) for i, a in enumerate(axes)], example)
    except Exception as exc:  # noqa: BLE001  (an empty past the export or lowering refuses: the two-program form)
        why = f"the decode step with an empty past did not export: {exception_headline(exc)}"
        artifact = export_decode((), decode)
    else:
        why = artifact_problem(artifact, calls, axes, want, backend)
        step = None if example is decode else step_problem(artifact, decode, eager(decode), backend)
        if step is not None:
            why = f"the decode step traced at two tokens fails at one: {step}"
        if example is not decode and why is not None:
            # a two-token trace that is not the one graph is not the step either: its memory plan was checked at no
            # step's sizes but the captured one (JetMoe's split outputs planned too small at another batch); the
            # step is exported at its own call, as the two-program form has it
            artifact = export_decode((), decode)
    if why is not None:
        return {"prefill": export_prefill(), "decode": artifact}, None, why
    empty = empty_past_spec(decode, axes, batch_dims(artifact, token_input, tree, len(axes)))
    return {"decode": artifact}, empty, None


def step_problem(artifact, decode: Call, want: Mapping[str, torch.Tensor], backend: str) -> str | None:
    """The decode artifact at the captured one-token step against that step's eager outputs ``want``; a line naming
    the first difference or the refusal, or None."""
    from exporters.utils import exception_headline

    try:
        got = artifact(**flat_call_inputs(decode))
    except Exception as exc:  # noqa: BLE001  (a token dim the trace bounded above 1: the finding)
        return f"refused: {exception_headline(exc)}"
    return _first_difference({k: v for k, v in want.items() if k in artifact.output_names}, got,
                             decode.tensors.get("attention_mask"), backend)


def empty_past_spec(decode: Call, axes: list[int], dims: list[int | None] | None = None) -> dict[str, dict[str, Any]]:
    """generator.json's record of the empty leaves: shape (past axis 0), dtype, batch dim (``dims``; None: none)."""
    tree = cache_tree(decode)
    dims = dims or [None] * len(axes)
    return {leaf_input_name(tree, i): {"shape": [0 if d == axis else s for d, s in enumerate(leaf.shape)],
                                       "dtype": str(leaf.dtype).removeprefix("torch."), "batch_dim": bdim}
            for i, (leaf, axis, bdim) in enumerate(zip(decode.trees[tree][0], axes, dims))}


def zeros_for(spec: Mapping[str, Mapping[str, Any]], batch: int) -> dict[str, torch.Tensor]:
    """The empty leaves ``empty_past_spec`` describes, at ``batch``."""
    out = {}
    for name, leaf in spec.items():
        shape = list(leaf["shape"])
        if leaf.get("batch_dim") is not None:
            shape[leaf["batch_dim"]] = batch
        dtype = getattr(torch, str(leaf.get("dtype")), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"empty_past[{name!r}]: dtype {leaf.get('dtype')!r} is not a torch dtype")
        out[name] = torch.zeros(shape, dtype=dtype)
    return out
