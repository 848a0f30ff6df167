"""Generation export: a model's prefill and decode step, captured from its own ``generate``, exported
with any exporter, and driven token by token by a ``Generator`` that runs only the artifacts.

    generator = OnnxExporter().export_for_generation(model, inputs, config=OnnxConfig(dynamic=True))
    tokens = generator.generate(**inputs, max_new_tokens=16)   # == model.generate(..., do_sample=False)
    generator.save("out/"); load_generator("out/")               # exporters.loading, no weights needed

Components: ``prefill`` (the first forward call of ``generate``: the prompt, an empty cache) and
``decode`` (a one-token step reading and returning the cache), and for an encoder-decoder ``encoder``
(the call of ``model.get_encoder()`` that ``generate`` makes first; its outputs are the decoder's
``encoder_outputs``, checked leaf by leaf). Each is a ``FlatComponent``: the cache
goes in and out as flat tensors; where the decode graph computes the prefill's outputs from an empty cache it is
the only one (empty_past.py). How every decode input follows from the call before it is read off
the captured calls and checked on each pair (steps.py). Cache forms: ``"dynamic"`` (a growing cache)
and ``"static"`` (one ``step`` component over a fixed-size cache updated in place, driven by a
``StaticGenerator``: static.py, static_loop.py). A model whose ``generate`` hands a sub-model's ``generate``
what it computed (Blip-2, Kosmos-2): a ``handoff`` component, then the sub-model's own (delegated.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation import empty_past
from exporters.generation.capture import (
    PREPARED,
    GenerationError,
    capture_generate,
    encoder_of,
    encoders_of,
    static_cache_asked,
)
from exporters.generation.component import FlatComponent, flat_call_inputs
from exporters.generation.delegated import DelegatedGenerator, export_delegated, find_delegate
from exporters.generation.encoder_prep import encoder_module, prepared_encoder_call
from exporters.generation.generator import GenerateOutput, Generator
from exporters.generation.module_state import batch_only, state_components
from exporters.generation.processors import check_supported
from exporters.generation.quantized import checked_recipes, component_calibration
from exporters.generation.runners import llm_runner_methods, vocab_size
from exporters.generation.static import (
    CrossAttention,
    StaticStep,
    static_step_for,
    step_dynamic_shapes,
    step_example,
)
from exporters.generation.static_embeds import DEEPSTACK_PREFIX, TokenEmbeds, handed_names, prefill_embeds
from exporters.generation.static_encdec import (
    decoder_prompt_rule,
    decoder_reads,
    encoder_spec,
    one_token_prompt_differs,
    same_inputs,
)
from exporters.generation.static_layers import fresh_step_cache
from exporters.generation.static_loop import StaticGenerator
from exporters.generation.static_prefill import export_with_prompt, prompt_path_differs
from exporters.generation.static_prompt import CHECKED_TOKENS, decode_rule, read_beyond_embeddings
from exporters.generation.static_whole import WholeSequenceStep, shortest_sequence
from exporters.generation.steps import (
    ATTRIBUTES,
    MODULE_STATE,
    TOKEN_INPUTS,
    AmbiguousTokenRule,
    Returned,
    carried_module_state,
    infer_prefill_rules,
    infer_rules,
    prefill_sources,
    record_returns,
)

__all__ = ["DelegatedGenerator", "GenerateOutput", "GenerationError", "GenerationExport", "Generator",
           "StaticGenerator", "export_for_generation"]

CACHE_FORMS = ("dynamic", "static")
# how the static form runs the prompt: "auto", a prompt component where the step's own prompt would not compute what
# eager generate does (static_prefill.py); "step", always the one-program step (the form ExecuTorch's LLM runner loads)
PROMPT_FORMS = ("auto", "step")
# where each backend keeps a static cache: ExecuTorch and dynamo as mutable buffers of the program,
# ONNX as input/output pairs of one shape (an ONNX graph has no state)
STATIC_STATE = {"dynamo": "buffers", "executorch": "buffers", "onnx": "inputs"}
DEFAULT_MAX_CACHE_LEN = 64
CAPTURED_STEPS = 3  # prefill + 2 decode steps: two pairs to check each decode input's rule on


def export_for_generation(exporter, model: torch.nn.Module, inputs: Mapping[str, Any], config=None,
                          cache: str = "dynamic", max_cache_len: int | None = None,
                          quantization: Mapping[str, Any] | None = None,
                          prompt: str = "auto") -> Generator | StaticGenerator | DelegatedGenerator:
    if cache not in CACHE_FORMS:
        raise GenerationError(f"cache={cache!r} is not a cache form; choose one of {CACHE_FORMS}")
    if prompt not in PROMPT_FORMS:
        raise GenerationError(f"prompt={prompt!r}: the static form runs the prompt as one of {PROMPT_FORMS}")
    if prompt != "auto" and cache != "static":
        raise GenerationError(f"prompt={prompt!r} chooses how the static form runs the prompt; cache={cache!r} has a prefill")
    if max_cache_len is not None and cache != "static":
        raise GenerationError(f"max_cache_len={max_cache_len} sizes a static cache; cache={cache!r} grows as it goes")
    if getattr(config, "quantization", None) is not None:
        # one recipe for every component: its calibration inputs are the model's, and each component takes its own
        raise GenerationError(f"config.quantization={config.quantization!r}: export_for_generation takes a recipe per "
                              "component, export_for_generation(..., quantization={'decode': recipe, ...}) "
                              "(exporters/generation/quantized.py)")
    if quantization and cache == "static":
        raise GenerationError("quantization= takes the dynamic cache form only: the static step writes its cache "
                              "buffers in place, which PT2E's prepared graph does not carry")
    delegate = find_delegate(model, inputs)
    if delegate is not None:  # its generate hands a sub-model's generate what it computed (Blip-2, Kosmos-2)
        return export_delegated(exporter, model, inputs, config, delegate, lambda child, handed, recipes: export_for_generation(
            exporter, child, handed, config, cache, max_cache_len, recipes, prompt), quantization)
    generation = _generation_dict(model)
    check_supported(generation, type(model).__name__)
    if cache == "static":
        return _export_static(exporter, model, inputs, config, generation,
                              max_cache_len if max_cache_len is not None else DEFAULT_MAX_CACHE_LEN, prompt)
    captured_inputs = _padded(inputs)
    given = {k: v for k, v in captured_inputs.items() if isinstance(v, torch.Tensor)}
    try:
        calls, encoder_calls, returned, prefill_rules, rules, token_input, carried = _read_generate(
            model, captured_inputs, given, generation)
    except AmbiguousTokenRule as exc:  # every token generate chose was the id it appends: choose another to tell
        calls, encoder_calls, returned, prefill_rules, rules, token_input, carried = _read_generate(
            model, captured_inputs, given, generation, suppress=exc.token_id)
    prefill, decode = calls[0], calls[1]
    encoder_call = _encoder_calls(model, encoder_calls, given)
    prefill_trees = _prefill_tree_rules(model, prefill, encoder_call)
    updated = tuple(k for k, r in rules.items() if r == "updated")  # the components return these trees
    for name, rule in rules.items():
        if name in decode.trees and rule == "outputs":
            out = prefill.output_trees.get(name)
            if out is None or out[1] != decode.trees[name][1]:
                raise GenerationError(f"the prefill's output {name!r} does not have the structure the decode step takes")
        elif name in decode.trees and rule == "same" and name not in prefill_trees and decode.trees[name][0]:
            raise GenerationError(f"the decode step carries {name!r} from the prefill, which does not say where it "
                                  "comes from")
    config = config if config is not None else exporter.config_class()
    encoders = encoders_of(model)
    parts = [(label, encoder_module(model, *encoders[label], call), call) for label, call in encoder_call.items()] \
        + [("prefill", model, prefill), ("decode", model, decode)]
    baked = tuple(k for k, r in prefill_trees.items() if r == "initial")
    recipes = checked_recipes(quantization, [label for label, _, _ in parts])
    if recipes and carried:
        raise GenerationError(f"quantization= for a model keeping state in module attributes ({carried[:2]}): the "
                              "calibration calls do not carry it")
    # state kept in module attributes (exporters/generation/module_state.py): the prefill and decode carry it
    stateful = state_components(model, carried, prefill, decode, baked, updated, returned[0]) if carried else {}
    if recipes:  # the export's own capture serves its own inputs; another sample runs generate again
        captured = _call_inputs(encoder_call, prefill, decode, baked)
        recipes = component_calibration(recipes, lambda sample: captured if sample is inputs
                                         else _component_inputs(model, sample, baked))
    from exporters.generation.genai import model_patches

    def export_part(label, module, call, empty=()):
        held = baked if label == "prefill" else ()
        component, state_inputs = stateful.get(label) or (
            FlatComponent(module, call, held, updated if label in ("prefill", "decode") else ()).eval(), {})
        own = dataclasses.replace(config, quantization=recipes[label]) if label in recipes else config
        own = dataclasses.replace(own, may_be_empty=tuple(empty)) if empty else own
        example = {**flat_call_inputs(call, held), **state_inputs, **call.constants}
        artifact = exporter.export(component, example, batch_only(own, example) if state_inputs else own)
        artifact.extra_metadata["component"] = label
        if label in stateful:
            artifact.extra_metadata["module_state"] = list(carried)
        return artifact

    # the decode graph run from an empty cache as the prefill, where it computes what the prefill does (empty_past.py)
    patches = model_patches(exporter)
    axes, want, example, why = empty_past.decided(exporter, model, config, calls, rules, patches,
                                                  encoder_call or carried or baked or recipes)
    empty = None
    if why is None:  # no encoder: the parts are the prefill and the decode
        components, empty, why = empty_past.export_one_graph(
            lambda empty_dims, call: export_part("decode", model, call, empty_dims), lambda: export_part("prefill", model, prefill),
            calls, axes, want, exporter.backend, token_input, example,
            lambda call: empty_past.component_outputs(model, call, patches))
    else:
        components = {label: export_part(label, module, call) for label, module, call in parts}
    metadata = {"model_class": type(model).__name__, "cache": cache,
                "prefill": empty_past.PREFILL_BY_DECODE if empty is not None else f"its own component: {why}",
                "workarounds_fired": {k: a.workarounds_fired for k, a in components.items()}}
    if recipes:
        metadata["quantization"] = {k: components[k].extra_metadata.get("quantization") for k in recipes}
    if carried:
        metadata["module_state"] = list(carried)
    # a cache the model fills in place (given empty to the prefill) is, to the loop, the components' output
    rules = {k: "outputs" if r == "updated" and not prefill.trees[k][0] else r for k, r in rules.items()}
    caller_inputs = [k for k in prefill.tensors if k not in prefill_rules]
    caller_inputs += [k for k in prefill_sources(prefill_rules) if k not in caller_inputs]  # ids the prefill extends
    if token_input not in prefill.tensors and token_input in given:  # a prompt given as embeddings: the ids are
        caller_inputs.append(token_input)  # what the returned sequences start with, as generate's do
    if encoder_call:
        caller_inputs = list(dict.fromkeys([*(k for c in encoder_call.values() for k in c.tensors), *caller_inputs]))
    trees = {k: len(v[0]) for k, v in decode.trees.items()}
    if carried:  # the decode step's tree of module attributes: what the component before returned
        trees[MODULE_STATE], rules[MODULE_STATE] = len(carried), ATTRIBUTES
    generator = Generator(components, rules, caller_inputs, trees,
                          generation, metadata, prefill_rules, prefill_trees, token_input,
                          {label: call.output_names for label, call in encoder_call.items()}, empty)
    generator.source = (exporter, model, dict(inputs), config)
    return generator


def _read_generate(model, captured_inputs, given, generation, suppress=None):
    """``generate`` captured over ``captured_inputs`` (``suppress``: an id it may not choose) and the rules read
    off its calls: (calls, encoder calls, what each call left, prefill rules, decode rules, token input, the module
    attributes the components carry as state)."""
    returned: list[Returned] = []
    with record_returns(model, returned):  # what each call left: trees updated in place, output tensors
        calls, encoder_calls, sequences = capture_generate(model, captured_inputs, CAPTURED_STEPS, suppress=suppress)
    carried = carried_module_state(returned, sequences.shape[0], type(model).__name__)
    token_input, prompt_length = _token_input(model, calls[0], calls[1], given)
    prefill_rules = infer_prefill_rules(calls[0], given, generation)
    if token_input in prefill_sources(prefill_rules) and token_input in given:  # the sequences start with the
        prompt_length = given[token_input].shape[-1]  # caller's ids, not the prefill's (a column appended, a suffix)
    rules = infer_rules(calls, sequences, prompt_length, returned, prefill_rules, generation)
    return calls, encoder_calls, returned, prefill_rules, rules, token_input, carried


def _token_input(model, prefill, decode, given) -> tuple[str, int]:
    """The decode steps' token input (input_ids, or decoder_input_ids) and the prompt's length. A prefill over
    ``inputs_embeds`` without ids (a language model whose caller merged image features into the embeddings:
    Blip-2's, InstructBlip's) takes the decode steps' token input; its prompt is the embeddings' length, and the
    sequences generate returns start with the ids the caller gave beside them (none: no prompt ids)."""
    token_input = next((k for k in TOKEN_INPUTS[::-1] if k in prefill.tensors), None)
    if token_input is not None:
        return token_input, prefill.tensors[token_input].shape[-1]
    token_input = next((k for k in TOKEN_INPUTS[::-1] if k in decode.tensors), None)
    embeds = prefill.tensors.get("inputs_embeds")
    if token_input is None or embeds is None:
        raise GenerationError(f"the first forward call of {type(model).__name__}.generate takes no token ids "
                              f"({TOKEN_INPUTS}) nor inputs_embeds; it takes {sorted(prefill.tensors)}")
    ids = given.get(token_input)
    if ids is not None and ids.shape[-1] != embeds.shape[1]:
        raise GenerationError(f"{type(model).__name__}.generate's prefill takes inputs_embeds over {embeds.shape[1]} "
                              f"positions beside {token_input} of {ids.shape[-1]}: generation export takes ids that "
                              "name the embeddings' positions, or none")
    return token_input, 0 if ids is None else ids.shape[-1]


def _export_static(exporter, model, inputs, config, generation, max_cache_len: int, prompt: str = "auto") -> StaticGenerator:
    state = STATIC_STATE.get(exporter.backend)
    given_config = config  # as the caller gave it, for a prompt component decided after the step's export
    if state is None:
        raise GenerationError(f"no static cache form for backend {exporter.backend!r}; known: {sorted(STATIC_STATE)}")
    if encoder_of(model) is not None:
        return _export_static_encoder_decoder(exporter, model, inputs, config, generation, max_cache_len, state, prompt)
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise GenerationError("the static cache form takes input_ids [batch, prompt] (a decoder-only model)")
    if ids.shape[1] > max_cache_len:
        raise GenerationError(f"input 'input_ids' dim 1 (prompt) is {ids.shape[1]}, longer than "
                              f"max_cache_len={max_cache_len}")
    from exporters.generation.genai import model_patches

    # the calls read under the export's model patches where the model's own static-cache generate fails without them
    step = static_step_for(model, inputs, max_cache_len, state, patches=model_patches(exporter))
    missing = [k for k in step.extras if not isinstance(inputs.get(k), torch.Tensor)]
    if missing:
        raise GenerationError(f"{type(model).__name__}.generate passes {missing} to every forward call; give them "
                              "(shaped like input_ids) for the static step's first call")
    if step.same and (step.from_prompt or step.embeds):
        raise GenerationError(f"{type(model).__name__}.generate passes {list(step.same)} unchanged to every call beside "
                              "a prompt that needs its own component or embeddings: the static form takes such inputs "
                              "only in a step over token ids")
    if isinstance(step, WholeSequenceStep):
        return _asked(_export_whole_sequence(exporter, model, inputs, config, generation, step, state), step)
    if isinstance(step, StaticStep) and step.from_prompt:  # generate hands later calls the prompt call's outputs
        if prompt == "step":
            raise GenerationError(f"{type(model).__name__}.generate hands its calls after the prompt's the prompt call's "
                                  f"outputs ({step.from_prompt}): only a prompt component returns them (prompt='auto')")
        return _asked(export_with_prompt(exporter, model, inputs, config, generation, max_cache_len, "generate hands its "
                                         f"later calls the prompt call's outputs (input: output {step.from_prompt})",
                                         _step_exporter(exporter)), step)
    config = config if config is not None else exporter.config_class()
    components, embedded, embed_inputs, embed = {}, None, None, None
    fixed = dataclasses.replace(config, dynamic=False, dynamic_shapes=None)
    if step.embeds:  # the prompt's call takes image / audio features: embed and embed_tokens components
        given = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        if isinstance(given.get("inputs_embeds"), torch.Tensor):  # the caller gives the prompt's embeddings itself
            embedded, embed_inputs = {"inputs_embeds": given["inputs_embeds"]}, ["inputs_embeds"]  # (Blip-2's handoff)
        else:
            try:
                embed, embedded = prefill_embeds(model, given)
            except GenerationError as refused:  # the decoder merges the prompt's inputs itself: the whole forward
                if prompt == "step":
                    raise
                return _asked(export_with_prompt(exporter, model, inputs, config, generation, max_cache_len,
                                                 f"no step over embeddings: {refused}", _step_exporter(exporter)), step)
            step.deepstack = sum(1 for k in embedded if k.startswith(DEEPSTACK_PREFIX))
            step.handed = tuple(handed_names(embedded))
            for name in read_beyond_embeddings(model, given, embedded, list(step.prompt_tokens)):  # Molmo2's mask
                step.extras[name] = decode_rule(model, inputs, name, lambda: fresh_step_cache(
                    model, int(ids.shape[0]), int(ids.shape[1]) + CHECKED_TOKENS, step.fixed))
            embed_inputs = list(given)
    # a prompt component where the step's one-token prompt does not compute what eager generate does (static_prefill.py)
    why = prompt_path_differs(model, inputs, step, exporter.backend, generation, embed, embed_inputs) \
        if prompt == "auto" else None
    if why is not None:
        return _asked(export_with_prompt(exporter, model, inputs, config, generation, max_cache_len, why,
                                         _step_exporter(exporter)), step)
    if step.embeds:
        if embed is not None:
            components["embed"] = exporter.export(embed, {k: inputs[k] for k in embed_inputs}, fixed)
        components["embed_tokens"] = exporter.export(TokenEmbeds(model, step.deepstack, step.handed).eval(),
                                                     {"input_ids": ids[:, :1]}, fixed)
        for label in ("embed", "embed_tokens"):
            if label in components:
                components[label].extra_metadata.update({"component": label, "cache": "static"})
    def step_inputs() -> dict[str, torch.Tensor]:  # the step's example: its own inputs, and generate's unchanged ones
        return {**step_example(step, ids, inputs.get("attention_mask") if step.takes_mask else None,
                               {k: inputs[k] for k in step.extras}, embedded), **{k: inputs[k] for k in step.same}}

    example = step_inputs()
    # fixed batch and cache; the sequence (a prompt, then one token) is the only dynamic dim, an explicit
    # Dim(min=1): torch does not specialize it at 1 (no backed_size_oblivious needed, whose stride
    # questions would put the guard S != 1 on the step's reshapes)
    config = dataclasses.replace(config, dynamic=False, dynamic_shapes=step_dynamic_shapes(step, example),
                                 accept_size_one=False)
    if exporter.backend == "executorch" and step.runner_form:  # the metadata ExecuTorch's LLM runner reads
        config = dataclasses.replace(config, constant_methods={**llm_runner_methods(model, generation, max_cache_len,
                                                                                    step.token_by_token),
                                                               **(config.constant_methods or {})})
    artifact = _export_step(exporter, step, example, config, step_inputs)
    if prompt == "auto" and not step.embeds and "sequence_dim" in artifact.extra_metadata:
        # torch refused the sequence dim: the loop feeds the prompt one token a call, measured as above
        why = prompt_path_differs(model, inputs, step, exporter.backend, generation, one_token_refused=True)
        if why is not None:
            return _asked(export_with_prompt(exporter, model, inputs, given_config, generation, max_cache_len, why,
                                             _step_exporter(exporter)), step)
    artifact.extra_metadata.update({"component": "step", "cache": "static", "max_cache_len": max_cache_len,
                                    "cache_state": state, "cache_layout": step.cache_shapes()})
    components["step"] = artifact
    metadata = {"model_class": type(model).__name__, "cache": "static", "vocab_size": vocab_size(model),
                "workarounds_fired": {k: a.workarounds_fired for k, a in components.items()}}
    return _asked(StaticGenerator(components, batch=int(ids.shape[0]), max_cache_len=max_cache_len, state=state,
                                  cache_shapes=step.cache_shapes(),
                                  takes_positions=step.takes_positions and not step.runner_form,
                                  takes_mask=step.takes_mask, generation=generation, metadata=metadata,
                                  token_by_token=step.token_by_token, extras=step.extras,
                                  embed_inputs=embed_inputs, prompt_rule=getattr(step, "prompt_rule", None),
                                  same_inputs=list(step.same), extra_slots=getattr(step, "extra_slots", 0)), step)


def _asked(generator: StaticGenerator, step) -> StaticGenerator:
    """``generator`` with ``use_cache_asked`` in its metadata where the step's capture asked generate for a cache
    its generation config turns off (capture.static_cache_asked), or tried to and fell back."""
    if step.use_cache_asked:
        generator.metadata["use_cache_asked"] = step.use_cache_asked
    return generator


def _export_whole_sequence(exporter, model, inputs, config, generation, step: WholeSequenceStep,
                           state: str) -> StaticGenerator:
    """The static form of a model whose generate keeps no cache (exporters/generation/static_whole.py): one step
    over the sequence so far, S from 1 to max_cache_len."""
    ids = inputs["input_ids"]
    example = step.example(ids, inputs.get("attention_mask") if step.takes_mask else None,
                           {k: inputs[k] for k in step.extras})
    config = config if config is not None else exporter.config_class()
    config = dataclasses.replace(config, dynamic=False, dynamic_shapes=step.dynamic_shapes(example), accept_size_one=False)
    if exporter.backend == "executorch" and step.runner_form:  # the LLM runner without a KV cache
        config = dataclasses.replace(config, constant_methods={
            **llm_runner_methods(model, generation, step.max_len, use_kv_cache=False),
            **(config.constant_methods or {})})
    try:
        artifact = exporter.export(step, example, config)
    except Exception as exc:  # noqa: BLE001 - only a raised lower bound on the sequence is retried, the rest re-raised
        least = shortest_sequence(exc, "S", step.max_len)
        if least is None or ids.shape[1] < least:
            raise
        step.min_len = least  # the model computes only sequences of least or more: the artifact's bound says so
        config = dataclasses.replace(config, dynamic_shapes=step.dynamic_shapes(example))
        artifact = exporter.export(step, example, config)
        artifact.extra_metadata["sequence_dim"] = (f"S from {least}: torch records the guard S >= {least} on the "
                                                   f"model's code ({str(exc).splitlines()[0]})")
    artifact.extra_metadata.update({"component": "step", "cache": "static", "max_cache_len": step.max_len,
                                    "cache_state": "none: the whole sequence each call"})
    metadata = {"model_class": type(model).__name__, "cache": "static", "vocab_size": vocab_size(model),
                "workarounds_fired": {"step": artifact.workarounds_fired}}
    return StaticGenerator({"step": artifact}, batch=step.batch, max_cache_len=step.max_len, state=state,
                           cache_shapes={}, takes_positions=step.takes_positions and not step.runner_form,
                           takes_mask=step.takes_mask, generation=generation, metadata=metadata, extras=step.extras,
                           whole_sequence=True)


def _export_static_encoder_decoder(exporter, model, inputs, config, generation, max_cache_len: int,
                                   state: str, prompt: str = "auto") -> StaticGenerator:
    """An encoder-decoder's static form: the ``encoder`` component and a one-token decoder ``step``, and a
    ``decoder_prompt`` component where the decoder computes its prompt in one call otherwise than a token a call
    (exporters/generation/static_encdec.py; ``prompt="step"`` keeps the one-token form)."""
    name = type(model).__name__
    asked = static_cache_asked(model)  # a generation config that keeps no cache: generate asked for one
    calls, encoder_calls, _ = capture_generate(model, inputs, CAPTURED_STEPS, **({"use_cache": True} if asked else {}))
    given = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    encoder_call = _encoder_calls(model, encoder_calls, given)
    prefill = calls[0]
    if list(encoder_call) != ["encoder"] or _prefill_tree_rules(model, prefill, encoder_call).get("encoder_outputs") != "encoder":
        raise GenerationError(f"{name}'s decoder does not take its encoder's outputs as encoder_outputs, from one encoder "
                              f"call ({sorted(encoder_call)}); the static encoder-decoder form needs that")
    if not all("past_key_values" in c.trees for c in calls[1:]):
        raise GenerationError(f"{name}.generate passes its decoder no past_key_values")
    same = same_inputs(name, calls, given, reads=lambda arg: decoder_reads(model, calls, arg))
    leaves, layout = prefill.trees["encoder_outputs"]
    ids = prefill.tensors["decoder_input_ids"]
    if ids.shape[1] + 1 > max_cache_len:
        raise GenerationError(f"the decoder prompt ({ids.shape[1]} tokens) does not fit max_cache_len={max_cache_len}")
    cross_example = {**{f"encoder_outputs__{i}": leaf for i, leaf in enumerate(leaves)},
                     **{step_name: prefill.tensors[arg] for step_name, arg in same.items()}}
    from exporters.generation.genai import model_patches

    def decoder_step(form: str, past_bounds: tuple[int, int | None] = (0, None)) -> StaticStep:
        # the one-token sizing call under the export's model patches where the model refuses it without them
        made = StaticStep(model, int(ids.shape[0]), max_cache_len, form, takes_positions=False, takes_mask=False,
                          cross=CrossAttention(layout, len(leaves), same, cross_example),
                          patches=model_patches(exporter)).eval()
        made.past_bounds = past_bounds
        return made

    why, twin = None, None
    if prompt == "auto" and ids.shape[1] > 1:  # generate feeds the decoder prompt in one call: measured against that
        twin = decoder_step("inputs")
        why = one_token_prompt_differs(model, inputs, twin, ids, cross_example, exporter.backend, model_patches(exporter))
    # after a decoder_prompt component, the step starts at slot P >= 2 and both programs take the cache as inputs
    state = "inputs" if why is not None else state
    step = twin if twin is not None and state == "inputs" else decoder_step(state)  # the twin where it is the step's form
    step.past_bounds = (1, None) if why is not None else (0, None)
    config = config if config is not None else exporter.config_class()
    fixed = dataclasses.replace(config, dynamic=False, dynamic_shapes=None, accept_size_one=False)
    call = encoder_call["encoder"]
    components = {"encoder": exporter.export(FlatComponent(encoder_module(model, *encoders_of(model)["encoder"], call),
                                                           call).eval(), {**flat_call_inputs(call), **call.constants}, fixed)}
    if why is not None:
        whole = decoder_step("inputs", (0, 0))
        example = {"input_ids": ids, "cache_position": torch.arange(ids.shape[1]), **cross_example, **whole.initial_cache()}
        components["decoder_prompt"] = exporter.export(whole, example, dataclasses.replace(
            fixed, dynamic_shapes={k: None for k in example}))
    example = {"input_ids": ids[:, :1], "cache_position": torch.tensor([ids.shape[1] if why is not None else 0]),
               **cross_example, **(step.initial_cache() if state == "inputs" else {})}
    components["step"] = exporter.export(step, example, dataclasses.replace(fixed, dynamic_shapes={k: None for k in example}))
    for label, a in components.items():
        a.extra_metadata.update({"component": label, "cache": "static"})
        if label != "encoder":
            a.extra_metadata.update({"max_cache_len": max_cache_len, "cache_state": state,
                                     "cache_layout": step.cache_shapes()})
    metadata = {"model_class": name, "cache": "static", "vocab_size": vocab_size(model),
                "workarounds_fired": {k: a.workarounds_fired for k, a in components.items()},
                **({"use_cache_asked": asked} if asked else {}), **({"prompt_component": why} if why else {})}
    return StaticGenerator(components, batch=int(ids.shape[0]), max_cache_len=max_cache_len, state=state,
                           cache_shapes=step.cache_shapes(), takes_positions=False, takes_mask=False,
                           generation=generation, metadata=metadata, token_input="decoder_input_ids",
                           token_by_token=True, encoder=encoder_spec(call, same, decoder_prompt_rule(name, ids, given, generation),
                                                                     int(ids.shape[1]) if why is not None else None))


def _step_exporter(exporter):
    return lambda step, example, config, retry_example: _export_step(exporter, step, example, config, retry_example)


def _export_step(exporter, step, example: dict[str, torch.Tensor], config, retry_example):
    """The step exported with its sequence as ``Dim("S", min=1)``. Where torch cannot take S over that range
    (a model that branches on one token against many: ``32 * S != 32`` in a MoE's capacity, ``S != 1`` in
    an attention path; torch reports a constraint violation), the step is exported at one token a call
    (``token_by_token``, every dim fixed) and the loop feeds the prompt one token at a time through the
    model's one-token path: ``retry_example()`` gives that example. Recorded as ``sequence_dim``."""
    try:
        return exporter.export(step, example, config)
    except Exception as exc:  # noqa: BLE001 - only torch's constraint violation is retried, the rest re-raised
        if "Constraints violated" not in str(exc) or step.token_by_token:
            raise
        first = str(exc).splitlines()[0]
    step.token_by_token = True
    example = retry_example()
    config = dataclasses.replace(config, dynamic_shapes=step_dynamic_shapes(step, example))
    if "enable_dynamic_shape" in (getattr(config, "constant_methods", None) or {}):  # the LLM runner prefills token by token
        config = dataclasses.replace(config, constant_methods={**config.constant_methods, "enable_dynamic_shape": False})
    artifact = exporter.export(step, example, config)
    artifact.extra_metadata["sequence_dim"] = f"one token a call: S over [1, {step.max_cache_len}] refused ({first})"
    return artifact


