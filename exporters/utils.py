"""Workaround registries shared by the three exporters, and the output flattening they agree on.

A workaround is a *patch* (swapped in for the duration of one export and then reverted) or a
*fix* (a rewrite of the traced graph, which has nothing to revert). Both are registered with a
decorator and installed by the exporter of their backend at the right stage:

    @register_patch("dynamo", "transformers.models.x.modeling_x.XRouter._cast")
    def _patch_cast(original):           # the factory receives what was there
        return lambda self, *a, **k: None  # ... and returns the replacement

    @register_fx_node_fix("onnx")
    def _fix_something(graph_module, node) -> bool:   # True when it changed the node
        ...

    @register_fx_program_fix("executorch")
    def _fix_program(program, *, config):   # -> (program, modified)
        ...

A registry is a class with a default instance; every decorator takes ``registry=`` so tests
register into a fresh ``Registry()`` and nothing leaks into the real one. Patches are recorded
like pytest's monkeypatch: (target, name, old value or NOTSET), undone in reverse, class
attributes read from ``__dict__`` so staticmethod/classmethod survive. A path that does not
resolve is an error naming the path, unless the patch was registered ``optional=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from .pytrees import flatten_outputs, leaf_names_and_values  # noqa: F401 - the names every caller imports from here

BACKENDS = ("dynamo", "onnx", "executorch")


def exception_headline(exc: BaseException) -> str:
    """``"<type>: <first line of the message>"``, for an error message that names a cause without its traceback."""
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


class WorkaroundError(ValueError):
    """A workaround is registered wrongly (bad backend, duplicate path) or its target is gone."""


class PatchTargetError(WorkaroundError, AttributeError):
    """A patch path does not resolve to anything in the installed libraries."""


# ── registration records ──────────────────────────────────────────────────────


@dataclasses.dataclass(frozen=True)
class PatchEntry:
    backend: str
    path: str
    factory: Callable[[Any], Any]
    optional: bool = False

    @property
    def name(self) -> str:
        return f"patch:{self.backend}:{self.path}"


@dataclasses.dataclass(frozen=True)
class FixEntry:
    backend: str
    kind: str  # "node" or "program"
    fn: Callable[..., Any]

    @property
    def name(self) -> str:
        return f"fix:{self.backend}:{self.fn.__name__}"


def _describe(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise WorkaroundError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")


# The folders whose modules register workarounds, by what they patch. The default registry imports
# every module in them (``_*.py`` helper modules aside) the first time it is read, so a workaround is
# in use as soon as its file is in one of these folders; nothing has to import it for its side effect.
WORKAROUND_PACKAGES: tuple[str, ...] = (
    "exporters.workarounds.models",           # transformers model code, one file per model family
    "exporters.workarounds.torch_internals",  # torch internals: symbolic shapes, sympy, decompositions
    "exporters.workarounds.onnx",             # torch.onnx / onnxscript: patches, node fixes, translations, IR fixes
    "exporters.workarounds.executorch",       # ExecuTorch's planner, partitioner and runtime
    "exporters.workarounds.quantization",     # PT2E quantization: torchao, XNNPACK's quantizer (stage 0 only)
)

# patch paths installed around stage 0 (PT2E prepare, calibration, convert) only, never around a trace or
# a lowering: resolving them imports torchao and XNNPACK's quantizer, which an fp32 export does not need; and
# fx's purity test, which stage 0's dead-code elimination asks (exporters/workarounds/quantization/vmap_nesting.py)
QUANTIZATION_INTERNALS: tuple[str, ...] = ("torchao.", "executorch.backends.xnnpack.quantizer.",
                                           "torch._library.utils.is_impure")


def split_quantization_patches(entries: Iterable[PatchEntry]) -> tuple[list[PatchEntry], list[PatchEntry]]:
    """(the entries for traces and lowerings, the entries for stage 0)."""
    entries = list(entries)
    return ([e for e in entries if not e.path.startswith(QUANTIZATION_INTERNALS)],
            [e for e in entries if e.path.startswith(QUANTIZATION_INTERNALS)])


def workaround_modules(packages: Iterable[str] = WORKAROUND_PACKAGES) -> list[str]:
    """The modules the default registry loads: every non-``_`` module of ``packages``, by name."""
    import pkgutil

    names = []
    for package in packages:
        folder = importlib.import_module(package)
        names += sorted(f"{package}.{m.name}" for m in pkgutil.iter_modules(folder.__path__) if not m.name.startswith("_"))
    return names


class Registry:
    """Patches and fixes per backend. ``DEFAULT_REGISTRY`` is the one the exporters use.

    A registry made with ``packages`` loads the workaround modules in them the first time it is read
    (``patches``, ``fixes``, ``all_workarounds``, ``without``), and lists its entries in a fixed
    order whatever was imported first: by package (in ``packages`` order), module name and line of
    definition. One made without (a test's ``Registry()``) lists them as they were registered."""

    def __init__(self, packages: tuple[str, ...] = ()) -> None:
        self._patches: dict[str, dict[str, PatchEntry]] = {b: {} for b in BACKENDS}
        self._fixes: dict[tuple[str, str], list[FixEntry]] = {(b, k): [] for b in BACKENDS for k in ("node", "program")}
        self._packages = tuple(packages)
        self._loaded = not self._packages

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # before importing: a module that reads the registry must not load it again
        try:
            for name in workaround_modules(self._packages):
                importlib.import_module(name)
        except BaseException:
            self._loaded = False
            raise

    def _ordered(self, entries: Iterable[PatchEntry | FixEntry]) -> list:
        entries = list(entries)
        if not self._packages:
            return entries

        def origin(entry: PatchEntry | FixEntry) -> tuple[int, str, int]:
            fn = entry.factory if isinstance(entry, PatchEntry) else entry.fn
            module = getattr(fn, "__module__", "") or ""
            rank = next((i for i, p in enumerate(self._packages) if module.startswith(p + ".")), len(self._packages))
            return rank, module, getattr(getattr(fn, "__code__", None), "co_firstlineno", 0)

        return sorted(entries, key=origin)  # stable: one factory's paths keep their order

    # registration
    def add_patch(self, backend: str, path: str, factory: Callable, *, optional: bool = False) -> PatchEntry:
        _check_backend(backend)
        if not isinstance(path, str) or "." not in path:
            raise WorkaroundError(f"patch path must be a dotted path like 'pkg.module.Class.method', got {path!r}")
        existing = self._patches[backend].get(path)
        if existing is not None:
            raise WorkaroundError(
                f"{path!r} is already patched for backend {backend!r} by {_describe(existing.factory)}; "
                f"{_describe(factory)} cannot patch it again (merge the two factories)"
            )
        entry = PatchEntry(backend, path, factory, optional)
        self._patches[backend][path] = entry
        return entry

    def add_fix(self, backend: str, kind: str, fn: Callable) -> FixEntry:
        _check_backend(backend)
        if backend == "dynamo":
            raise WorkaroundError(
                f"{_describe(fn)}: DynamoExporter has no fix stage (its graph is the model's); register the "
                "fix for 'onnx' or 'executorch', or write a @register_patch('dynamo', ...) model patch"
            )
        entries = self._fixes[(backend, kind)]
        if any(e.fn is fn for e in entries):
            raise WorkaroundError(f"{_describe(fn)} is already registered as a {kind} fix for {backend!r}")
        entry = FixEntry(backend, kind, fn)
        entries.append(entry)
        return entry

    # queries
    def patches(self, *backends: str) -> list[PatchEntry]:
        self._load()
        out = []
        for backend in backends:
            _check_backend(backend)
            out.extend(self._ordered(self._patches[backend].values()))
        return out

    def fixes(self, backend: str, kind: str) -> list[FixEntry]:
        self._load()
        _check_backend(backend)
        return self._ordered(self._fixes[(backend, kind)])

    def without(self, *names: str) -> Registry:
        """A copy of this registry minus the workarounds named (``patch:onnx:torch.where``,
        ``fix:executorch:_fix_x``), to check whether a model still needs them. Unknown names raise."""
        known = {w.name for w in self.all_workarounds()}
        unknown = [n for n in names if n not in known]
        if unknown:
            import difflib

            close = {n: difflib.get_close_matches(n, known, n=3) for n in unknown}
            raise WorkaroundError(f"no registered workaround named {unknown}; close matches: {close}")
        copy = Registry()  # already loaded: it keeps this registry's order
        for backend in BACKENDS:
            copy._patches[backend] = {e.path: e for e in self.patches(backend) if e.name not in names}
            for kind in ("node", "program"):
                copy._fixes[(backend, kind)] = [e for e in self.fixes(backend, kind) if e.name not in names]
        return copy

    def all_workarounds(self) -> list[PatchEntry | FixEntry]:
        out: list[PatchEntry | FixEntry] = []
        for backend in BACKENDS:
            out.extend(self.patches(backend))
            for kind in ("program", "node"):
                out.extend(self.fixes(backend, kind))
        return out


DEFAULT_REGISTRY = Registry(WORKAROUND_PACKAGES)


def register_patch(backend: str, *paths: str, optional: bool = False, registry: Registry | None = None):
    """Register a patch factory for one or more dotted paths (see the module docstring)."""
    if not paths:
        raise WorkaroundError("register_patch needs at least one dotted path")
    reg = registry if registry is not None else DEFAULT_REGISTRY

    def decorator(factory: Callable) -> Callable:
        for path in paths:
            reg.add_patch(backend, path, factory, optional=optional)
        return factory

    return decorator


def register_fx_node_fix(backend: str, *, registry: Registry | None = None):
    """Register ``fn(graph_module, node) -> bool`` (True when it changed the graph)."""
    reg = registry if registry is not None else DEFAULT_REGISTRY

    def decorator(fn: Callable) -> Callable:
        reg.add_fix(backend, "node", fn)
        return fn

    return decorator


def register_fx_program_fix(backend: str, *, registry: Registry | None = None):
    """Register ``fn(exported_program, *, config) -> (exported_program, modified)``."""
    reg = registry if registry is not None else DEFAULT_REGISTRY

    def decorator(fn: Callable) -> Callable:
        reg.add_fix(backend, "program", fn)
        return fn

    return decorator


# ── resolving and installing patches ──────────────────────────────────────────

NOTSET = object()


def resolve_path(path: str) -> tuple[Any, str]:
    """Return ``(owner, attribute)`` for a dotted path: the longest importable module prefix,
    then attribute access. Raises PatchTargetError naming the path and the part that failed."""
    parts = path.split(".")
    module = None
    index = 0
    for i in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        index = i
        break
    if module is None:
        raise PatchTargetError(f"patch path {path!r} does not resolve: no importable module in it")
    owner: Any = module
    for j in range(index, len(parts) - 1):
        try:
            owner = getattr(owner, parts[j])
        except AttributeError:
            found = ".".join(parts[:j])
            raise PatchTargetError(
                f"patch path {path!r} does not resolve: {found!r} has no attribute {parts[j]!r} "
                f"(was it renamed in this version of {parts[0]}?)"
            ) from None
    name = parts[-1]
    if not hasattr(owner, name):
        raise PatchTargetError(
            f"patch path {path!r} does not resolve: {'.'.join(parts[:-1])!r} has no attribute {name!r} "
            f"(was it renamed in this version of {parts[0]}?)"
        )
    return owner, name


def model_module_loaded(path: str) -> bool:
    """False for a path inside a transformers modeling module that this process has not imported.

    A model of that family cannot exist without its module, so its patch has nothing to do, and
    resolving it would import the module: patches that cover many families (one per attention
    class) would otherwise import dozens of modeling modules on every first export (~8 s for 35).
    Paths anywhere else are always resolved, and a misspelled path is still an error wherever the
    family is in use."""
    parts = path.split(".")
    if len(parts) < 4 or parts[:2] != ["transformers", "models"]:
        return True
    return ".".join(parts[:4]) in sys.modules


def _current(owner: Any, name: str) -> Any:
    """What ``owner.name`` holds, the raw descriptor for class attributes (NOTSET if inherited)."""
    if inspect.isclass(owner):
        return owner.__dict__.get(name, NOTSET)
    return getattr(owner, name)


class FiredLog:
    """Which workarounds actually did something during one export (not just which were installed)."""

    def __init__(self) -> None:
        self._names: list[str] = []

    def add(self, name: str) -> None:
        if name not in self._names:
            self._names.append(name)

    def extend(self, names: Iterable[str]) -> None:
        for n in names:
            self.add(n)

    def names(self) -> list[str]:
        return list(self._names)


class ActedFlag:
    """The ``acted`` attribute of a patch that acts on some calls only (see ``_counting``): the
    replacement calls ``set()`` when a call changed something; reading it (calling the flag) returns
    whether one did since the last read and clears it, so nested calls are counted once."""

    def __init__(self) -> None:
        self._acted = False

    def set(self) -> None:
        self._acted = True

    def __call__(self) -> bool:
        acted, self._acted = self._acted, False
        return acted


def _counting(replacement: Any, name: str, fired: FiredLog) -> Any:
    """Wrap a callable replacement so that calling it marks the patch as fired. A replacement that
    acts on some calls only (one wrapping a function torch calls on every export) has an
    ``acted() -> bool`` attribute, asked after each call, which says whether that call did; the
    other calls do not mark it."""
    if not callable(replacement) or inspect.isclass(replacement):
        fired.add(name)  # a non-callable replacement is in effect as soon as it is installed
        return replacement
    acted = getattr(replacement, "acted", None)

    @functools.wraps(replacement)
    def wrapper(*args, **kwargs):
        if acted is None:
            fired.add(name)
            return replacement(*args, **kwargs)
        try:
            return replacement(*args, **kwargs)
        finally:
            if acted():
                fired.add(name)

    return wrapper


class PatchSet:
    """Installed patches, recorded as (owner, name, old) and undone in reverse order."""

    def __init__(self) -> None:
        self._records: list[tuple[Any, str, Any]] = []

    def install(self, entry: PatchEntry, fired: FiredLog) -> bool:
        if not model_module_loaded(entry.path):
            return False  # no model of that family exists in this process: nothing to patch
        try:
            owner, name = resolve_path(entry.path)
        except PatchTargetError:
            if entry.optional:
                return False
            raise
        old = _current(owner, name)
        # the raw attribute, found along the MRO, so an inherited staticmethod/classmethod keeps its kind
        raw = inspect.getattr_static(owner, name) if inspect.isclass(owner) else old
        descriptor = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        original = raw.__func__ if descriptor else getattr(owner, name)
        replacement = _counting(entry.factory(original), entry.name, fired)
        if descriptor is not None:
            replacement = descriptor(replacement)
        self._records.append((owner, name, old))
        setattr(owner, name, replacement)
        return True

    def undo(self) -> None:
        while self._records:
            owner, name, old = self._records.pop()
            if old is NOTSET:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, old)


