"""One generate item: export a class's prefill and decode step, drive them token by token from the
artifacts alone, and check against eager ``model.generate(do_sample=False)``.

Checks, in order (the item stops at the first that fails; ``stage`` says which):
- ``logits``: teacher forcing, the artifact loop fed eager's tokens: every step's logits within the
  backend's tolerance (one near-tie cannot derail the steps after it);
- ``cache``: the cache after the last step, at the positions attention reads, within tolerance;
- ``tokens``: free-running greedy tokens identical to eager's, except at a step where eager's top two
  logits are closer than the tolerance: recorded as ``tie_steps``, not a failure.
Properties: ``new_tokens``, ``distinct_tokens`` (a loop that repeats one token would hide a broken
cache from the token check; models are built with ``GENERATE_INIT_RANGES``, see there), ``init_range``,
``rules`` (how each decode input follows from the step before), ``workarounds_fired``; where generate is
called unlike the forward (the zoo's ``generate`` overrides, ``sweeps.zoo.generate_setup``),
``inputs_generate`` and ``generation_config_set``; ``inputs_generate_ignores``: inputs eager generate passed
to none of its captured calls (CTRL's token_type_ids), left out of the artifact loop's calls as eager's
forward calls never had them; ``inputs_generate_added``: an attention mask generate reads but was not given
(VibeVoice's), added as an unpadded prompt's all-ones mask; ``generation_config_restored``: the model's generate changed its generation
config (Pop2Piano's), put back before the export. A class whose generate needs a package not installed here
is blocked like a build (``BlockedByPackage``, xfailed).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any

import torch

# at the zoo's default 0.02, tiny GPT-2, T5 and Mamba repeat one token; 0.2 makes most tiny models'
# tokens depend on the context, and a model still repeating itself is rebuilt once at the larger value
GENERATE_INIT_RANGES = (0.2, 0.5)
MIN_DISTINCT_TOKENS = 3
NEW_TOKENS = 8
NOT_GENERATE_INPUTS = ("labels", "use_cache", "return_dict", "output_attentions", "output_hidden_states")


def generate_inputs(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and k not in NOT_GENERATE_INPUTS}


_UNUSED_KWARGS = re.compile(r"The following `model_kwargs` are not used by the model: (\[[^\]]*\])")


def _eager_generate(model, inputs: dict[str, torch.Tensor], record: Callable[[str, Any], None], **extra):
    """Eager greedy generate over ``inputs``. The zoo's inputs are the forward's: where generate refuses
    some as unused (a forward-only ``decoder_input_ids`` of a model whose generate hands its language model
    ``inputs_embeds``: Blip2, InstructBlip), they are dropped, from the exports' inputs too, and recorded
    as ``inputs_generate_refused``; where generate reads an attention mask it was not given (``KeyError:
    'attention_mask'``), an all-ones one is added, to the exports' inputs too, recorded as ``inputs_generate_added``;
    anything else generate raises, this raises."""
    def run():
        # a generate that updates model.generation_config with its keyword arguments (Pop2Piano's) would leave
        # return_dict_in_generate set for the export's own generate calls: the config is put back as it was
        saved = copy.deepcopy(getattr(model, "generation_config", None))
        try:
            with torch.no_grad():
                return model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False,
                                      return_dict_in_generate=True, output_logits=True, **extra)
        finally:
            if saved is not None and model.generation_config.to_dict() != saved.to_dict():
                record("generation_config_restored", True)
                model.generation_config = saved

    try:
        return run()
    except ImportError as exc:
        _raise_if_blocked(model, exc)
        raise
    except KeyError as exc:
        # generate builds a mask only for a forward that names attention_mask, so the zoo (which gives the inputs the
        # forward names) gives none; a generate that reads one all the same (VibeVoice's _sample reads
        # model_kwargs["attention_mask"], its forward takes it through **kwargs) is given the mask a processor
        # makes for an unpadded prompt, in the exports' inputs too
        if exc.args != ("attention_mask",) or "attention_mask" in inputs or "input_ids" not in inputs:
            raise
        inputs["attention_mask"] = torch.ones(inputs["input_ids"].shape[:2], dtype=torch.long)
        record("inputs_generate_added", ["attention_mask"])
        return run()
    except ValueError as exc:
        found = _UNUSED_KWARGS.search(str(exc))
        refused = set(ast.literal_eval(found.group(1))) if found else set()
        if not refused or not refused <= set(inputs):
            raise
    record("inputs_generate_refused", sorted(refused))
    for name in refused:
        del inputs[name]
    return run()


class _Recorder:
    """A streamer (transformers' ``BaseStreamer`` interface) that keeps what generate hands it: the prompt ids it
    starts from, then each step's chosen tokens, in the layout its loop keeps them."""

    def __init__(self):
        self.puts: list[torch.Tensor] = []

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.detach().clone())

    def end(self) -> None:
        pass


