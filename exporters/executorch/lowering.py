"""Lowering a traced program to an ExecuTorch program, and the export loop's retries.

``lower_with_retries`` lowers once and, when the lowering raises an error that a ``LoweringRetry``
names, lowers once more with that retry's change; ``lower_within_budget`` exports and lowers again while
the memory plan passes the budget. The retries are the records in ``LOWERING_RETRIES``: what starts
each one, what it changes, and the fix names it records (the inventory lists them).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.export.graph_signature import InputKind, OutputKind

from exporters.base import ExportConfig
from exporters.executorch.constant_scalars import fold_input_independent_scalars
from exporters.executorch.unbacked import _symbolic_sizes, bound_unbacked_sizes_by_trace, traced_unbacked_values
from exporters.utils import FiredLog, apply_patches
from exporters.workarounds.executorch.memory_planning import exact_planning_bounds, exact_share


class Lowered(NamedTuple):
    buffer: bytes  # the .pte program
    mutated: tuple[int, ...]  # mutated_user_inputs
    planned_bytes: int  # the memory its plan allocates when the method loads (every planned buffer)
    graph_module: Any = None  # the lowered program's graph, its tensor specs planned (exact_share reads it)


def planned_bytes(program) -> int:
    """What loading ``program`` (an ExecuTorch ``Program``) allocates for its planned tensors: each
    plan's non-constant buffers, sized for the upper bounds of every dynamic dim."""
    return sum(sum(plan.non_const_buffer_sizes) for plan in program.execution_plan)


def halved_max_dim(config: ExportConfig, inputs: dict[str, Any]) -> int | None:
    """The bound to export again with when the plan is too large: half of ``config.max_dim``, but not
    below the largest traced size among the dims it bounds, so every traced shape stays valid; None when
    nothing would change (explicit ``dynamic_shapes`` keep their bounds; a static export plans exactly).

    VJEPA2Model: its 2 x (T//2)(H//8)(W//8) predictor tokens reach 4,096 with every dim at 64, and an
    attention matrix per layer of 64 x 4 x 4,096^2 floats (16 GiB): load_method raised std::bad_alloc.
    Exported again at 32 it plans 398 MiB and passes, 3 dynamic shapes compared (``python -m sweeps.repro
    executorch-dynamic-VJEPA2Model``, 566 s beside a 2-worker sweep, two lowerings).
    """
    if config.dynamic_shapes is not None or not config.dynamic:
        return None
    traced = [s for t in inputs.values() if isinstance(t, torch.Tensor) for s in t.shape if s <= config.max_dim]
    smaller = max(config.max_dim // 2, max(traced, default=1))
    return smaller if smaller < config.max_dim else None


def large_dims_fixed(config: ExportConfig, inputs: dict[str, Any]) -> ExportConfig | None:
    """Where ``halved_max_dim`` stops at a traced size (every traced shape must stay valid) and the plan is still
    too large: the config with ``max_dim`` halved, the dims traced above the new bound fixed at their traced size and
    every other dim bounded by it (explicit ``dynamic_shapes``, as ``auto_dynamic_shapes`` gives them), and so on from
    there; None when no dim traced at 2 or more would stay below the bound. The artifact's bounds say which dims
    stayed dynamic.

    MllamaForConditionalGeneration's generate prefill: pixel_values [batch, images, tiles, 3, H, W] with every dim
    bounded by 32, the height and width traced at 32, planned 1152 GiB (std::bad_alloc at load) where halving stopped,
    and 36 GiB at 16 with them fixed."""
    from exporters.specialize import specialized_inputs
    from exporters.tracing import auto_dynamic_shapes

    bound = config.max_dim // 2
    baked = set(specialized_inputs(inputs, config.specialize))
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in baked}
    if not config.dynamic or not any(2 <= s < bound for t in tensors.values() for s in t.shape):
        return None  # no dim traced above 1 would keep a range (a static export is another artifact)
    shapes = auto_dynamic_shapes(tensors, bound, 1 if config.accept_size_one else 2)
    for name, t in tensors.items():
        for d, size in enumerate(t.shape):
            if size > bound:
                shapes[name][d] = None
    return dataclasses.replace(config, max_dim=bound, dynamic_shapes=shapes)