@contextlib.contextmanager
def apply_patches(
    entries: Iterable[PatchEntry], fired: FiredLog | None = None
) -> Iterator[FiredLog]:
    """Install ``entries`` for the duration of the block; restore them in reverse, also on error."""
    fired = fired if fired is not None else FiredLog()
    patches = PatchSet()
    try:
        for entry in entries:
            patches.install(entry, fired)
        yield fired
    finally:
        patches.undo()


def patch_targets_snapshot(*backends: str, registry: Registry | None = None) -> dict[str, Any]:
    """``{path: object there now}`` for every resolvable patch target of ``backends``."""
    reg = registry if registry is not None else DEFAULT_REGISTRY
    snap = {}
    for entry in reg.patches(*backends):
        try:
            owner, name = resolve_path(entry.path)
        except PatchTargetError:
            continue
        snap[entry.path] = _current(owner, name)
    return snap


def find_leaked_patches(snapshot: dict[str, Any]) -> list[str]:
    """Paths whose object differs from the snapshot: a patch that was not restored."""
    leaked = []
    for path, obj in snapshot.items():
        owner, name = resolve_path(path)
        if _current(owner, name) is not obj:
            leaked.append(path)
    return leaked


# ── applying fixes ────────────────────────────────────────────────────────────


def _graph_modules(gm: torch.fx.GraphModule) -> Iterator[torch.fx.GraphModule]:
    """The graph module and every nested one (control-flow branches, wrapped subgraphs)."""
    yield gm
    for _, sub in gm.named_modules():
        if sub is not gm and isinstance(sub, torch.fx.GraphModule):
            yield sub