def _generation_dict(model) -> dict[str, Any]:
    generation = model.generation_config.to_diff_dict() if getattr(model, "generation_config", None) else {}
    if getattr(model, "generation_config", None) is not None:  # the ids the loop needs, defaults included
        for key in ("eos_token_id", "pad_token_id", "decoder_start_token_id", "bos_token_id", "forced_bos_token_id",
                    "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens", "min_new_tokens", "min_length"):
            generation[key] = getattr(model.generation_config, key, None)
    return {k: v for k, v in generation.items() if isinstance(v, (int, float, str, bool, list, type(None)))}


def _encoder_calls(model, encoder_calls: dict, given) -> dict:
    """The one call of each encoder that ran (an encoder-decoder's encoder; a multimodal model's image and
    video encoders, those its inputs use), checked to take only what the caller gives."""
    chosen = {}
    for label, calls in encoder_calls.items():
        if label == PREPARED:  # the encoder hook's calls: taken below for an encoder that takes what no caller gives
            continue
        if not calls and label != "encoder":
            continue  # a modality the inputs do not have (no video)
        prepared = prepared_encoder_call(encoder_calls, given) if label == "encoder" else None
        if prepared is not None and len(calls) == 1 and (calls[0].trees or any(k not in given for k in calls[0].tensors)):
            chosen[label] = prepared  # the model's own hook builds what its encoder takes (exporters/generation/encoder_prep.py)
            continue
        if len(calls) != 1:
            raise GenerationError(f"{type(model).__name__}.generate called its {label} {len(calls)} times; "
                                  "generation export takes one call of each encoder before the decoder steps")
        (call,) = calls
        missing = [k for k in call.tensors if k not in given]
        if missing or call.trees:
            raise GenerationError(f"{type(model).__name__}'s {label} takes {missing + list(call.trees)}, which the "
                                  "caller does not give")
        chosen[label] = call
    return chosen