def _forward_layout(model, inputs: dict[str, torch.Tensor], eager, record: Callable[[str, Any], None]) -> torch.Tensor:
    """Eager's sequences as rows of the prompt then one token per step, in the layout the forward takes (the
    artifact loop's). Where generate returns them otherwise (Musicgen's ``(batch, num_codebooks, length)``, its delay
    pattern applied and every pad id dropped: its rows are not its logits' ``batch * num_codebooks``), generate runs
    again with a streamer, which its loop hands the ids it starts from and each chosen token (generation/utils.py
    ``StopCheck``); the rerun's logits must be the first run's. Recorded as ``sequences_from``."""
    rows = eager.logits[0].shape[0] if eager.logits else None
    if eager.sequences.dim() == 2 and (rows is None or eager.sequences.shape[0] == rows):
        return eager.sequences
    streamer = _Recorder()
    again = _eager_generate(model, inputs, record, streamer=streamer)
    if len(streamer.puts) != len(eager.logits) + 1 or not all(torch.equal(a, b) for a, b in zip(again.logits, eager.logits)):
        raise GenerateMismatch(f"eager generate returned sequences of shape {list(eager.sequences.shape)} for logits of "
                               f"{rows} rows, and a rerun with a streamer handed it {len(streamer.puts)} puts for "
                               f"{len(eager.logits)} steps (or other logits): eager's tokens cannot be read")
    prompt, *steps = streamer.puts
    record("sequences_from", f"streamer: generate returned {list(eager.sequences.shape)}, its logits have {rows} rows")
    return torch.cat([prompt.reshape(rows, -1), *(t.reshape(rows, 1) for t in steps)], dim=1)


_NEEDS_PACKAGE = re.compile(r"requires `(\w+)`|requires the (\w+) library|No module named '(\w+)'")


def _raise_if_blocked(model, exc: ImportError) -> None:
    """A generate that needs a package not installed here (VibeVoice's default noise scheduler: diffusers) is
    blocked like a build that needs one: raise ``BlockedByPackage`` (the sweep xfails it, "build: needs ...")."""
    import importlib.util

    from sweeps.zoo import BlockedByPackage

    found = _NEEDS_PACKAGE.search(str(exc))
    package = next((g for g in found.groups() if g), None) if found else None
    if package and importlib.util.find_spec(package) is None:
        raise BlockedByPackage(f"{type(model).__name__}: generate needs {package} (not installed here): "
                               f"{str(exc).splitlines()[0][:200]}") from exc


def _tolerance(backend: str) -> float:
    from exporters.parity import TOLERANCES

    return TOLERANCES[backend][0]


def _ties(logits: tuple[torch.Tensor, ...], backend: str) -> list[int]:
    """Steps where eager's top two logits (any row) are closer than the backend's tolerance."""
    steps = []
    for i, step in enumerate(logits):
        top = step.float().topk(2, dim=-1).values
        if bool(((top[..., 0] - top[..., 1]) <= 2 * _tolerance(backend)).any()):
            steps.append(i)
    return steps