_SOURCE_META = ("stack_trace", "nn_module_stack", "source_fn_stack")


def set_fake_val(node: torch.fx.Node) -> None:
    """Give a node that a node fix created the ``meta["val"]`` its op computes on its inputs' fake
    values: torch.onnx's lowering reads every node's val (KeyError: 'val' otherwise), and so do later
    fixes. Left unset when the inputs carry no fake tensors."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode

    if node.op != "call_function" or any("val" not in n.meta for n in node.all_input_nodes):
        return  # nothing to compute it from (e.g. an ExecuTorch edge graph before its vals are set)
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
    leaves = [v for v in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
    fake_mode = detect_fake_mode(leaves)
    if fake_mode is None:
        if not leaves and getattr(node.target, "__module__", None) == "_operator":
            node.meta["val"] = node.target(*args, **kwargs)  # size arithmetic on SymInts: no tensor involved
        return
    # with the Python dispatcher, as tracing runs ops: some C++ kernels (constant_pad_nd) read sizes as
    # ints, which specializes a symbolic size to its traced value (the program then accepts only it)
    with fake_mode, enable_python_dispatcher():
        node.meta["val"] = node.target(*args, **kwargs)


class NewNodes(list):
    """For node fixes: ``call(op, *args, **kwargs)`` adds a call_function node to ``graph`` (at the
    current insertion point) and keeps it, in creation order, for ``replace_node`` or ``copy_source_meta``."""

    def __init__(self, graph: torch.fx.Graph):
        super().__init__()
        self.graph = graph

    def call(self, op: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        self.append(self.graph.call_function(op, args, kwargs))
        return self[-1]


def size_value(made: NewNodes, of: torch.fx.Node, d: int, extent):
    """Dim ``d`` of ``of`` as a node argument: ``extent`` when it is static, else a ``sym_size.int`` node."""
    return extent if isinstance(extent, int) else made.call(torch.ops.aten.sym_size.int, of, d)


def data_dependent_size(value: Any) -> bool:
    """``value`` is a SymInt with an unbacked symbol (a size read from tensor values while tracing)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return isinstance(value, torch.SymInt) and bool(free_unbacked_symbols(value))