def _prefill_tree_rules(model, prefill, encoder_calls: dict) -> dict[str, str]:
    """Where each tree the prefill takes comes from: "empty" (a cache with no tensor yet, rebuilt inside
    the component), "initial" (a fresh cache holding only scalars, the same for every prompt: baked into
    the prefill component) or "encoder" (the encoder components' outputs, in component order: an
    encoder-decoder's encoder_outputs, a multimodal model's mm_encoder_outputs; checked leaf by leaf)."""
    rules = {}
    for name, (leaves, _) in prefill.trees.items():
        if not leaves:
            rules[name] = "empty"
            continue
        if all(leaf.dim() == 0 for leaf in leaves):  # a fresh cache's scalars (a sliding layer's window, count 0)
            rules[name] = "initial"
            continue
        encoded = [leaf for call in encoder_calls.values() for leaf in call.output_trees[""][0]]
        if len(encoded) == len(leaves) and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(encoded, leaves)):
            rules[name] = "encoder"
            continue
        raise GenerationError(f"the prefill call of {type(model).__name__}.generate takes {name!r}, filled before the "
                              f"first forward by something other than its encoders ({sorted(encoder_calls)}), which "
                              "generation export does not capture")
    return {k: v for k, v in rules.items() if v != "empty"}  # "initial" trees are baked into the prefill


