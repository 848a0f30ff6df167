"""Quantization patch: an activation observer of a tensor that the graph writes in place after creating
it observes the tensor where it is read, not where it is created.

Cause. ``prepare_pt2e`` inserts each input observer right after the node that produces the observed
tensor (torchao's pt2e/prepare.py, ``_insert_obs_or_fq``: ``graph.inserting_after(node)``), and
``convert_pt2e`` puts the quantize/dequantize pair where the observer was. The graph it is given,
``torch.export.export(...).module()``, keeps in-place writes into intermediate tensors: Siglip2's
``resize_positional_embeddings`` fills a ``torch.empty`` through ``select``/``slice`` views with
``copy_`` before adding it to the patch embeddings. The observer of that ``empty`` then reads
uninitialized memory: calibration fails with "torch.histc: range of [-nan, -nan] is not finite" when
that memory happens to hold a NaN, and otherwise picks a scale from garbage. After convert, the
quantize reads the same unwritten memory, so the quantized model adds garbage in every run.

What this changes (around stage 0 only). After ``prepare_pt2e``, an observer whose tensor is written in
place (``copy_`` and any op whose schema writes an argument, through any chain of views of it) is moved
to just before the observed tensor's first reader, when every such write comes before that reader. It
then sees, and after convert quantizes, the tensor as its readers read it. Observers of tensors that
are not written in place, and every observer of a graph with no in-place write, stay where they were.

    before: empty -> observer -> [select/slice -> copy_] x4 -> add(linear, observer)   (observes garbage)
    after:  empty -> [select/slice -> copy_] x4 -> observer -> add(linear, observer)

Remove when: ``prepare_pt2e`` places an observer after the last in-place write of what it observes (or
functionalizes the graph it is given).
"""

from __future__ import annotations

import functools

import torch

from exporters.utils import ActedFlag, register_patch


def _writes(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The arguments ``node`` writes in place (its schema's mutable arguments)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return []
    return [arg for spec, arg in zip(node.target._schema.arguments, node.args)
            if isinstance(arg, torch.fx.Node) and spec.alias_info is not None and spec.alias_info.is_write]


def _is_view(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) or not node.args:
        return False
    returns = node.target._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def _base(node: torch.fx.Node) -> torch.fx.Node:
    while _is_view(node) and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def observers_after_writes(model: torch.fx.GraphModule) -> int:
    """Move each observer of an in-place-written tensor to just before its first reader (see the module
    docstring); returns how many were moved."""
    from torchao.quantization.pt2e.observer import _is_activation_post_process

    order = {node: i for i, node in enumerate(model.graph.nodes)}
    last_write: dict[torch.fx.Node, int] = {}
    for node in model.graph.nodes:
        for written in _writes(node):
            base = _base(written)
            last_write[base] = max(last_write.get(base, -1), order[node])
    if not last_write:
        return 0
    moved = 0
    modules = dict(model.named_modules())
    for node in list(model.graph.nodes):
        if node.op != "call_module" or not _is_activation_post_process(modules.get(node.target)):
            continue
        observed = node.args[0]
        if not isinstance(observed, torch.fx.Node) or observed not in last_write or not node.users:
            continue
        first_reader = min(node.users, key=order.__getitem__)
        if order[node] < last_write[observed] < order[first_reader]:
            first_reader.prepend(node)
            moved += 1
    if moved:
        model.recompile()
    return moved


@register_patch("dynamo", "torchao.quantization.pt2e.quantize_pt2e.prepare_pt2e")
def _patch_observe_after_in_place_writes(original):
    acted = ActedFlag()

    @functools.wraps(original)
    def prepare(model, quantizer):
        prepared = original(model, quantizer)
        if observers_after_writes(prepared):
            acted.set()
        return prepared

    prepare.acted = acted
    return prepare
