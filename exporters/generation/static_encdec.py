"""The static cache form of an encoder-decoder: two components, ``encoder`` (the encoder ``generate`` runs
once, exported from its captured call as in the dynamic form) and ``step`` (the decoder, one token a call,
over a static self-attention cache; the encoder's outputs and the inputs generate passes unchanged to every
decoder call are inputs of each call: ``CrossAttention`` in static.py).

The loop runs the encoder over the caller's inputs, then the decoder prompt ``generate`` starts from (the
decoder start token, then any ``decoder_input_ids`` the caller gives) one token a call, then one new token a
call. It returns the decoder's sequences, as the model's ``generate`` does.

``generate`` itself feeds the decoder prompt in one call. A decoder that computes a multi-token call otherwise
than the same tokens one a call gets a third component, ``decoder_prompt``: the same step over the whole decoder
prompt, at slots 0..P-1 of a zero cache, exported at the prompt's length P (the loop refuses another length by
name); the step goes on from slot P. Both programs then take the cache as inputs and return it
(``state="inputs"`` on every backend). Measured at export (``one_token_prompt_differs``), in eager, over the
caller's decoder prompt: the one-token form's logits and cache against the whole-prompt call's, beyond the
backend's tolerance (exporters/parity.py), where the whole-prompt call's logits are eager generate's first. FSMT's
decoder takes no mask with a cache, so it reads its prompt in both directions in one call (the cache of its prompt
positions 2.2e-3 apart); ProphetNet's n-gram streams gather relative-position terms across a multi-token call's
positions (logits 4.6e-4 apart). A decoder prompt of one token, or one whose two forms agree, keeps one program.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError, unflatten_tree
from exporters.generation.processors import greedy_token
from exporters.generation.steps import derive_prefill_input

# generate's decoder-call inputs the step sets itself, or that a one-token decoder call does not need
STEP_SET = ("decoder_input_ids", "cache_position", "past_key_values", "use_cache", "return_dict", "output_attentions",
            "output_hidden_states", "logits_to_keep")


def same_inputs(model_name: str, calls, given: Mapping[str, torch.Tensor],
                reads: Callable[[str], bool] | None = None) -> dict[str, str]:
    """The tensors generate passes to every decoder call unchanged, each the caller's input of the same name
    (the encoder's attention mask): ``{step input name: forward argument}``; the step input is prefixed
    ``encoder_`` where the name is one of the step's own. A tensor that changes from call to call (or is passed
    to some calls only) is left out where ``reads(name)`` says the decoder calls do not read it
    (``decoder_reads``); anything else a decoder call takes is refused by name."""
    same = {}
    for name, value in calls[0].tensors.items():
        if name in STEP_SET:
            continue
        changing = not all(name in c.tensors and torch.equal(c.tensors[name], value) for c in calls[1:]) \
            or name not in given or not torch.equal(given[name], value)
        if changing and reads is not None and not reads(name):
            continue
        if changing:
            raise GenerationError(f"{model_name}.generate passes {name!r} to its decoder calls, changed from call to call "
                                  "or not as the caller gave it; the static encoder-decoder step takes the decoder's "
                                  "token, the encoder's outputs and unchanged caller inputs only")
        same[f"encoder_{name}" if name in ("input_ids", "attention_mask", "position_ids") else name] = name
    other = sorted(k for c in calls for k in c.trees if k not in ("encoder_outputs", "past_key_values"))
    if other:
        raise GenerationError(f"{model_name}.generate passes {other} to its decoder; the static encoder-decoder step "
                              "takes encoder_outputs and its own cache only")
    return same


def decoder_reads(model: torch.nn.Module, calls, name: str) -> bool:
    """Whether any captured decoder call that was given ``name`` depends on it: each such call is run again without
    its cache, once as captured and once without ``name``; different outputs, or a call refused without it, say it
    does. generate hands Udop's and T5Gemma2's first decoder call the prompt's pixel_values, which their forward
    reads only where it runs the encoder itself: given encoder_outputs it never does."""
    from exporters.pytrees import flatten_outputs

    for call in calls:
        if name not in call.tensors:
            continue
        kwargs = {**call.constants, **call.tensors, "use_cache": False, "return_dict": True,
                  **{k: unflatten_tree(*tree) for k, tree in call.trees.items() if k != "past_key_values"}}
        kwargs.pop("cache_position", None)
        with torch.no_grad():
            try:
                without = flatten_outputs(model(**{k: v for k, v in kwargs.items() if k != name}))
            except Exception:  # noqa: BLE001 - a call refused without it reads it
                return True
            captured = flatten_outputs(model(**kwargs))
        if not captured or without.keys() != captured.keys() or \
                not all(torch.equal(without[k], captured[k]) for k in captured):  # nothing to compare: it may read it
            return True
    return False


def generate_encoder_decoder(gen, given: dict[str, torch.Tensor], max_new_tokens: int, eos, pad,
                             teacher_tokens: torch.Tensor | None):
    """The loop (module docstring) for a ``StaticGenerator`` with ``encoder`` set; returns (sequences, logits
    per step, the last cache)."""
    spec = gen.encoder
    missing = [k for k in [*spec["inputs"], *spec["same"].values()] if given.get(k) is None]
    if missing:
        raise GenerationError(f"the encoder-decoder generator takes {missing} (the encoder's inputs, as at export); "
                              "not given")
    encoded = gen.components["encoder"](**{k: given[k] for k in spec["inputs"]})
    fixed = {f"encoder_outputs__{i}": encoded[name] for i, name in enumerate(spec["outputs"])}
    fixed.update({step_name: given[name] for step_name, name in spec["same"].items()})
    # the decoder prompt as generate made it: the start token then any given ids (T5, Bart), or the given ids
    # themselves where generate takes them as the whole prompt (Whisper's, which hold its start token)
    rule = spec.get("decoder_prompt", "decoder_start")
    ids = given.get("decoder_input_ids") if rule == "given" else derive_prefill_input(rule, given, gen.generation)
    if ids is None:
        raise GenerationError("this generator's decoder prompt is the caller's decoder_input_ids (as the model's "
                              "generate took them at export); not given")
    batch, prompt = ids.shape
    if batch != gen.batch:
        raise GenerationError(f"the batch is {batch}; this static cache was exported for batch {gen.batch} exactly")
    if prompt + max_new_tokens - 1 > gen.max_cache_len:
        raise GenerationError(f"a decoder prompt of {prompt} plus max_new_tokens={max_new_tokens} needs "
                              f"{prompt + max_new_tokens - 1} cache slots; max_cache_len is {gen.max_cache_len}")
    step, whole = gen.components["step"], gen.components.get("decoder_prompt")
    if whole is not None and prompt != spec["decoder_prompt_length"]:
        raise GenerationError(f"a decoder prompt of {prompt} tokens; this generator's decoder_prompt component was "
                              f"exported for {spec['decoder_prompt_length']} exactly (its decoder computes the prompt in "
                              f"one call otherwise than a token a call: {gen.metadata.get('prompt_component')})")
    cache = {k: torch.zeros(s) for k, s in gen.cache_shapes.items()} if gen.state == "inputs" else {}
    for t in range(prompt - 1 if whole is None else 0):
        _, cache = gen._call(step, {"input_ids": ids[:, t:t + 1], "cache_position": torch.tensor([t]), **fixed}, cache)
    unfinished = torch.ones(batch, dtype=torch.bool)
    token_in, new_tokens, step_logits = ids[:, -1:], [], []
    for i in range(max_new_tokens):
        if i == 0 and whole is not None:  # the whole decoder prompt, as generate's first decoder call
            outputs, cache = gen._call(whole, {"input_ids": ids, "cache_position": torch.arange(prompt), **fixed}, cache)
        else:
            outputs, cache = gen._call(step, {"input_ids": token_in, "cache_position": torch.tensor([prompt - 1 + i]),
                                              **fixed}, cache)
        logits = outputs["logits"]
        token = greedy_token(gen.generation, logits, length=prompt + i, prompt_length=prompt,
                             max_length=prompt + max_new_tokens, eos=eos, pad=pad, unfinished=unfinished,
                             teacher=None if teacher_tokens is None else teacher_tokens[:, i],
                             sequence=torch.cat([ids, *(t[:, None] for t in new_tokens)], dim=1),
                             encoder_ids=given.get("input_ids"))
        new_tokens.append(token)
        step_logits.append(logits)
        if not unfinished.any():
            break
        token_in = token[:, None]
    return torch.cat([ids, torch.stack(new_tokens, dim=1)], dim=1), step_logits, cache


def encoder_spec(call, same: Mapping[str, str], decoder_prompt: str = "decoder_start",
                 decoder_prompt_length: int | None = None) -> dict[str, Any]:
    """What the loop needs of the encoder component: its inputs (the caller's, by name), its outputs in the order
    of the decoder's ``encoder_outputs__<i>`` inputs, the ``same`` inputs, how the decoder prompt follows from
    the caller's inputs (``decoder_prompt_rule``) and, where a ``decoder_prompt`` component runs it, its length."""
    return {"inputs": list(call.tensors), "outputs": list(call.output_names), "same": dict(same),
            "decoder_prompt": decoder_prompt,
            **({"decoder_prompt_length": decoder_prompt_length} if decoder_prompt_length is not None else {})}


def one_token_prompt_differs(model: torch.nn.Module, inputs: Mapping[str, Any], step, ids: torch.Tensor,
                             fixed: Mapping[str, torch.Tensor], backend: str, patches=()) -> str | None:
    """Why ``step`` (a cross-attention StaticStep with ``state="inputs"``, run in eager under the export's model
    ``patches`` as it is traced: FSMT's mask over a static cache's unwritten slots is one) fed the decoder prompt
    ``ids`` one token a call does not compute what one call over the whole prompt computes, logits and cache beyond
    ``backend``'s tolerance, where that call's logits are eager generate's first (module docstring); None where the
    forms agree, the prompt is one token, or the whole-prompt call fails or is itself off from eager generate (the
    one-token form stands, and the item says how far)."""
    from exporters.parity import compare
    from exporters.utils import apply_patches

    prompt = int(ids.shape[1])
    if prompt < 2:
        return None

    def run(calls) -> dict[str, torch.Tensor]:
        cache = step.initial_cache()
        for tokens, slots in calls:
            out = step(input_ids=tokens, cache_position=slots, **fixed, **cache)
            cache = {k: out["present" + k.removeprefix("past")] for k in cache}
        return {"logits": out["logits"], **cache}

    with torch.no_grad(), apply_patches(patches):
        try:
            whole = run([(ids, torch.arange(prompt))])
        except Exception:  # noqa: BLE001 - no call over the whole prompt in eager: nothing to export one from
            return None
        one = run([(ids[:, t:t + 1], torch.tensor([t])) for t in range(prompt)])
    off = compare(whole, one, backend)
    if not off:
        return None
    with torch.no_grad():
        eager = model.generate(**inputs, max_new_tokens=1, min_new_tokens=1, do_sample=False,
                               return_dict_in_generate=True, output_logits=True)
    if compare({"logits": eager.logits[0]}, {"logits": whole["logits"]}, backend):
        return None
    return (f"fed one token a call, the decoder prompt ({prompt} tokens) gives other logits or cache than one call "
            f"over it, as generate makes, beyond {backend}'s tolerance ({off[0]})")


def decoder_prompt_rule(name: str, ids: torch.Tensor, given: Mapping[str, torch.Tensor], generation: dict) -> str:
    """``"given"`` where generate's first decoder call takes the caller's decoder_input_ids as they are (Whisper's
    generate: its prompt holds the start and task tokens), else ``"decoder_start"`` (the start token, then any
    given ids), checked against the ids generate passed."""
    mine = given.get("decoder_input_ids")
    if mine is not None and mine.shape == ids.shape and torch.equal(mine, ids):
        return "given"
    try:
        derived = derive_prefill_input("decoder_start", dict(given), generation)
    except KeyError:
        derived = None
    if derived is not None and derived.shape == ids.shape and torch.equal(derived, ids):
        return "decoder_start"
    raise GenerationError(f"{name}.generate's first decoder call takes decoder_input_ids {ids.tolist()}, neither the "
                          "caller's nor the start token followed by them")
