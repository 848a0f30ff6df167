"""One torch.export trace shared by the exports of one model on several backends, where their patches agree.

Each exporter traces the model itself (``exporters.tracing.trace``), with the torch patches of its own
backend: "dynamo"'s, plus ONNX's (adaptive pooling) or ExecuTorch's. Exporting one model on three backends
therefore traces it three times, though the three programs are usually the same. Inside
``shared_traces()`` the first trace of a (model, inputs, shape config) is kept, and a later export asking
for the same trace gets a copy of it instead of tracing again, when that gives the program its own trace
would have given:

- every patch that acted in the first trace is also installed for the second (a patch that acted changed
  the program; one that did not, left it as if it were absent), and
- no patch that the second would add was reached in the first. To know that, the first trace also
  installs a probe, a pass-through wrapper that only records the call, on the target of every other patch
  of the registry. A probe changes nothing the program computes.

Anything else traces again. So does an export whose model, inputs or shape config differ, and stage 0's
trace (the model PT2E prepares). Inputs are told apart by value (metadata, aliasing and the bytes: equal
inputs trace alike whichever objects hold them), a model by identity and the version of each parameter and
buffer. A module made anew for each export of one model (a generation component: ``FlatComponent`` over the
model and one captured call) says so with ``trace_identity()``: the model it wraps and a form that fixes
what the wrapper adds (the call's structure, its constants, its own buffers by value). Two backends'
generate items build their own components from their own captures of the same eager generate, so onnx's
prefill and decode take the traces dynamo's kept. Each export gets its own deep copy of the
kept program, since the backends' fixes and lowerings edit the program in place; a copy of a tiny model's
program costs about 10 ms against a 0.15-0.9 s trace.

One shape environment, one lowering. A deep copy shares the program's fake tensor mode and its ShapeEnv,
and lowering a program re-traces it (run_decompositions) in that ShapeEnv, leaving its own symbols and
asserts there. Two lowerings of one trace would see each other's: lowering tiny Llava to ExecuTorch after
ONNX had lowered the same trace failed ("Pending unbacked symbols {u3} not in returned outputs"), where
each alone passes. So only an export that does not lower its program (the dynamo exporter) keeps its
trace, and the first lowering export that takes it also removes it from the store: in the sweep's order
(dynamo, onnx, executorch), onnx takes dynamo's trace and executorch traces itself. What that saves is
in benchmarks/README.md, "One trace for several backends".

Off unless asked for: nothing is kept outside the block, and the block keeps the traces of the last model
only (with those of modules it holds or is held by: an encoder component's). The sweep turns it on for a
whole session (items of one class arrive together, in one process), for the forward and the generate
items, and records per item how many of its traces were taken from the store (``trace_reused``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from exporters.utils import BACKENDS, FiredLog, PatchEntry, PatchSet, Registry

_ACTIVE: list[TraceStore] = []


@dataclasses.dataclass
class Kept:
    model: torch.nn.Module  # the model traced: the module given, or the one a wrapper's trace_identity() names
    key: tuple
    traced: Any  # exporters.tracing.Traced, with the pristine program and no module
    installed: frozenset[str]  # names of the patches installed for the trace
    fired: tuple[str, ...]  # what the trace added to the fired log (patches that acted, and any other mark)
    probed: frozenset[str]  # names of the patches probed (all of the registry's others)
    reached: frozenset[str]  # of those, the ones whose target was called


class TraceStore:
    """The traces kept inside one ``shared_traces()`` block, for the last model traced."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._kept: list[Kept] = []
        self.hits = 0
        self.misses = 0

    def lookup(self, model: torch.nn.Module, key: tuple, patches: list[PatchEntry], lowers: bool) -> Kept | None:
        """The kept trace this export may take, if any; an export that ``lowers`` its program takes it away."""
        names = {p.name for p in patches}
        model = traced_model(model)
        for kept in self._kept:
            if kept.model is not model or kept.key != key:
                continue
            acted = {n for n in kept.fired if n in kept.installed}
            added = names - kept.installed
            if acted <= names and added <= kept.probed and not added & kept.reached:
                self.hits += 1
                if lowers:  # its ShapeEnv serves one lowering (module docstring)
                    self._kept.remove(kept)
                return kept
        self.misses += 1
        return None

    def keep(self, kept: Kept) -> None:
        """Keep ``kept``, and the traces of its model (or of a module holding it or held by it: a generation
        component traces the model's encoder alone) but for the one it replaces."""
        kept.model = traced_model(kept.model)
        self._kept = [k for k in self._kept if _related(k.model, kept.model) and k.key != kept.key] + [kept]


