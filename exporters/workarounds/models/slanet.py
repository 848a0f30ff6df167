"""Model patch (SLANet, SLANeXt): the table-structure head's greedy decode as a fixed number of steps,
cut where eager would have stopped.

Cause. ``SLANetSLAHead.forward`` (models/slanet/modeling_slanet.py:181, and SLANeXt's copy,
models/slanext/modeling_slanext.py:589) decodes up to ``max_text_length + 1`` steps and leaves the loop
as soon as every sample has emitted the end token:

    if torch.stack(structure_ids_list, dim=1).eq(self.config.out_channels - 1).any(-1).all(): break

a Python branch on predicted values, which torch.export cannot take ("Could not guard on
data-dependent expression"). The number of steps, and with it the output length, depends on the
predictions.

What this changes (while tracing only, and only when neither hidden states nor attentions are asked
for: those are per-step lists whose length would be data-dependent). The head runs all
``max_text_length + 1`` steps, then keeps the steps eager would have run. Steps are causal (step t
reads steps < t only), so the kept steps are the ones eager computes. Whether every sample has ended
by step t is monotone in t, so eager's step count is ``T - (number of steps at which all have ended)
+ 1``, capped at ``T``: a size read from the data once (an unbacked size in ``[1, T]``) instead of a
branch per step.

    before: for t in range(T): step(); if all_ended(t): break            -> (B, steps, C)
    after:  for t in range(T): step();  n = min(T, T - sum(all_ended) + 1);  preds[:, :n]

ONNX: the same decode as one traced step looped by ``torch.scan`` (``decode_scan``), which torch.onnx
writes as an ONNX ``Scan``: the graph holds one step instead of ``max_text_length + 1`` copies of it.
SLANeXtForTableRecognition at its default ``max_text_length`` (500) took 555 s to export unrolled
(static ONNX); with the scan, 20.9 s and 57.7 s in two runs (``python benchmarks/slanext_decode.py``, beside another
benchmark on the 2 cores). Dynamic ONNX exports (torch.onnx's Scan translation fails on a symbolic
batch: "'SymInt' object has no attribute 'unsqueeze'") keep the unrolled steps.

ExecuTorch, static exports: the same scan (its emitter writes the loop as one sub-method). Unrolled at
the default ``max_text_length``, SLANeXt's static ExecuTorch export grew past 21 GB and was killed
after 249 s; with the scan it took 13.3 s (results/s31/audit, issue 35). Dynamic ExecuTorch exports
keep the unrolled steps: with the scan and a symbolic batch, the program fails at run time in the
carry's ``copy_`` ("tensor_is_broadcastable_to(src, in)", op_copy.cpp:83). The dynamo backend keeps the
unrolled steps (21 s at 500): its artifact is an ``ExportedProgram`` that users save and load, and
a program holding ``torch.scan`` is a higher-order op many consumers of that format do not take.

Quantized exports keep the unrolled steps in the trace PT2E prepares: a program holding the scan fails
after convert, at the second export ("Attempting to use FunctionalTensor on its own", on both backends).

    before (onnx, executorch): 501 unrolled steps            after: scan(step, init, xs of length 501)

Remove when: ``SLANetSLAHead.forward`` and SLANeXt's copy decode a fixed number of steps with the
output masked after the end token, instead of a ``break`` on predicted values (transformers'
modeling_slanet.py, modeling_slanext.py): check with ``python -m sweeps.recheck workarounds --only
patch:dynamo:transformers.models.slanet.modeling_slanet.SLANetSLAHead.forward``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from exporters.quantization.stage0 import in_quantization_trace
from exporters.utils import ActedFlag, register_patch

HEAD_PATHS: tuple[str, ...] = (
    "transformers.models.slanet.modeling_slanet.SLANetSLAHead.forward",
    "transformers.models.slanext.modeling_slanext.SLANeXtSLAHead.forward",
)


def steps_eager_runs(ids: torch.Tensor, end_token: int) -> torch.Tensor:
    """How many steps the eager loop runs, as a 0-d tensor: ``ids`` (batch, T) holds every step's
    prediction; eager stops after the first step by which every sample has emitted ``end_token``."""
    total = ids.shape[1]
    ended = ids.eq(end_token).to(torch.int64).cumsum(dim=1).gt(0)  # sample b has ended by step t
    all_ended = ended.all(dim=0).to(torch.int64).sum()  # steps at which all have: the last ones
    return torch.clamp(total - all_ended + 1, max=total)


def decode_fixed_steps(head, hidden_states: torch.Tensor) -> torch.Tensor:
    """The head's softmaxed structure predictions (batch, steps, classes), the same as eager's, computed
    with ``max_text_length + 1`` steps and cut at the step count eager reaches."""
    config = head.config
    batch = hidden_states.shape[0]
    features = torch.zeros((batch, config.hidden_size), dtype=torch.float32, device=hidden_states.device)
    predicted = torch.zeros(size=[batch], dtype=torch.long, device=hidden_states.device)
    steps, ids = [], []
    for _ in range(config.max_text_length + 1):
        embedding = F.one_hot(predicted, config.out_channels).float()
        features, _ = head.structure_attention_cell(features, hidden_states.float(), embedding)
        step = head.structure_generator(features)
        predicted = step.argmax(dim=1)
        steps.append(step)
        ids.append(predicted)
    count = steps_eager_runs(torch.stack(ids, dim=1), config.out_channels - 1).item()
    torch._check(count >= 1)
    torch._check(count <= len(steps))
    preds = torch.stack(steps, dim=1)[:, :count]
    return F.softmax(preds, dim=-1, dtype=torch.float32).to(hidden_states.dtype)


def decode_scan(head, hidden_states: torch.Tensor) -> torch.Tensor:
    """``decode_fixed_steps`` with the steps looped by ``torch.scan`` over one traced step. The carry is
    the features and the previous prediction as its one-hot embedding (all float: scan's tracing
    refuses integer outputs under autograd, "outs_to_grad length != tangents length"); each step's
    prediction is read back from its logits after the loop, the same ``argmax``."""
    from torch._higher_order_ops.scan import scan

    config = head.config
    batch = hidden_states.shape[0]
    memory = hidden_states.float()
    features = torch.zeros((batch, config.hidden_size), dtype=torch.float32, device=hidden_states.device)
    first = torch.zeros(size=[batch], dtype=torch.long, device=hidden_states.device)
    embedding = F.one_hot(first, config.out_channels).float()

    def step(carry, _):
        features, embedding = carry
        features, _ = head.structure_attention_cell(features, memory, embedding)
        logits = head.structure_generator(features)
        embedding = F.one_hot(logits.argmax(dim=1), config.out_channels).float()
        return (features.clone(), embedding), logits

    with torch.no_grad():
        _, steps = scan(step, (features, embedding), torch.zeros(config.max_text_length + 1, 1, device=hidden_states.device))
    steps = steps.transpose(0, 1)
    count = steps_eager_runs(steps.argmax(dim=2), config.out_channels - 1).item()
    torch._check(count >= 1)
    torch._check(count <= steps.shape[1])
    return F.softmax(steps[:, :count], dim=-1, dtype=torch.float32).to(hidden_states.dtype)


def _asks_for_step_lists(head, kwargs) -> bool:
    return any(kwargs.get(name, getattr(head.config, name, False)) for name in ("output_hidden_states", "output_attentions"))


@register_patch("dynamo", *HEAD_PATHS)
def _patch_structure_decode_fixed_steps(original):
    """The table-structure head leaves its greedy loop on a data-dependent test: all steps run, and the
    output is cut at the step count eager reaches.

    before: for t in range(T): step(); if all_ended(t): break
    after:  for t in range(T): step();  preds[:, :min(T, T - sum(all_ended) + 1)]
    """

    @functools.wraps(original)
    def forward(self, hidden_states, targets=None, **kwargs):
        if _asks_for_step_lists(self, kwargs):
            return original(self, hidden_states, targets, **kwargs)
        from transformers.modeling_outputs import BaseModelOutput

        return BaseModelOutput(last_hidden_state=decode_fixed_steps(self, hidden_states))

    return forward


def scanned(original):
    """The head's forward decoding with ``decode_scan``, where the scan can be carried: not for the
    per-step lists, not on a symbolic batch or length (dynamic exports: torch.onnx's Scan translation
    fails on it, "'SymInt' object has no attribute 'unsqueeze'", and ExecuTorch's program fails at run
    in the carry's copy), and not in the trace PT2E prepares (``in_quantization_trace``). Elsewhere
    ``original`` (the dynamo patch's unrolled steps) runs. Fired only when the scan was used."""
    acted = ActedFlag()

    @functools.wraps(original)
    def forward(self, hidden_states, targets=None, **kwargs):
        if _asks_for_step_lists(self, kwargs) or any(isinstance(d, torch.SymInt) for d in hidden_states.shape) \
                or in_quantization_trace():
            return original(self, hidden_states, targets, **kwargs)
        from transformers.modeling_outputs import BaseModelOutput

        acted.set()
        return BaseModelOutput(last_hidden_state=decode_scan(self, hidden_states))

    forward.acted = acted
    return forward


@register_patch("onnx", *HEAD_PATHS)
def _patch_structure_decode_scanned(original):
    """ONNX, static exports: the table-structure decode as one step looped by ``torch.scan`` (an ONNX
    Scan) instead of ``max_text_length + 1`` unrolled steps, cut at the step count eager reaches.

    before: 501 unrolled steps (SLANeXt's default: 555 s to export)
    after:  scan(step, (features, embedding), xs of length T);  preds[:, :min(T, T - sum(all_ended) + 1)]
    """
    return scanned(original)


@register_patch("executorch", *HEAD_PATHS)
def _patch_structure_decode_scanned_executorch(original):
    """ExecuTorch, static exports: the table-structure decode as one step looped by ``torch.scan`` instead
    of ``max_text_length + 1`` unrolled steps, cut at the step count eager reaches.

    before: 501 unrolled steps (SLANeXt's default: past 21 GB, killed after 249 s)
    after:  scan(step, (features, embedding), xs of length T);  preds[:, :min(T, T - sum(all_ended) + 1)]
    """
    return scanned(original)