def _static_length(needed: int) -> int:
    """The static variant's max_cache_len: the slots the item needs, rounded up to a multiple of 8 (so
    slots past the last position exist and the mask over them is exercised)."""
    return (needed // 8 + 1) * 8


def _static_cache_pair(eager_cache, static_cache: dict[str, torch.Tensor], written: int):
    """Eager's cache and the static step's returned one (``present_<i>_key``...), named alike and cut to
    the ``written`` slots, or to their last ones where eager keeps fewer (a sliding-window layer keeps
    its window; the static step keeps every slot and masks to the window), whole where eager keeps more than
    the text wrote (a layer of its own length, written with something else: Mllama's cross-attention
    layers, the image's keys and values); ({}, {}) when the static cache lives inside the program."""
    from exporters.pytrees import flatten_outputs

    if not static_cache or eager_cache is None:
        return {}, {}
    eager_cache = getattr(eager_cache, "self_attention_cache", eager_cache)  # an encoder-decoder's: its decoder's
    want = flatten_outputs({"past_key_values": eager_cache})
    got = {}
    for name, tensor in static_cache.items():
        _, index, part = name.split("_", 2)
        if part not in ("key", "value"):  # a linear-attention state: checked through the tokens and logits
            continue
        key = f"past_key_values.{index}.{part}"
        if key in want:
            start = written - want[key].shape[-2]
            got[key] = tensor[..., start: written, :] if start >= 0 else tensor
    return {k: want[k] for k in got}, got


def _cache_tensors(cache) -> dict[str, torch.Tensor]:
    """The tensors a returned cache holds (none for a cache no layer wrote)."""
    from exporters.pytrees import flatten_outputs

    return {} if cache is None else {k: v for k, v in flatten_outputs({"cache": cache}).items() if v.numel()}


def _dynamic_cache_pair(tree: str, eager_cache, got: dict[str, torch.Tensor]):
    """Eager's cache (``<tree>.<i>.key``...) and the artifact's, the latter cut to the last
    positions where eager keeps fewer: a sliding-window layer keeps its window (beside linear-attention
    states or not), the generation export a plain layer with every position
    (``exporters.generation.sliding_forms``; a reference layer's form keeps the prompt's positions first, eager's
    in ``prefill_keys``, and the prompt's length), and a compressed-attention layer's form its last
    ``compress_rate - 1`` source tokens where eager keeps those since its last full window (the last of them),
    and its entries one slot a position (``entry_slots``: eager's ``compressed_kv`` is every ``compress_rate``-th,
    ``exporters.generation.compressed_forms``). The
    sliding layer's window size scalar (``_sliding_window_tensor``, a constant of the layer) is not
    state: it is dropped from eager's side where the artifact's layer has none."""
    from exporters.pytrees import flatten_outputs

    want = flatten_outputs({tree: eager_cache})
    # the cache's own layers, or an encoder-decoder cache's self-attention ones (T5Gemma)
    parts = [(tree, eager_cache)] + [(f"{tree}.{k}", getattr(eager_cache, k)) for k in ("self_attention_cache",
                                                                                        "cross_attention_cache")
                                     if getattr(eager_cache, k, None) is not None]
    layers = {f"{prefix}.{i}": layer for prefix, cache in parts for i, layer in enumerate(getattr(cache, "layers", None) or [])}
    sliding = {name for name, layer in layers.items()
               if {c.__name__ for c in type(layer).__mro__} & {"DynamicSlidingWindowLayer",
                                                               "LinearAttentionAndSlidingWindowAttentionLayer"}}
    pair_want, pair_got = {}, dict(got)
    for name in list(pair_got):  # a compressed-attention layer's form keeps its entries one slot a position, each at
        layer, _, entry = name.partition(".entry_slots.")  # the position its window ends at: eager's are every
        rate = getattr(layers.get(layer), "compress_rate", None)  # compress_rate-th slot
        if entry and isinstance(rate, int):
            pair_got[f"{layer}.compressed_kv.{entry}"] = pair_got.pop(name)[:, rate - 1::rate]
    for layer in sliding:  # a reference layer's form (PlainReferenceLayer) keeps the prompt's positions first in its
        length = pair_got.pop(f"{layer}.prefill_length", None)  # keys, eager's apart from the window's
        for mine, prompt in (("key", "prefill_keys"), ("value", "prefill_values")):
            whole = pair_got.get(f"{layer}.{mine}")
            if length is not None and whole is not None:
                pair_got[f"{layer}.{prompt}"], pair_got[f"{layer}.{mine}"] = whole[..., :int(length), :], whole[..., int(length):, :]
    for name, tensor in want.items():
        _, _, leaf = name.rpartition(".")
        # the sliding layer a leaf is in, directly or in a dict of its (a compressed-attention layer's buffers)
        layer = next((s for s in sliding if name.startswith(f"{s}.")), None)
        if layer is not None and leaf == "_sliding_window_tensor" and name not in got:
            continue
        pair_want[name] = tensor
        mine = got.get(name)
        if layer is not None and mine is not None and mine.dim() >= 2 and tensor.dim() == mine.dim() \
                and mine.shape[-2] > tensor.shape[-2]:
            pair_got[name] = mine[..., mine.shape[-2] - tensor.shape[-2]:, :]
    return pair_want, pair_got


class GenerateMismatch(AssertionError):
    """The artifact loop does not reproduce eager generation (message: which check, step and output)."""


def build_for_generate(case, init_range: float):
    """The tiny model, generate's inputs and the generation-config settings the zoo gives for generate
    (``sweeps.zoo.generate_setup``: the override's ``generate`` entry, where generate is called unlike the
    forward; else the forward's inputs)."""
    from sweeps.runner import SEED, reference
    from sweeps.zoo import generate_setup

    tiny = reference(case.entry.class_name, init_range=init_range).tiny
    model = tiny.model
    if not (hasattr(model, "can_generate") and model.can_generate()):
        raise TypeError(f"{case.entry.class_name}.can_generate() is False: it is listed under a generative task "
                        "but cannot run generate (list it in sweeps/plugin.py NOT_TOKEN_GENERATORS)")
    inputs, settings = generate_setup(tiny, seed=SEED)
    notes = {}  # properties: what the zoo gives generate unlike the forward
    if settings:
        notes["generation_config_set"] = {k: repr(v) for k, v in settings.items()}
    if inputs is not tiny.inputs:
        notes["inputs_generate"] = {k: list(v.shape) for k, v in generate_inputs(inputs).items()}
    generation = getattr(model, "generation_config", None)
    if generation is not None and (generation.num_beams or 1) > 1:
        # the item checks greedy search, eager's and the artifacts' alike: a config asking for beam search by
        # default (FSMT's num_beams=5) is set to greedy here, as a user exporting for greedy search would
        notes.setdefault("generation_config_set", {})["num_beams"] = f"1 (the model's config: {generation.num_beams})"
        generation.num_beams = 1
    if getattr(model.config, "is_encoder_decoder", False) and generation is not None \
            and generation.decoder_start_token_id is None:
        # the tiny config names no start token; any id the vocabulary has will do for a random model
        generation.decoder_start_token_id = generation.pad_token_id or generation.bos_token_id or 0
    return model, generate_inputs(inputs), notes


@dataclasses.dataclass
class GenerateReference:
    """What an item is checked against: the tiny model, generate's inputs, eager greedy generate's output
    (``eager``: its sequences, per-step ``logits`` and ``past_key_values``), its sequences in the forward's layout,
    the prompt's length and the new tokens (``sequences[:, prompt:]``)."""

    model: Any
    inputs: dict[str, torch.Tensor]
    notes: dict[str, Any]
    eager: Any
    sequences: torch.Tensor
    prompt: int
    new: torch.Tensor


def eager_reference(model, inputs: dict[str, torch.Tensor], notes: dict[str, Any],
                    record: Callable[[str, Any], None]) -> GenerateReference:
    """Eager greedy generate over what ``build_for_generate`` built. benchmarks/peer_generate.py checks the
    peer's components against the same."""
    eager = _eager_generate(model, inputs, record)
    sequences = _forward_layout(model, inputs, eager, record)
    prompt = sequences.shape[1] - len(eager.logits)
    return GenerateReference(model, inputs, notes, eager, sequences, prompt, sequences[:, prompt:])


def _loop_takes(generator) -> set[str]:
    """The inputs the artifact loop takes: those generate passed to its captured calls (the encoders' and the
    prefill's; the static step's forward calls take only tokens, positions and a mask, static_step_for checks),
    an attention mask (the loop checks it itself) and, where the prefill starts the decoder, decoder_input_ids."""
    if hasattr(generator, "loop_inputs"):  # a delegated generate: its handoff component takes the caller's inputs
        return set(generator.loop_inputs)
    if getattr(generator, "cache", None) == "static":
        encoder = generator.encoder or {"inputs": (), "same": {}}
        return {"input_ids", "attention_mask", *generator.extras, *(generator.embed_inputs or ()), *(generator.prompt_inputs or ()),
                *getattr(generator, "same_inputs", ()),
                *encoder["inputs"],
                *encoder["same"].values(), *(("decoder_input_ids",) if generator.encoder else ())}
    takes = set(generator.prefill_inputs) | {"attention_mask"}
    if "decoder_start" in generator.prefill_rules.values():
        takes.add("decoder_input_ids")
    return takes


def run_generate_case(case, record: Callable[[str, Any], None]) -> None:
    """Run one generate item; raise ``sweeps.runner.StageFailure`` naming the stage."""
    from exporters import get_exporter
    from exporters.generation.steps import WHOLE_SEQUENCE_RULES, carried_tree
    from exporters.parity import attended, compare
    from exporters.trace_reuse import active_store
    from sweeps.runner import StageFailure, export_config, passes_through

    stage = "build"
    record("stage", stage)
    start = time.perf_counter()
    try:
        for init_range in GENERATE_INIT_RANGES:
            stage = "build"
            model, inputs, notes = build_for_generate(case, init_range)
            stage = "eager"
            record("stage", stage)
            ref = eager_reference(model, inputs, notes, record)
            if len(set(ref.new.flatten().tolist())) >= MIN_DISTINCT_TOKENS:
                break
        model, inputs, eager, sequences, prompt, new = ref.model, ref.inputs, ref.eager, ref.sequences, ref.prompt, ref.new
        record("init_range", init_range)
        for k, v in ref.notes.items():
            record(k, v)
        record("new_tokens", int(new.shape[1]))
        record("distinct_tokens", len(set(new.flatten().tolist())))
        stage = "export"
        record("stage", stage)
        exporter = get_exporter(case.backend)
        config, props = export_config(case, exporter)
        for k, v in props.items():
            record(k, v)
        longest = prompt + new.shape[1]
        if case.variant == "dynamic" and config.dynamic and config.max_dim < longest:
            # a dynamic dim's upper bound is the backend's max_dim (ExecuTorch's 64 plans its memory): the
            # sequence the item generates (Kosmos-2's prompt holds 64 image positions) must fit under it
            config = dataclasses.replace(config, max_dim=longest)
            record("max_dim_raised", longest)
        store = active_store()
        hits = store.hits if store is not None else 0
        if case.variant == "static":
            max_cache_len = _static_length(longest)
            record("max_cache_len", max_cache_len)
            generator = exporter.export_for_generation(model, inputs, config, cache="static",
                                                       max_cache_len=max_cache_len)
            record("cache_state", generator.state)
        else:
            generator = exporter.export_for_generation(model, inputs, config)
            # "decode at past length 0": one graph runs the prompt and the steps (exporters/generation/empty_past.py)
            record("prefill", generator.metadata.get("prefill"))
        if store is not None:  # component traces taken from the class's other items (exporters/trace_reuse.py)
            record("trace_reused", store.hits - hits)
        ignored = sorted(set(inputs) - _loop_takes(generator))
        if ignored:  # eager generate passed them to no forward call: the artifact loop is called as eager was
            record("inputs_generate_ignores", ignored)
            inputs = {k: v for k, v in inputs.items() if k not in ignored}
        record("rules", {**generator.rules, **{f"prefill:{k}": v for k, v in generator.prefill_rules.items()}})
        record("workarounds_fired", sorted({w for a in generator.components.values() for w in a.workarounds_fired}))
        components = generator.components.items()
        record("baked_inputs", {k: sorted(n for n, v in a.constants.items() if isinstance(v, torch.Tensor)) for k, a in components})
        record("dynamic_by_input", {k: {n: sorted(d) for n, d in a.dynamic_dims.items()} for k, a in components})
        stage = "run"
        record("stage", stage)
        forced = generator.generate(**inputs, max_new_tokens=new.shape[1], teacher_tokens=new,
                                    return_dict_in_generate=True, output_logits=True)
        stage = "compare"
        record("stage", stage)
        if len(forced.logits) != len(eager.logits):
            raise GenerateMismatch(f"logits: the artifact loop ran {len(forced.logits)} steps, eager {len(eager.logits)}")
        for step, (want, got) in enumerate(zip(eager.logits, forced.logits)):
            problems = compare({"logits": want}, {"logits": got}, case.backend)
            if problems:
                raise GenerateMismatch(f"logits at step {step} (teacher-forced): {problems[0]}")
        mask = inputs.get("attention_mask")
        if mask is not None:
            mask = torch.cat([mask, torch.ones(mask.shape[0], len(eager.logits) - 1, dtype=mask.dtype)], dim=1)
        if case.variant == "static":
            # the slots the loop wrote: the prompt's (its last n where generate's first call takes only those), then
            # one a step
            slots = generator.prompt_slots(prompt) if hasattr(generator, "prompt_slots") else prompt
            want_cache, got_cache = _static_cache_pair(eager.past_key_values, forced.cache, slots + len(eager.logits) - 1)
            record("cache_checked", bool(got_cache))  # False: the cache lives inside the program (buffers)
        else:
            # eager returns the state as past_key_values whatever the model calls it (Mamba: cache_params)
            state = [t for t in generator.trees if carried_tree(generator.rules.get(t, ""))]  # not encoder outputs
            # the decode re-reads the whole sequence
            uncached = any(r in WHOLE_SEQUENCE_RULES for r in generator.rules.values())
            eager_state = _cache_tensors(eager.past_key_values)
            if uncached and not state:
                if eager_state:  # eager's generate kept state this loop does not: say so
                    raise GenerateMismatch(f"cache: the decode step re-reads the whole sequence and carries no state, "
                                           f"but eager's generate returns {len(eager_state)} cache tensors")
                record("cache_checked", False)  # no state on either side: nothing to compare
                want_cache, got_cache = {}, {}
            elif len(state) != 1:
                raise GenerateMismatch(f"cache: the decode step carries {len(state)} trees from step to step "
                                       f"({state}); eager returns one past_key_values to compare them with")
            elif eager.past_key_values is None:
                want_cache, got_cache = {}, forced.cache
            else:
                want_cache, got_cache = _dynamic_cache_pair(state[0], eager.past_key_values, forced.cache)
        problems = compare(attended(want_cache, mask), attended(got_cache, mask), case.backend)
        if problems:
            raise GenerateMismatch(f"cache after the last step: {problems[0]}")
        free = generator.generate(**inputs, max_new_tokens=new.shape[1])
        if not torch.equal(free, sequences):
            differ = (free[:, prompt:] != new).any(dim=0).nonzero()
            first = int(differ[0]) if len(differ) else None
            ties = _ties(eager.logits, case.backend)
            if first is None or first not in ties:
                raise GenerateMismatch(f"tokens: free-running greedy tokens differ from eager's at step {first} "
                                       f"(artifact {free[:, prompt:].tolist()}, eager {new.tolist()})")
            record("tie_steps", ties)
        stage = "done"
        record("stage", stage)
    except BaseException as exc:
        if passes_through(exc):
            raise
        raise StageFailure(stage, exc) from exc
    finally:
        record("duration_s", round(time.perf_counter() - start, 3))
