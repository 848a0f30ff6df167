"""The peer's generation export, judged like our test_generate items (``benchmarks/peer_compare.py --variant
generate-static --variant generate-dynamic``). Runs in peer_compare's child processes.

Per item, in the child:

1. build and eager: ``sweeps.generate.build_for_generate`` and ``eager_reference``, exactly as our item (the same
   tiny model at the same initializer range, the same generate inputs and generation-config settings, eager
   greedy generate's per-step logits and tokens);
2. export: the peer's public API, ``AutoHfExporter.from_config(cfg).export_for_generation(model, inputs, cfg,
   generation_config=...)``, ``dynamic=True`` for ``generate-dynamic``; ``generate-static`` passes a copy of the
   model's generation config with ``cache_implementation="static"`` and our item's ``max_cache_len`` (the peer's
   documented way to a static-cache export);
3. judge, by the same checks as ours where the peer's components allow it:
   - ``loop`` (the peer returns ``prefill`` and ``decode``): the peer ships no generation loop of its own, so
     transformers' own ``model.generate`` drives it with the model's forward replaced by the peer's runners (the
     first call by ``prefill``, every later one by ``decode``; each given the keyword arguments it was traced
     with). Teacher-forced (a logits processor forcing eager's token at each step): every step's logits within our
     backend tolerance (``exporters.parity.compare``); free-running: greedy tokens identical to eager's except at a
     near-tie step (``sweeps.generate._ties``), our rule. ASYMMETRY: generate runs in PyTorch everything outside
     the model's forward (an encoder-decoder's encoder among it: the peer exports no encoder component), while our
     loop runs from the artifacts alone; the final cache is not compared (ours is). Both favour the peer.
   - ``components`` (the peer splits a multimodal prefill into encoders, projector, language model and head): no
     loop runs over those, so each component is run at the inputs the peer's own decomposition
     (``decompose_for_generation``, recorded as the export ran it: ``peer_decomposition``) captured and compared
     with the eager module it came from, by our rule.
     The row records ``judged_by``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
import warnings
from typing import Any

GENERATE_VARIANTS = ("generate-static", "generate-dynamic")
LOOP_COMPONENTS = {"prefill", "decode"}
JUDGED_NOTE = ("generate: the peer's prefill/decode are driven by transformers' generate in PyTorch (its encoder "
               "and input preparation in eager; the final cache not compared), ours from the artifacts alone; a peer "
               "that splits a multimodal prefill is judged component by component at its captured inputs. Both "
               "favour the peer.")


def _forcing(tokens):
    """A logits processor that leaves only eager's token at each step (teacher forcing through generate)."""
    import torch
    from transformers import LogitsProcessor

    class Force(LogitsProcessor):
        def __init__(self):
            self.step = 0

        def __call__(self, input_ids, scores):
            forced = torch.full_like(scores, float("-inf"))
            forced.scatter_(1, tokens[:, self.step:self.step + 1].to(scores.device), 0.0)
            self.step += 1
            return forced

    return Force()


def drive(model, runners, inputs, steps: int, generation_config=None, teacher=None):
    """``model.generate`` greedy over ``steps`` new tokens with ``model.forward`` replaced by the peer's runners:
    ``prefill`` for the first call, ``decode`` for every later one (each given the keyword arguments it was
    traced with). ``teacher``: eager's new tokens, forced at each step."""
    import torch
    from transformers import LogitsProcessorList

    original = model.forward
    calls = []

    @functools.wraps(original)  # generate inspects the forward's signature: it must read the model's own
    def forward(*args, **kwargs):
        if args:
            raise TypeError(f"generate called forward with {len(args)} positional arguments; the peer's runners "
                            "take keywords")
        name = "prefill" if not calls else "decode"
        calls.append(name)
        runner = runners[name]
        traced = runner.metadata.kwargs
        return runner(**{k: v for k, v in kwargs.items() if k in traced})

    extra = {"logits_processor": LogitsProcessorList([_forcing(teacher)])} if teacher is not None else {}
    if generation_config is not None:
        extra["generation_config"] = copy.deepcopy(generation_config)
    own = vars(model).get("forward")  # an instance attribute already there is put back, not deleted
    model.forward = forward
    try:
        with torch.no_grad():
            return model.generate(**{k: v.clone() for k, v in inputs.items()}, max_new_tokens=steps, do_sample=False,
                                  return_dict_in_generate=True, output_logits=True, **extra)
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own


def _judge_loop(model, runners, inputs, ref, backend: str, generation_config) -> dict[str, Any]:
    import torch

    from exporters.parity import compare
    from sweeps.generate import GenerateMismatch, _ties

    steps = ref.new.shape[1]
    forced = drive(model, runners, inputs, steps, generation_config, teacher=ref.new)
    if len(forced.logits) != len(ref.eager.logits):
        raise GenerateMismatch(f"logits: the peer's loop ran {len(forced.logits)} steps, eager {len(ref.eager.logits)}")
    for step, (want, got) in enumerate(zip(ref.eager.logits, forced.logits)):
        problems = compare({"logits": want}, {"logits": got}, backend)
        if problems:
            raise GenerateMismatch(f"logits at step {step} (teacher-forced): {problems[0]}")
    free = drive(model, runners, inputs, steps, generation_config).sequences
    out: dict[str, Any] = {"judged_by": "loop"}
    if not torch.equal(free, ref.sequences):
        prompt = ref.prompt
        got = free[:, prompt:] if free.shape == ref.sequences.shape else free
        differ = (got != ref.new).any(dim=0).nonzero() if got.shape == ref.new.shape else None
        first = int(differ[0]) if differ is not None and len(differ) else None
        ties = _ties(ref.eager.logits, backend)
        if first is None or first not in ties:
            raise GenerateMismatch(f"tokens: free-running greedy tokens differ from eager's at step {first} "
                                   f"(peer {got.tolist()}, eager {ref.new.tolist()})")
        out["tie_steps"] = ties
    return out


