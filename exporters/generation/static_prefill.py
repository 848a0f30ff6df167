"""The static form's ``prompt`` component: the model's own forward over the whole prompt, writing the cache the
step then reads.

The static step (static.py) takes the prompt in one call over token ids, or one token a call where it keeps
linear-attention states, or, where generate hands the prompt's call image or audio inputs, over the embeddings an
embed component computes (static_embeds.py). These cases fit none of them:

- a decoder that merges the prompt's other inputs itself: no ``inputs_embeds`` exist that a step over embeddings
  could take (``prefill_embeds`` refuses: Chameleon turns the image into VQ token ids inside its decoder,
  Kosmos-2.5 scatters the image embeddings there, Granite4Vision adds per-layer features at a boolean mask);
- a state-space layer whose prompt path (a chunked scan) and one-token path compute different things, beyond the
  backend's tolerance (NemotronH and Zamba2 clamp dt in the scan only): fed one token a call, the step does not
  compute what eager ``generate`` computes. ``prompt_path_differs`` measures this in eager at export, over the
  caller's prompt: the one-token form's logits against eager generate's over ``CHECKED_STEPS`` steps, teacher-forced.
  Where they agree, or where the prompt component does no better, the step keeps its one-token prompt (and, on
  ExecuTorch, its runner form). A step over a state of the model's own (static_state.py's ``OwnStateStep``) is
  measured the same way: Rwkv's one-token branch mixes the rows of a batch over 1, its prompt path does not, so a
  batch of 2 gets a prompt component (``own_state_prompt``: the step's own forward over the whole prompt) and one
  row keeps the one program;
- a padded prompt over linear-attention states: fed one token a call, the padding would reach the states, which the
  model's prompt path zeroes (the one-token loop refuses such a prompt by name);
- a generate that hands its later calls what the prompt call returned (static_calls.py's ``from_prompt``: Idefics'
  image_hidden_states, given back as image_encoder_embeddings, its vision tower inside the forward): the prompt
  component returns those outputs beside the logits, and the step takes them as inputs at every call, fixed in shape
  for the sequence (generator metadata ``prompt_outputs``: step input -> prompt output); plain values generate passes
  every call (interpolate_pos_encoding) are constants both programs bake.

For all of these, a ``prompt`` component runs the model's forward over the whole prompt, the call ``generate`` makes with a
static cache (its image or audio inputs included, ``prompt_inputs``), from a zero cache, and returns the first
logits and the written cache as ``present_*`` outputs in the layout of the step's ``past_*`` inputs; the step goes
on from there one token a call, over token ids. The cache passes between the two programs, so both keep it as
inputs and outputs (``state="inputs"``) on every backend; the generator's metadata says why (``prompt_component``).
ExecuTorch's LLM runner, which keeps the cache in one program's buffers, cannot load such a pair
(``save(runner=True)`` refuses); ``export_for_generation(..., prompt="step")`` keeps the one program. The prompt
component is exported at the prompt's shape: batch, length and the image or audio inputs are fixed, and the loop
refuses another prompt length by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError
from exporters.generation.runners import vocab_size
from exporters.generation.static import StaticStep, static_step_for, step_dynamic_shapes, step_example
from exporters.generation.static_embeds import TokenEmbeds
from exporters.generation.static_layers import is_linear
from exporters.generation.static_loop import StaticGenerator
from exporters.generation.static_state import OwnStateStep, own_state_prompt
from exporters.utils import apply_patches

# the steps the one-token prompt is measured over (``prompt_path_differs``): the prompt's logits and the steps on from
# the state it left, where a difference within tolerance at the prompt grows past it (Nemotron3.5-Transcribe on
# ONNX Runtime: 6.3e-05 at the prompt, 1.25e-04 one step on, 1.7e-04 three steps on)
CHECKED_STEPS = 8


class PromptStep(StaticStep):
    """The model's forward over the whole prompt into a zero static cache (``state="inputs"``), given the prompt
    call's other inputs (``passthrough``) as generate passes them: see the module docstring. The loop calls it at
    ``cache_position`` 0..prompt-1 (static_loop.py), so it writes from slot 0 (``past_bounds``)."""

    past_bounds = (0, 0)

    def __init__(self, model: torch.nn.Module, step: StaticStep, batch: int, given: Mapping[str, Any]):
        if step.cross is not None or step.held_state.shapes():
            raise GenerationError(f"{type(model).__name__}: a prompt component is built for a decoder's step over "
                                  "its own cache (no cross-attention inputs, no state in module attributes)")
        super().__init__(model, batch, step.max_cache_len, "inputs", step.takes_positions, step.takes_mask,
                         reads_mask=step.inner_mask, extras=step.extras, cache_arg=step.cache_arg, sizing=step.sizing,
                         fixed=step.fixed, patches=step.eager_patches, extra_slots=step.extra_slots)
        self.token_by_token = False  # the whole prompt, through the model's multi-token path
        # the prompt's own mask [batch, prompt], as generate passes it (a state-space layer zeroes the positions it
        # marks among the call's last S: a mask over every slot would mark the unwritten ones); none for one
        # unpadded row
        self.inner_mask = False
        self.passthrough = prompt_passthrough(step, given)
        self.constants, self.returns = dict(step.constants), tuple(dict.fromkeys(step.from_prompt.values()))

    def forward(self, input_ids: torch.Tensor | None = None, cache_position: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                **given: torch.Tensor) -> dict[str, torch.Tensor]:
        for layer in self._cache.layers:  # a new sequence: the model's prefill branch for every state
            if is_linear(layer):
                layer.has_previous_state = dict.fromkeys(layer.has_previous_state, False)
        return super().forward(input_ids, cache_position, position_ids, attention_mask, **given)


def prompt_passthrough(step: StaticStep, given: Mapping[str, Any]) -> tuple[str, ...]:
    """The caller's inputs the prompt component hands the model besides the step's: those generate passes the prompt
    call as given. Where generate passes what it made from them (``mm_encoder_outputs``: the modality encoders it ran
    before the first forward), the model's forward is given the caller's inputs instead and runs the same encoders
    itself: every caller tensor but the tokens, the mask and the per-token extras."""
    wanted = tuple(step.prompt_inputs)
    tensors = [k for k, v in given.items() if isinstance(v, torch.Tensor)]
    if all(k in tensors for k in wanted):
        return wanted
    return tuple(k for k in tensors if k not in ("input_ids", "attention_mask", *step.extras))


def prompt_component(model: torch.nn.Module, step: StaticStep | OwnStateStep, batch: int,
                     given: Mapping[str, Any]) -> PromptStep | OwnStateStep:
    """The prompt component that goes before ``step``: a ``PromptStep`` before a cache step, the step's own forward
    over the whole prompt before a step over the model's own state (static_state.py's ``own_state_prompt``)."""
    if isinstance(step, OwnStateStep):
        return own_state_prompt(step)
    return PromptStep(model, step, batch, given).eval()


def prompt_example(prompt: PromptStep | OwnStateStep, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    ids = inputs["input_ids"]
    mask = inputs.get("attention_mask") if prompt.takes_mask else None
    example = step_example(prompt, ids, mask, {k: inputs[k] for k in prompt.extras})
    if prompt.takes_mask:
        example["attention_mask"] = mask if mask is not None else torch.ones_like(ids)
    return {**example, **{k: inputs[k] for k in prompt.passthrough}}


def _eager_loop(components: Mapping[str, Any], twin: StaticStep | OwnStateStep, batch: int, generation: Mapping[str, Any],
                **kwargs: Any) -> StaticGenerator:
    """The static loop over eager modules (``twin``'s cache as inputs and outputs), one token a call after the prompt."""
    return StaticGenerator(components, batch=batch, max_cache_len=twin.max_cache_len, state="inputs",
                           cache_shapes=twin.cache_shapes(), takes_positions=twin.takes_positions and not twin.runner_form,
                           takes_mask=twin.takes_mask, generation=generation, token_by_token=True, extras=twin.extras,
                           extra_slots=getattr(twin, "extra_slots", 0), **kwargs)


def prompt_path_differs(model: torch.nn.Module, inputs: Mapping[str, Any], step: Any, backend: str,
                        generation: Mapping[str, Any], embed: torch.nn.Module | None = None,
                        embed_inputs: list[str] | None = None, one_token_refused: bool = False) -> str | None:
    """Why a step of linear-attention states or of the model's own state, fed the prompt one token a call, does not stand in for eager
    ``generate``'s prompt (the logits of the first ``CHECKED_STEPS`` steps, teacher-forced, apart beyond ``backend``'s
    tolerance, exporters/parity.py) where a prompt component does; None where it does, or where neither does (the step
    keeps its one-token form, the runner's).
    Measured in eager over ``inputs``, on an ``"inputs"`` twin of ``step`` (its own cache is not touched) behind the
    embed component ``embed`` where the step takes embeddings. ``one_token_refused``: the step over key/value layers
    was exported one token a call because torch refused its sequence dim (generation/__init__.py's ``_export_step``),
    so the loop feeds the prompt one token a call there too: measured the same way (ProphetNet's n-gram streams add
    relative-position terms gathered across the prompt's positions in a multi-token call,
    get_predict_relative_pos_embeddings, so its prompt fed one token a call gives other logits). A step whose model
    runs over a static cache only under the export's patches (``StaticStep.eager_patches``) is run under them."""
    from exporters.parity import compare

    own = isinstance(step, OwnStateStep)
    if getattr(step, "prompt_rule", None) is not None:  # a prompt component runs the whole prompt, not its last tokens as generate
        return None
    if step.same:  # no prompt component takes generate's unchanged inputs: the one-token path stands
        return None
    if not own and (not isinstance(step, StaticStep) or not step.token_by_token or step.cross is not None or
                    step.held_state.shapes() or not (one_token_refused or any(is_linear(layer) for layer in step._cache.layers))):
        return None
    ids, mask = inputs["input_ids"], inputs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()) and not one_token_refused:
        if own:  # a model of its own state reads no mask in either path: the loop refuses a padded prompt by name
            return None
        # fed one token a call, padding would reach the states (a model zeroes padded positions in its prompt path)
        return "a padded prompt: the model's prompt path zeroes the padded positions before its states take them"
    batch = int(ids.shape[0])
    if own:
        twin = OwnStateStep(model, step.arg, batch, step.max_cache_len, "inputs").eval()
    else:
        twin = StaticStep(model, batch, step.max_cache_len, "inputs", step.takes_positions, step.takes_mask,
                          reads_mask=step.inner_mask, extras=step.extras, cache_arg=step.cache_arg, embeds=step.embeds,
                          fixed=step.fixed, patches=step.eager_patches, extra_slots=step.extra_slots).eval()
        twin.deepstack, twin.handed, twin.token_by_token = step.deepstack, step.handed, True
        twin.prompt_inputs = step.prompt_inputs
    components: dict[str, Any] = {"step": twin}
    if step.embeds:
        components["embed_tokens"] = TokenEmbeds(model, step.deepstack, step.handed).eval()
        if embed is not None:
            components["embed"] = embed
    loop = _eager_loop(components, twin, batch, generation, embed_inputs=embed_inputs)
    given = {k: inputs[k] for k in (*step.extras, *(embed_inputs or ())) if k not in ("input_ids", "attention_mask")}
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=CHECKED_STEPS, min_new_tokens=CHECKED_STEPS, do_sample=False,
                               return_dict_in_generate=True, output_logits=True)
        want = {f"logits_{i}": t for i, t in enumerate(eager.logits)}
        teacher = eager.sequences[:, -len(eager.logits):]

        def logits_of(generator: StaticGenerator, given: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            with apply_patches(getattr(step, "eager_patches", ())):
                out = generator.generate(ids, mask, max_new_tokens=len(eager.logits), teacher_tokens=teacher,
                                         return_dict_in_generate=True, output_logits=True, **given)
            return {f"logits_{i}": t for i, t in enumerate(out.logits)}

        off = compare(want, logits_of(loop, given), backend)
        if not off:
            return None
        prompt = prompt_component(model, twin, batch, inputs)
        whole = _eager_loop({"prompt": prompt, "step": twin}, twin, batch, generation,
                            prompt_inputs=list(prompt.passthrough))
        twin.embeds = False  # after the prompt component, the step takes token ids
        try:
            better = not compare(want, logits_of(whole, {k: inputs[k] for k in (*step.extras, *prompt.passthrough)}), backend)
        finally:
            twin.embeds = step.embeds
    if not better:
        return None
    return (f"fed one token a call through the model's one-token path, the prompt gives logits apart from eager "
            f"generate's beyond {backend}'s tolerance over the first {len(eager.logits)} steps ({off[0]}); the model's "
            "prompt path over the whole prompt does not")


def export_with_prompt(exporter, model: torch.nn.Module, inputs: Mapping[str, Any], config, generation: Mapping[str, Any],
                       max_cache_len: int, why: str, export_step) -> StaticGenerator:
    """A ``prompt`` component and the step over token ids after it, both with the cache as inputs and outputs.
    ``export_step(step, example, config, retry_example)``: the step's export (generation/__init__.py)."""
    name = type(model).__name__
    ids = inputs["input_ids"]
    from exporters.generation.genai import model_patches

    step = static_step_for(model, inputs, max_cache_len, "inputs", whole_prompt=True, patches=model_patches(exporter))
    if not isinstance(step, (StaticStep, OwnStateStep)):
        raise GenerationError(f"{name}: a prompt component follows a step over a cache or a state ({why})")
    if isinstance(step, StaticStep):  # the loop calls it after the prompt component wrote the prompt's slots
        step.past_bounds = (1, None)
    if step.prompt_rule is not None:  # the prompt component runs the whole prompt, which eager's first call does not
        raise GenerationError(f"{name}: a prompt component runs the whole prompt, and {name}.generate's first call takes "
                              f"only its last tokens ({step.prompt_rule}); needed because {why}")
    batch = int(ids.shape[0])
    prompt = prompt_component(model, step, batch, inputs)
    missing = [k for k in (*prompt.passthrough, *step.extras) if not isinstance(inputs.get(k), torch.Tensor)]
    if missing:
        raise GenerationError(f"{name}: the prompt component takes {missing} as generate passes them; not given")
    config = config if config is not None else exporter.config_class()
    fixed = dataclasses.replace(config, dynamic=False, dynamic_shapes=None, accept_size_one=False)
    components = {"prompt": exporter.export(prompt, prompt_example(prompt, inputs), fixed)}
    mask = inputs.get("attention_mask") if step.takes_mask else None
    handed = {}
    if step.from_prompt:  # the prompt's outputs the step takes at every call: the eager prompt's, for its example
        step.passthrough = tuple(step.from_prompt)
        with torch.no_grad():
            returned = prompt(**prompt_example(prompt, inputs))
        handed = {k: returned[out].detach().clone() for k, out in step.from_prompt.items()}

    def example():
        return {**step_example(step, ids, mask, {k: inputs[k] for k in step.extras}), **handed}

    first = example()
    components["step"] = export_step(step, first, dataclasses.replace(fixed, dynamic_shapes=step_dynamic_shapes(step, first)),
                                     example)
    for label, artifact in components.items():
        artifact.extra_metadata.update({"component": label, "cache": "static", "max_cache_len": max_cache_len,
                                        "cache_state": "inputs", "cache_layout": step.cache_shapes()})
    metadata = {"model_class": name, "cache": "static", "vocab_size": vocab_size(model),
                "prompt_component": why, "prompt_length": int(ids.shape[1]),
                **({"prompt_outputs": dict(step.from_prompt)} if step.from_prompt else {}),
                **({"baked_constants": dict(step.constants)} if step.constants else {}),
                "workarounds_fired": {k: a.workarounds_fired for k, a in components.items()}}
    return StaticGenerator(components, batch=batch, max_cache_len=max_cache_len, state="inputs",
                           cache_shapes=step.cache_shapes(), takes_positions=step.takes_positions and not step.runner_form,
                           takes_mask=step.takes_mask, generation=generation, metadata=metadata,
                           token_by_token=step.token_by_token, extras=step.extras, prompt_inputs=list(prompt.passthrough),
                           extra_slots=getattr(step, "extra_slots", 0))
