"""ONNX patches on onnxscript's optimizer: exact no-op rewrite rules, and constant folding of
SplitToSequence with an unknown split.
"""

from __future__ import annotations

import functools
from typing import Any

from exporters.utils import ActedFlag, register_patch

_NO_OP_OPERANDS = {"Add": (0, True), "Sub": (0, False), "Mul": (1, True), "Div": (1, False)}


def _exact_no_op_rules() -> list:
    """onnxscript rewrite rules dropping ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1`` only when the constant
    operand is a scalar exactly equal to the identity (what ``onnxscript``'s ``_no_op`` rules mean to do)."""
    from onnxscript.rewriter import pattern

    def exact(identity):
        def condition(context, x, c, **_):
            value = c.const_value
            if value is None:
                return False
            try:
                array = value.numpy()
            except FileNotFoundError:  # external data not loaded
                return False
            return array.ndim == 0 and bool(array == identity)
        return condition

    def identity(op, x, **_):
        return op.Identity(x)

    def target(op_type, constant_first):
        if constant_first:
            return lambda op, x, c: getattr(op, op_type)(c, x)
        return lambda op, x, c: getattr(op, op_type)(x, c)

    rules = []
    for op_type, (value, commutes) in _NO_OP_OPERANDS.items():
        for constant_first in (False, True) if commutes else (False,):
            rules.append(pattern.RewriteRule(target(op_type, constant_first), identity, exact(value),
                                             name=f"Exact{op_type}Identity{'First' if constant_first else ''}"))
    return rules


@register_patch("onnx", "onnxscript.rewriter._DEFAULT_REWRITE_RULES")
def _patch_exact_no_op_rules(original):
    """The onnxscript optimizer's no-op rules (``onnxscript.rewriter.rules.common._no_op``: ``x + 0``,
    ``x - 0``, ``x * 1``, ``x / 1`` -> ``x``) match their constant with ``math.isclose(value, identity,
    rel_tol=1e-5, abs_tol=1e-8)`` (the defaults of the pattern ``Constant``). A float32 ``1e-8`` is within
    ``abs_tol`` of 0, so the epsilon of ``rsqrt(mean(x**2) + 1e-8)`` is deleted: MuseSpark / MuseGlimmer's
    post-expert RMSNorm (``post_norm_eps=1e-8``) on activations whose mean square is ~1e-6 is off by ~0.5%
    (``x * 1.000005`` would be dropped the same way). Keep the optimizer's rules, but replace those six with
    rules that need the constant to equal the identity exactly. ``optimize_ir`` reads the rule list at each
    call; being a tuple, not a callable, the patch is recorded as fired on every ONNX export, optimized or not.

    before: Add(mean, 1e-8) -> Identity(mean)    after: Add(mean, 1e-8) kept; Add(x, 0.0) -> Identity(x)
    """
    from onnxscript.rewriter.rules.common import _no_op

    keep = {id(_no_op.dropout_zero_rule), id(_no_op.dropout_inference_rule)}
    approximate = {id(rule) for rule in _no_op.rules.rules if id(rule) not in keep}
    return (*_exact_no_op_rules(), *(rule for rule in original if id(rule) not in approximate))


@register_patch("onnx", "onnxscript.optimizer._constant_folding.PartialEvaluatorRegistry.lookup_evaluators")
def _patch_split_to_sequence_unknown_split(original):
    """onnxscript's constant folding of ``SplitToSequence`` (``_constant_folding.split_to_sequence``,
    onnxscript 0.7.2) reads ``split_value.ndim`` when the split input is a scalar whose value is not
    known (a size of a dynamic dim): "AttributeError: 'NoneType' object has no attribute 'ndim'", and
    the optimizer stops the export (ProphetNet's ngram stream split, onnx dynamic). Such a node cannot be
    folded; the evaluator now says so (returns None) instead of raising. Every other evaluator and
    every other failure is untouched.

    before: SplitToSequence(x, split=<dynamic scalar>) -> PassError (AttributeError in the evaluator)
    after:  SplitToSequence(x, split=<dynamic scalar>) left as it is
    """

    acted = ActedFlag()  # set when a fold was declined

    def not_folded_on_unknown_split(evaluator):
        @functools.wraps(evaluator)
        def evaluate(node, *args, **kwargs):
            try:
                return evaluator(node, *args, **kwargs)
            except AttributeError as exc:
                if "'NoneType' object has no attribute 'ndim'" not in str(exc):
                    raise
                acted.set()
                return None

        return evaluate

    def lookup_evaluators(self, domain, opname, version):
        evaluators = original(self, domain, opname, version)
        if (domain, opname) != ("", "SplitToSequence"):
            return evaluators
        return [not_folded_on_unknown_split(e) for e in evaluators]

    lookup_evaluators.acted = acted  # fired only when a fold was declined
    return lookup_evaluators


def root_op_type(rule) -> str | None:
    """The op type a rule's pattern matches at the node it is tried on (its first output node's), or None where
    that is not one fixed string (a pattern over several op types, a rule of another kind)."""
    from onnxscript.rewriter._pattern_ir import StringConstantPattern

    nodes = getattr(getattr(rule, "_target_pattern", None), "output_nodes", None)
    op = getattr(nodes[0], "op", None) if nodes else None
    return op.value() if isinstance(op, StringConstantPattern) else None


@register_patch("onnx", "onnxscript.rewriter._rewrite_rule.RewriteRule.try_rewrite")
def _patch_rules_tried_by_op_type(original):
    """Speed: a rewrite rule is not tried on a node of another op type than its pattern's root.

    Cause. The optimizer's rewrite pass tries each of its 46 rules on every node
    (``RewriteRuleSet._apply_to_graph_or_function``); each try builds a match state before the matcher
    compares the node's op type with the pattern's root, the first thing it checks. A quantized graph's
    QuantizeLinear / DequantizeLinear pairs triple the nodes: 75,454 tries in one int8 tiny-Llama export.

    What this changes. A rule whose root is one fixed op type returns "no match" at once for a node of
    another type, which is what the matcher returns for it (``NodePattern.matches`` fails on the op type
    before anything else); a rule over several op types, and any try under a matching tracer, runs as
    before. Measured (results/s35/rw.py): the optimizer's time in an ONNX export, fp32 / int8, LlamaModel
    0.20-0.27 s -> 0.11-0.16 s / 0.90-0.97 s -> 0.30-0.35 s; BertModel 0.12 -> 0.07 s / 0.32 -> 0.14 s. The
    fp32 models' bytes are the same with and without; ``tests/test_onnx_stages.py`` checks the optimized graph
    is the same.

    Remove when: onnxscript indexes its rules by root op type.
    """
    roots: dict[int, tuple[Any, str | None]] = {}  # id(rule) -> (rule, its root op type); the rule kept alive

    @functools.wraps(original)
    def try_rewrite(self, model, graph_or_function, node, *, verbose=None, tracer=None):
        kept = roots.get(id(self))
        if kept is None or kept[0] is not self:
            kept = roots[id(self)] = (self, root_op_type(self))
        if kept[1] is not None and tracer is None and node.op_type != kept[1]:
            return None
        return original(self, model, graph_or_function, node, verbose=verbose, tracer=tracer)

    return try_rewrite