@contextlib.contextmanager
def peer_decomposition():
    """Within the block, what the peer's ``export_for_generation`` decomposes the model into: ``{component:
    (module, its captured inputs)}``, the inputs deep-copied as the decomposition returns them (before anything
    runs on them: the capture holds live cache objects, and a model may keep state across generate calls, so a
    second decomposition is not the one the peer exported from)."""
    from transformers.exporters import base

    parts: dict[str, tuple[Any, dict]] = {}
    original = base.decompose_for_generation

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        parts.update({name: (module, copy.deepcopy(inputs)) for name, (module, inputs) in out.items()})
        return out

    base.decompose_for_generation = recording
    try:
        yield parts
    finally:
        base.decompose_for_generation = original


def _judge_components(parts, runners, backend: str) -> dict[str, Any]:
    import torch
    from peer_side import _flatten_actual

    from exporters.parity import ParityError, compare
    from exporters.utils import flatten_outputs

    for name, (module, sub_inputs) in parts.items():
        with torch.no_grad():
            expected = flatten_outputs(module(**copy.deepcopy(sub_inputs)))
        traced = runners[name].metadata.kwargs
        actual = _flatten_actual(runners[name](**{k: v for k, v in copy.deepcopy(sub_inputs).items() if k in traced}),
                                 expected)
        problems = compare(expected, actual, backend)
        if problems:
            raise ParityError(f"component {name!r} at its captured inputs: {problems[0]}")
    return {"judged_by": f"components ({', '.join(parts)})"}


def _peer_pytrees_first() -> None:
    """The peer's pytree registration of the Cache classes, before ours: pytree registrations are global to the
    process, and each side keeps a class already registered (ours by the build's eager flattening, the peer's at
    its export), so the peer would otherwise export caches with our flattening. Registered before anything of ours
    flattens a cache (the child's first item: the peer's stays for every later one)."""
    from transformers.cache_utils import Cache
    from transformers.exporters.exporter_dynamo import register_pytree_node

    stack = [Cache]
    while stack:
        cls = stack.pop()
        register_pytree_node(cls)
        stack.extend(cls.__subclasses__())


def peer_generate_item(class_name: str, backend: str, variant: str, onnx_optimize: bool | None = None) -> dict[str, Any]:
    """One generate item with the peer (module docstring); the row peer_compare tabulates."""
    from peer_side import PEER_CONFIGS, load_on_cpu

    from sweeps.report.summary import PEER_PRE_EXPORT as PRE_EXPORT_STAGES

    warnings.filterwarnings("ignore")
    stage = "build"
    row: dict[str, Any] = {"class": class_name, "backend": backend, "variant": variant}
    start = time.perf_counter()
    try:
        _peer_pytrees_first()
        from sweeps.generate import (
            GENERATE_INIT_RANGES,
            MIN_DISTINCT_TOKENS,
            _static_length,
            build_for_generate,
            eager_reference,
        )
        from sweeps.runner import Case
        from sweeps.zoo import resolve_models

        cache = variant.removeprefix("generate-")
        (entry,) = [e for e in resolve_models([class_name]) if e.class_name == class_name]
        case = Case(backend, cache, entry, test="generate")
        for init_range in GENERATE_INIT_RANGES:
            stage = "build"
            model, inputs, notes = build_for_generate(case, init_range)
            stage = "eager"
            ref = eager_reference(model, inputs, notes, lambda k, v: None)
            if len(set(ref.new.flatten().tolist())) >= MIN_DISTINCT_TOKENS:
                break
        inputs = ref.inputs
        stage = "export"
        from transformers import exporters as peer

        kwargs: dict[str, Any] = {"dynamic": cache == "dynamic"}
        if backend == "onnx" and onnx_optimize is not None:
            kwargs["optimize"] = onnx_optimize
        config = getattr(peer, PEER_CONFIGS[backend])(**kwargs)
        generation_config = None
        if cache == "static":
            generation_config = copy.deepcopy(model.generation_config)
            generation_config.cache_implementation = "static"
            generation_config.max_cache_len = _static_length(ref.prompt + ref.new.shape[1])
        exporter = peer.AutoHfExporter.from_config(config)
        with peer_decomposition() as parts:
            exported = exporter.export_for_generation(model, dict(inputs), config, generation_config=generation_config)
        stage = "run"
        load_on_cpu(exported, backend)
        runners = exported.runners
        if set(exported.components) == LOOP_COMPONENTS:
            row.update(_judge_loop(model, runners, inputs, ref, backend, generation_config))
        else:
            row.update(_judge_components(parts, runners, backend))
        stage = "done"
        row.update(peer="pass", peer_stage=stage, components=list(exported.components))
    except BaseException as exc:  # noqa: BLE001 - the item's verdict
        from sweeps.signature import error_signature

        not_compared = stage in PRE_EXPORT_STAGES
        root = exc  # the peer wraps a component's export error ("export_program failed on component ..."): its cause
        while root.__cause__ is not None:
            root = root.__cause__
        signature = error_signature(exc) if root is exc else f"{error_signature(exc)} <- {error_signature(root)}"
        row.update(peer="not compared" if not_compared else "fail", peer_stage=stage, peer_error=signature,
                   peer_detail=(str(exc) if root is exc else f"{exc}\n<- {type(root).__name__}: {root}")[:2000])
    row["peer_duration_s"] = round(time.perf_counter() - start, 3)
    return row