def mutated_user_inputs(program: torch.export.ExportedProgram) -> tuple[int, ...]:
    """Positions of the user inputs forward mutates in place, in the order the lowered program returns
    their new values (ahead of its outputs). The traced program still has the in-place op; the edge
    program, functionalized, lists the mutation. TvpModel's visual prompter does ``pixel_values *=
    mask``: the runtime returned 3 outputs where 2 were named, and the artifact refused its own run."""
    signature = program.graph_signature
    placeholders = [s.arg.name for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    return tuple(placeholders.index(s.target) for s in signature.output_specs if s.kind == OutputKind.USER_INPUT_MUTATION)


def per_op_partitioners(partitioners: list) -> list | None:
    """The partitioners with every XNNPACK one in per-op mode (each supported op its own delegate), or
    None when there is no XNNPACK partitioner to change. torch.fx's ``fuse_as_graphmodule`` refuses a
    partition that would depend on itself through another ("Invalid partition, found dependency
    cycles"); single-op partitions cannot. The program runs more delegate calls, with the same ops."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    if not any(isinstance(p, XnnpackPartitioner) for p in partitioners):
        return None
    return [XnnpackPartitioner(per_op_mode=True) if isinstance(p, XnnpackPartitioner) else p for p in partitioners]


def _forget_pending_unbacked(program: torch.export.ExportedProgram) -> None:
    """A lowering that failed midway leaves the unbacked symbols it had just created pending in the
    program's shape environment, and the next lowering then stops on them ("Pending unbacked
    symbols {u8, ...} not in returned outputs"): drop them before lowering again."""
    for node in program.graph.nodes:
        for _, size in _symbolic_sizes(node):
            size.node.shape_env.pending_fresh_unbacked_symbols.clear()
            return


@contextlib.contextmanager
def cpu_conv_heuristics_off():
    """Lower with oneDNN (mkldnn) and NNPACK off, as torch.export traces and decomposes.

    Cause. The fake kernel of ``aten.convolution`` asks ATen which CPU kernel eager mode would pick
    (``_select_conv_backend``) to give its output the memory format that kernel would. With oneDNN
    on, that choice compares the batch with 16 for an unstrided, undilated conv (ATen's CPU kernel
    heuristics), and with a backed batch this is a guard: the edge passes' re-trace records
    ``batch < 16`` and narrows the batch's range, and ExecuTorch then plans the program for it.
    torch.export turns these backends off while it traces and runs decompositions
    (``_ignore_backend_decomps``), so its ranges never see the guard; ExecuTorch's passes run with
    them on. EfficientLoFTRModel, whose pairs are folded into a conv batch of ``2*s99``, got
    ``2*s99 < 16`` and a program planned for batch 7 of the [2, 64] torch.export allowed.

    This only changes the memory format the fake conv reports while lowering; the program and the
    runtime kernels are ExecuTorch's. Remove it when ExecuTorch's passes trace with ATen's backend
    selection off (executorch#19262, for XNNPACK's own passes only, ran them with
    ``backed_size_oblivious`` against the same kind of narrowing)."""
    mkldnn = torch.backends.mkldnn.set_flags(_enabled=False, _fp32_precision=None)  # the rest as they are
    nnpack = torch.backends.nnpack.set_flags(False)
    try:
        yield
    finally:
        torch.backends.mkldnn.set_flags(*mkldnn)
        torch.backends.nnpack.set_flags(*nnpack)


def _lower_program(program, partitioners, et_patches, fired, constant_methods=None) -> Lowered:
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    # no_grad: a program that still has complex ops fails here with grad on ("view_as_complex_copy
    # does not support automatic differentiation for outputs with complex dtype")
    with apply_patches(et_patches, fired), torch.no_grad(), cpu_conv_heuristics_off():
        edge = to_edge_transform_and_lower(
            program, partitioner=partitioners, compile_config=EdgeCompileConfig(_check_ir_validity=False),
            constant_methods=dict(constant_methods) if constant_methods else None,
        )
        buffers_keep_their_values(edge.exported_program())
        lowered = edge.to_executorch()
        return Lowered(lowered.buffer, mutated_user_inputs(edge.exported_program()), planned_bytes(lowered.executorch_program),
                       lowered.exported_program().graph_module)


def buffers_keep_their_values(program) -> None:
    """Serialize every buffer's value, mutated or not. ExecuTorch gives a buffer the graph mutates "a
    meaningless initial state" (only shape and dtype are saved) unless its placeholder has
    ``meta["et_init_buffer"]``. A module that reassigns its buffer in forward
    (``self.pos_encoding = self.pos_encoding.to(dtype)``, CTRL) becomes such a mutation after
    to_edge, and the program then read zeros: CTRLModel's last_hidden_state was off by 2.9 on every
    element. Eager's buffers start with their values; so do the artifact's."""
    buffers = program.graph_signature.inputs_to_buffers
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.target in buffers:
            node.meta["et_init_buffer"] = True


# ── the retries ──────────────────────────────────────────────────────────────


class Attempt(NamedTuple):
    """What one lowering is given: the fixed program and the partitioners."""

    program: torch.export.ExportedProgram
    partitioners: list
    constant_methods: Any = None  # ExecutorchConfig.constant_methods: methods returning a constant


@dataclasses.dataclass(frozen=True)
class RetryContext:
    """What a retry may use besides the failed attempt: the traced inputs (in program order), a
    function exporting the model again (a program no lowering has touched) and one applying the
    registry's program and node fixes to a program."""

    inputs: list
    retrace: Callable[[], torch.export.ExportedProgram] | None
    fixed: Callable[[torch.export.ExportedProgram], torch.export.ExportedProgram]


@dataclasses.dataclass(frozen=True)
class LoweringRetry:
    """One retry of the export loop. ``error`` and ``message`` say which lowering failure starts it
    (an exception of that type whose message contains ``message``); None for the memory-plan retries,
    which ``lower_within_budget`` runs on the plan's size. ``change(attempt, context)`` returns the
    attempt to lower again and the fix names to record, or None when it has nothing to change (the
    error then stands). ``fixes`` names every fix it can record, with what each does."""

    trigger: str
    fixes: dict[str, str]
    error: type[BaseException] | None = None
    message: str = ""
    change: Callable[[Attempt, RetryContext], tuple[Attempt, list[str]] | None] | None = None

    def starts_on(self, exc: BaseException) -> bool:
        return self.error is not None and isinstance(exc, self.error) and self.message in str(exc)


def _per_op_partitions(attempt: Attempt, context: RetryContext) -> tuple[Attempt, list[str]] | None:
    """Fusing XNNPACK's partitions one by one made one depend on another both ways
    (FlavaForPreTraining): lower again with one partition per op, which cannot form a cycle."""
    per_op = per_op_partitioners(attempt.partitioners)
    if per_op is None:
        return None
    return attempt._replace(partitioners=per_op), ["fix:executorch:per_op_partitions_on_cycle"]


def _bounded_unbacked_sizes(attempt: Attempt, context: RetryContext) -> tuple[Attempt, list[str]] | None:
    """Only when planning needs it: a size the graph already bounds (a slice of a known length) must
    keep running for any value up to that bound, not just up to the traced one."""
    if not context.inputs:
        return None
    program = attempt.program
    if context.retrace is not None:
        # the failed lowering re-traced this program and renamed its fresh unbacked symbols to the
        # program's own: re-tracing it again then meets its own names ("u1 possible memo disaster",
        # Lfm2Vl); a fresh export has a fresh shape environment
        program = context.fixed(context.retrace())
    # a scalar no input can change is an int (Ernie 4.5-VL's offsets); what stays data-dependent is
    # bounded by the value it takes on the traced inputs
    try:
        values = traced_unbacked_values(program, list(context.inputs))
    except Exception:  # noqa: BLE001 - the graph does not run eagerly on its inputs: fold nothing,
        values = {}    # the lowering's own error stands
    folded = fold_input_independent_scalars(program, values)
    fired = ["fix:executorch:fold_input_independent_scalars"] if folded else []
    bounded = bound_unbacked_sizes_by_trace(program, list(context.inputs))
    if not (bounded or folded):
        return None
    return attempt._replace(program=program), fired + sorted(bounded or ())


LOWERING_RETRIES: tuple[LoweringRetry, ...] = (
    LoweringRetry(
        trigger="the memory plan passes ExecutorchConfig.memory_budget_mb and exact_share < 0.5",
        fixes={"fix:executorch:exact_bounds_to_fit_memory":
               "a plan past the memory budget whose interval bounds far exceed the sizes' true maxima is "
               "lowered again planning every size at its true maximum"},
    ),
    LoweringRetry(
        trigger="the memory plan passes ExecutorchConfig.memory_budget_mb",
        fixes={"fix:executorch:bounds_halved_to_fit_memory":
               "a plan past the memory budget is exported again with max_dim halved, never below a traced size"},
    ),
    LoweringRetry(
        trigger="the memory plan passes ExecutorchConfig.memory_budget_mb where halving stopped at a traced size",
        fixes={"fix:executorch:large_dims_fixed_to_fit_memory":
               "an export that chose its own bounds is exported again with max_dim halved and the dims traced above "
               "it fixed at their traced size, while a dim traced at 2 or more stays dynamic"},
    ),
    LoweringRetry(
        trigger="AssertionError: Invalid partition, found dependency cycles",
        error=AssertionError, message="found dependency cycles", change=_per_op_partitions,
        fixes={"fix:executorch:per_op_partitions_on_cycle":
               "XNNPACK partitions that depend on each other both ways are lowered again one op a partition"},
    ),
    LoweringRetry(
        trigger="RuntimeError: ... finite upper bound (memory planning of a data-dependent size)",
        error=RuntimeError, message="finite upper bound", change=_bounded_unbacked_sizes,
        fixes={"fix:executorch:fold_input_independent_scalars":
               "a data-dependent scalar no input can change is folded to the int it takes on the traced inputs",
               "fix:executorch:bound_unbacked_sizes_by_trace":
               "a data-dependent size without an upper bound is bounded by its value on the traced inputs",
               "fix:executorch:bound_unbacked_sizes_by_source":
               "a data-dependent size whose values follow from the program's shapes is bounded by that source"},
    ),
)


def retry_fixes() -> dict[str, str]:
    """Every fix name a retry can record, with what it does (for the inventory)."""
    return {name: doc for retry in LOWERING_RETRIES for name, doc in retry.fixes.items()}


def lower_with_retries(attempt: Attempt, et_patches, fired: FiredLog, context: RetryContext) -> Lowered:
    """Lower ``attempt``; on a failure that a retry in LOWERING_RETRIES starts on, lower once more with
    that retry's change. A failure no retry takes, or one whose retry has nothing to change, stands."""
    try:
        return _lower_program(attempt.program, attempt.partitioners, et_patches, fired, attempt.constant_methods)
    except Exception as exc:
        retry = next((r for r in LOWERING_RETRIES if r.starts_on(exc)), None)
        changed = retry.change(attempt, context) if retry is not None else None
        if changed is None:
            raise
        attempt, names = changed
    fired.extend(names)
    _forget_pending_unbacked(attempt.program)
    return _lower_program(attempt.program, attempt.partitioners, et_patches, fired, attempt.constant_methods)


def lower_within_budget(export_and_lower: Callable[[Any], tuple[Any, Lowered]], config: ExportConfig,
                        inputs: dict[str, Any], fired: FiredLog) -> tuple[Any, Lowered, ExportConfig]:
    """``export_and_lower(config) -> (traced, lowered)``, run again while the memory plan passes
    ``config.memory_budget_mb``: first planning every size at its true maximum where interval
    arithmetic overshot (exact_bounds_to_fit_memory), then with max_dim halved down to the largest
    traced size (bounds_halved_to_fit_memory), then on down with the dims traced above it fixed
    (large_dims_fixed_to_fit_memory, where the export chose its own bounds). Returns the last traced, lowered and
    config."""
    traced, lowered = export_and_lower(config)
    budget = config.memory_budget_mb << 20
    exact = False
    automatic = config.dynamic and config.dynamic_shapes is None  # the export's own bounds, which may be fixed
    if lowered.planned_bytes > budget and exact_share(lowered.graph_module) < 0.5:
        # interval arithmetic planned some sizes far past their true maxima (Swin2SR's window
        # dims): plan every size at its true maximum, keeping the bounds
        fired.add("fix:executorch:exact_bounds_to_fit_memory")
        exact = True
        with exact_planning_bounds():
            traced, lowered = export_and_lower(config)
    while lowered.planned_bytes > budget:
        smaller = halved_max_dim(config, inputs)
        if smaller is not None:
            fired.add("fix:executorch:bounds_halved_to_fit_memory")
            config = dataclasses.replace(config, max_dim=smaller)
        else:
            fixed = large_dims_fixed(config, inputs) if automatic else None
            if fixed is None:
                break  # the artifact reports what it plans; loading it may still fail for memory
            fired.add("fix:executorch:large_dims_fixed_to_fit_memory")
            config = fixed
        with exact_planning_bounds() if exact else contextlib.nullcontext():
            traced, lowered = export_and_lower(config)
    return traced, lowered, config