def _call_inputs(encoder_call: dict, prefill, decode, baked: tuple[str, ...]) -> dict[str, list[dict]]:
    """Per component label, the flat inputs (as its export takes them) of the calls it was exported from."""
    inputs = {label: [{**flat_call_inputs(call), **call.constants}] for label, call in encoder_call.items()}
    inputs["prefill"] = [{**flat_call_inputs(prefill, baked), **prefill.constants}]
    inputs["decode"] = [{**flat_call_inputs(decode), **decode.constants}]
    return inputs


def _component_inputs(model, sample: Mapping[str, Any], baked: tuple[str, ...]) -> dict[str, list[dict]]:
    """Per component label, the flat inputs of its calls when ``generate`` runs on ``sample`` (calibration): the
    prefill, the first decode step (the one the decode component was exported from: its shapes), the encoders."""
    padded = _padded(sample)
    calls, encoder_calls, _ = capture_generate(model, padded, CAPTURED_STEPS)
    given = {k: v for k, v in padded.items() if isinstance(v, torch.Tensor)}
    return _call_inputs(_encoder_calls(model, encoder_calls, given), calls[0], calls[1], baked)


def _padded(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs with the first row's first position padded when the mask pads nothing: generate drops an
    all-ones mask before the first forward, and components captured without one could not take padding."""
    inputs = dict(inputs)
    mask = inputs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[-1] > 1 and bool((mask == 1).all()):
        mask = mask.clone()
        mask[0, 0] = 0
        inputs["attention_mask"] = mask
    return inputs


class GenerationExport:
    """Mixed into each exporter: ``export_for_generation(model, inputs, config=None, cache="dynamic",
    max_cache_len=None)``."""

    # None where the decode graph traced at a one-token step may run the prompt from an empty cache; else why it
    # cannot, and empty_past.py traces it at two tokens instead
    decode_traced_at_one_token: str | None = None

    def export_for_generation(self, model: torch.nn.Module, inputs: Mapping[str, Any], config=None,
                              cache: str = "dynamic", max_cache_len: int | None = None,
                              quantization: Mapping[str, Any] | None = None, prompt: str = "auto") -> Generator | StaticGenerator:
        return export_for_generation(self, model, inputs, config, cache, max_cache_len, quantization, prompt)