def fake_val(arg: Any) -> Any:
    """A node argument's fake value (``meta["val"]``), None for a constant or a node without one."""
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def replace_unpacked(gm: torch.fx.GraphModule, node: torch.fx.Node, outputs: dict[int, torch.fx.Node]) -> None:
    """For node fixes on an op returning a tuple that is only unpacked (``getitem`` users): each
    ``node[i]`` becomes ``outputs[i]``; an unpacked element missing from ``outputs`` must be unused.
    The getitems and ``node`` are erased."""
    for user in list(node.users):
        if user.args[1] in outputs:
            user.replace_all_uses_with(outputs[user.args[1]])
        gm.graph.erase_node(user)
    gm.graph.erase_node(node)


def copy_source_meta(source: torch.fx.Node, new_nodes: Iterable[torch.fx.Node]) -> None:
    """Give nodes a fix inserted ``source``'s source metadata and their own fake vals."""
    for new in new_nodes:
        new.meta.update({k: v for k, v in source.meta.items() if k in _SOURCE_META})
        if "val" not in new.meta:
            set_fake_val(new)


def replace_node(gm: torch.fx.GraphModule, node: torch.fx.Node, new_nodes: Iterable[torch.fx.Node]) -> None:
    """For node fixes: replace ``node`` by the last of ``new_nodes`` (which all take its source
    metadata, so errors and graph dumps still point at the model's line) and erase it."""
    new_nodes = list(new_nodes)
    if "val" in node.meta:
        new_nodes[-1].meta["val"] = node.meta["val"]
    copy_source_meta(node, new_nodes)  # in creation order: an intermediate's inputs have their val first
    out = new_nodes[-1]
    node.replace_all_uses_with(out)
    gm.graph.erase_node(node)


def apply_fx_node_fixes(entries: Iterable[FixEntry], gm: torch.fx.GraphModule, fired: FiredLog) -> bool:
    """Run each node fix over every node; returns whether any changed the graph."""
    entries = list(entries)
    if not entries:
        return False
    modified = False
    for module in _graph_modules(gm):
        changed_here = False
        for node in list(module.graph.nodes):
            for entry in entries:
                if getattr(node, "_erased", False) or node.graph is not module.graph:  # an earlier fix erased it
                    break
                result = entry.fn(module, node)
                if not isinstance(result, bool):
                    raise WorkaroundError(f"node fix {_describe(entry.fn)} must return a bool, got {result!r}")
                if result:
                    fired.add(entry.name)
                    changed_here = True
        if changed_here:
            module.graph.lint()
            module.recompile()
            modified = True
    return modified


def apply_fx_program_fixes(entries: Iterable[FixEntry], program: Any, fired: FiredLog, *, config: Any) -> Any:
    for entry in entries:
        result = entry.fn(program, config=config)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], bool)):
            raise WorkaroundError(
                f"program fix {_describe(entry.fn)} must return (program, modified: bool), got {type(result).__name__}"
            )
        program, modified = result
        if modified:
            fired.add(entry.name)
    return program