def _related(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return a is b or any(m is b for m in a.modules()) or any(m is a for m in b.modules())


def _probe(original):
    """A pass-through wrapper: PatchSet marks its entry as fired when it is called, which is all a probe says."""
    if not callable(original) or isinstance(original, type):
        return original

    @functools.wraps(original, updated=())  # not __dict__: an ``acted`` flag of a patch below belongs to it
    def probe(*args, **kwargs):
        return original(*args, **kwargs)

    for attr in ("cache_clear", "cache_info"):  # an lru_cache'd target (ShapeEnv._maybe_evaluate_static): its
        if hasattr(original, attr):  # callers clear the cache through whatever stands in its place
            setattr(probe, attr, getattr(original, attr))
    return probe


def active_store() -> TraceStore | None:
    from exporters.quantization.stage0 import in_quantization_trace

    return _ACTIVE[-1] if _ACTIVE and not in_quantization_trace() else None


@contextlib.contextmanager
def shared_traces(registry: Registry | None = None) -> Iterator[TraceStore]:
    """Within the block, exports of the same model and inputs on several backends share one torch.export
    trace where their patches agree (see the module docstring). ``registry``: the one whose other patches
    are probed (the default registry)."""
    from exporters.utils import DEFAULT_REGISTRY

    with activated(TraceStore(registry if registry is not None else DEFAULT_REGISTRY)) as store:
        yield store


@contextlib.contextmanager
def activated(store: TraceStore) -> Iterator[TraceStore]:
    """``store`` active within the block: the sweep keeps one store for its session and activates it around each
    sweep item only, so a unit test that runs after a sweep item on the same worker exports without it."""
    _ACTIVE.append(store)
    try:
        yield store
    finally:
        _ACTIVE.remove(store)


def module_identity(module: torch.nn.Module) -> tuple[torch.nn.Module, tuple]:
    """``module.trace_identity()`` where it has one (the model a wrapper wraps, and its form), else the module
    itself and no form."""
    identity = getattr(module, "trace_identity", None)
    return identity() if callable(identity) else (module, ())


def traced_model(module: torch.nn.Module) -> torch.nn.Module:
    """The model a trace of ``module`` is of: ``module``, or the model a wrapper's ``trace_identity()`` names."""
    return module_identity(module)[0]


def trace_key(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], constants: Mapping[str, Any],
              dynamic_shapes: Any, config) -> tuple | None:
    """What a trace depends on besides the patches: the model (its identity, and each parameter's and
    buffer's identity and version: an in-place change is a new key; for a wrapper with ``trace_identity()``,
    the wrapped model's and the wrapper's form), the inputs and baked constants by value (``fingerprint``),
    and the shape config. None where a constant or form has no stable repr (then nothing is shared)."""
    feed = fingerprints(tensors)
    try:
        owner, form = module_identity(model)
        baked = tuple((k, value_key(v)) for k, v in constants.items())
        shapes = repr(dynamic_shapes)
    except Exception:  # noqa: BLE001 - an object whose repr fails: no key
        return None
    state = (id(owner), tuple((id(t), t._version) for t in (*owner.parameters(), *owner.buffers())))
    return (state, form, feed, baked, shapes, config.strict, config.accept_size_one)


def fingerprint(t: torch.Tensor) -> tuple:
    """What a trace sees of a tensor: its metadata and, for a plain dense CPU tensor, a digest of its bytes
    (equal values trace alike whichever object holds them); for any other tensor, its identity and version."""
    strided = t.layout is torch.strided
    meta = (tuple(t.shape), tuple(t.stride()) if strided else str(t.layout), t.dtype, t.requires_grad, t.device.type,
            t.is_conj(), t.is_neg())
    if type(t) in (torch.Tensor, torch.nn.Parameter) and strided and t.device.type == "cpu" and not t.is_quantized:
        try:
            data = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
            raw = data.view(torch.uint8) if data.numel() else data.new_empty(0, dtype=torch.uint8)
            return (*meta, hashlib.blake2b(raw.numpy().tobytes(), digest_size=16).hexdigest())
        except (RuntimeError, TypeError):  # a dtype or view the byte view refuses: told apart by identity below
            pass
    return (*meta, id(t), t._version)


def value_key(value: Any) -> Any:
    """A constant as a trace sees it: a tensor's ``fingerprint`` (its repr elides large tensors), else its repr."""
    return fingerprint(value) if isinstance(value, torch.Tensor) else repr(value)


def fingerprints(tensors: Mapping[str, torch.Tensor]) -> tuple:
    """Each input's name and ``fingerprint``, and which earlier input it shares storage with (-1: none)."""
    ptrs: list[int] = []
    out = []
    for k, t in tensors.items():
        try:
            ptr = t.untyped_storage().data_ptr()
        except Exception:  # noqa: BLE001 - a tensor without storage (a subclass): no aliasing to tell
            ptr = -id(t)
        out.append((k, fingerprint(t), ptrs.index(ptr) if ptr in ptrs else -1))
        ptrs.append(ptr)
    return tuple(out)


def reuse(kept: Kept, fired: FiredLog):
    """A copy of the kept trace, its marks added to ``fired``."""
    fired.extend(kept.fired)
    return copied(kept.traced)


def copied(traced):
    """An export's own copy of a kept trace: the program, and the specs an artifact may narrow."""
    return dataclasses.replace(traced, program=copy.deepcopy(traced.program), input_names=list(traced.input_names),
                               output_names=list(traced.output_names), input_specs=copy.deepcopy(traced.input_specs),
                               constants=dict(traced.constants))


@dataclasses.dataclass
class Probes:
    probed: frozenset[str] = frozenset()
    reached: frozenset[str] = frozenset()


@contextlib.contextmanager
def probing(store: TraceStore, installed: list[PatchEntry]) -> Iterator[Probes]:
    """Within the block (entered after the real patches, so that a probe sees every call to its target,
    patched or not), a probe on the target of each registry patch not in ``installed``, among those whose
    module is already loaded (probing must import nothing; an unprobed patch is never assumed unreached).
    The yielded Probes are filled in on exit."""
    names = {p.name for p in installed}
    probes = [dataclasses.replace(p, factory=_probe, optional=True) for p in store.registry.patches(*BACKENDS)
              if p.name not in names and _loaded(p.path)]
    reached = FiredLog()
    result = Probes()
    probe_set = PatchSet()
    try:
        installed_probes = [p.name for p in probes if probe_set.install(p, reached)]
        yield result
    finally:
        probe_set.undo()
    result.probed = frozenset(installed_probes)
    result.reached = frozenset(reached.names())


def _loaded(path: str) -> bool:
    """Whether ``path`` resolves through modules already imported (without importing any)."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        obj = sys.modules.get(".".join(parts[:i]))
        if obj is None:
            continue
        for attr in parts[i:-1]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return False
        return hasattr(obj, parts[-1])
    return False
