"""Patch (all models using ``sdpa``): the query-length tests in ``sdpa_attention_forward`` that cannot
change its result are answered without a guard when the query length is symbolic (data-dependent, or
a dynamic dim of the inputs).

Cause. ``sdpa_attention_forward`` (integrations/sdpa_attention.py:159) decides
``is_causal = q_length > 1 and attention_mask is None and is_causal``, query length first, and, for
grouped-query modules, tests ``q_length == 1 and not is_torchdynamo_compiling()`` (line 132). When
the query length is data-dependent (tokens kept by a boolean mask: VideoMAE's visible patches are
``embeddings[~bool_masked_pos]``), ``bool(q_length > 1)`` raises "Could not guard on data-dependent
expression ((u0//2)) > 1", though the answer cannot matter: with a mask, or on a non-causal module,
``is_causal`` is False either way; and under export line 132's branch is never taken. transformers'
own comment there says this should be handled on the exporter side. When the query length is a
dynamic input dim (the sequence), the same two tests add the guards ``s != 1`` and ``s > 1``: the
artifact then refuses a one-token call (a decode step) that it would compute correctly.

What this changes (while tracing only). ``sdpa_attention_forward`` is wrapped (and
``AttentionInterface.get_interface`` hands out the wrapped one): when the query length is symbolic, the call runs with
those two comparisons, and only those, answered False (plain bools) without a guard: ``q_length == 1`` always,
``q_length > 1`` only when a mask is given or the call is not causal (when it is causal and has no
mask the answer matters and the guard error stands). Every other call is unchanged.

    before: is_causal = q_length > 1 and ...   -> GuardOnDataDependentSymNode on u0 // 2 > 1
                                                  (or, for a dynamic sequence s0, the guard s0 > 1)
    after:  the same line, with bool(q_length > 1) answered False where is_causal is False anyway

Remove when: ``sdpa_attention_forward`` tests the mask and ``is_causal`` before ``q_length > 1``,
and ``not is_torchdynamo_compiling()`` before ``q_length == 1``, so that a query length is compared
only where the answer matters (transformers' integrations/sdpa_attention.py, whose own comment
leaves this to the exporter side).
"""

from __future__ import annotations

import contextlib
import functools

import torch

from exporters.utils import ActedFlag, data_dependent_size, register_patch


@contextlib.contextmanager
def answered(length: torch.SymInt, answers: dict[str, bool]):
    """Within the block, ``length > 1`` and ``length == 1`` (``answers`` keyed "gt" / "eq") are plain
    bools, without consulting the shape environment (no guard, no error). A plain bool, not a SymBool
    whose ``bool()`` is answered: ``q_length > 1 and ...`` would otherwise return the SymBool itself,
    which sdpa refuses as ``is_causal``. Every other comparison of any SymInt is unchanged."""
    expr = length.node.expr
    originals = {name: getattr(torch.SymInt, f"__{name}__") for name in answers}

    def comparison(name):
        def compare(self, other):
            if type(other) is int and other == 1 and self.node.expr == expr:
                return answers[name]
            return originals[name](self, other)

        return compare

    for name in answers:
        setattr(torch.SymInt, f"__{name}__", comparison(name))
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(torch.SymInt, f"__{name}__", method)


def _symbolic(size) -> bool:
    return data_dependent_size(size) or (isinstance(size, torch.SymInt) and not size.node.expr.is_number)


def length_decided(attention_fn):
    """``attention_fn`` (sdpa_attention_forward) with its result-neutral query-length tests answered."""
    acted = ActedFlag()

    @functools.wraps(attention_fn)
    def attend(module, query, key, value, attention_mask, *args, **kwargs):
        q_length = query.shape[2]
        if not _symbolic(q_length):
            return attention_fn(module, query, key, value, attention_mask, *args, **kwargs)
        is_causal = kwargs.get("is_causal", args[2] if len(args) > 2 else None)
        is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        answers = {"eq": False}  # line 132's branch also needs not is_torchdynamo_compiling()
        if attention_mask is not None or not is_causal:
            answers["gt"] = False  # is_causal is False whatever the length
        acted.set()
        with answered(q_length, answers):
            return attention_fn(module, query, key, value, attention_mask, *args, **kwargs)

    attend.acted = acted
    return attend


@register_patch("dynamo", "transformers.integrations.sdpa_attention.sdpa_attention_forward")
def _patch_sdpa_query_length_decided(original):
    return length_decided(original)


@register_patch("dynamo", "transformers.modeling_utils.AttentionInterface.get_interface")
def _patch_sdpa_lookup_sees_the_patch(original):
    """Models look ``sdpa`` up in ``ALL_ATTENTION_FUNCTIONS``, whose table holds the function itself, not
    the module attribute the patch above replaces: the lookup returns the module attribute, i.e. the
    patched function while patches are installed. The lookup changes nothing by itself (never marked
    fired); the patched function marks itself when it acts."""
    from transformers.integrations import sdpa_attention
    from transformers.modeling_utils import AttentionInterface

    table_sdpa = AttentionInterface._global_mapping["sdpa"]

    @functools.wraps(original)
    def get_interface(self, attn_implementation, default):
        found = original(self, attn_implementation, default)
        return sdpa_attention.sdpa_attention_forward if found is table_sdpa else found

    get_interface.acted = lambda: False
    return get_interface
