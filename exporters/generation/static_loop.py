"""The greedy loop over a static-cache ``step`` artifact (exporters/generation/static.py): the prompt in
one call (token by token for a step of linear-attention states; only its last n tokens where the model's generate
feeds its first call those alone, ``prompt_rule``), then one token a call, every shape checked against the export's
limits before anything runs."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError
from exporters.generation.generator import GENERATOR_FILE, GenerateOutput
from exporters.generation.processors import end_and_pad, greedy_token
from exporters.generation.static_embeds import per_token_embedding
from exporters.generation.static_whole import positions_from_mask
from exporters.generation.steps import LAST_TOKENS, apply_tensor_rule, last_tokens_count, prefill_sources

FORMAT = "exporters.static-generator/1"


class StaticGenerator:
    """``components``: ``{"step": artifact}``; ``batch`` and ``max_cache_len``: fixed at export;
    ``state``: "buffers" (the cache lives in the artifact) or "inputs" (``cache_names`` go in and come
    back out); ``takes_positions`` / ``takes_mask``: which optional step inputs the model reads; ``extras``:
    per-token inputs shaped like ``input_ids`` (``token_type_ids``) the caller gives with the prompt, each
    by the step rule that gives its next value (exporters/generation/static.py, ``per_token_extras``);
    ``embed_inputs``: where the step takes embeddings, the caller's inputs the ``embed`` component takes
    (exporters/generation/static_embeds.py), None where it takes token ids; ``encoder``: an encoder-decoder's
    encoder component, its inputs and outputs (exporters/generation/static_encdec.py), else None; ``prompt_inputs``:
    where a ``prompt`` component runs the prompt (exporters/generation/static_prefill.py), the caller's inputs it
    takes besides the tokens, else None; ``prompt_rule``: where generate's first call takes only the prompt's last n
    tokens (``last_tokens:input_ids:<n>``, exporters/generation/steps.py; static.py reads it off generate), the loop
    feeds those at slots 0..n-1, the per-token extras and positions cut alike, the caller's mask over the prompt's
    slots as generate passes it; the returned sequences and generate's processors still count the caller's prompt.
    ``extra_slots``: the cache slots the prompt's call writes beyond its tokens (Git's image positions, static.py's
    ``StaticStep.extra_slots``): the cache holds them beside ``max_cache_len`` slots for tokens, the prompt's call
    writes them (from slot 0, its ``cache_position`` the prompt's), and decode token i goes to slot ``extra_slots +
    fed + i``; the mask stays over the tokens (``max_cache_len`` columns), as generate's 2-D mask, which the model
    widens over its extra slots itself."""

    cache = "static"

    def __init__(self, components: Mapping[str, Any], *, batch: int, max_cache_len: int, state: str,
                 cache_shapes: Mapping[str, tuple[int, ...]], takes_positions: bool, takes_mask: bool,
                 generation: Mapping[str, Any], metadata: Mapping[str, Any] | None = None, token_input: str = "input_ids",
                 token_by_token: bool = False, extras: Mapping[str, str] | None = None,
                 embed_inputs: list[str] | None = None, encoder: Mapping[str, Any] | None = None,
                 whole_sequence: bool = False, prompt_inputs: list[str] | None = None, prompt_rule: str | None = None,
                 same_inputs: list[str] | None = None, extra_slots: int = 0):
        if prompt_rule is not None:
            form = "an encoder-decoder's decoder" if encoder is not None else "a step over the whole sequence" \
                if whole_sequence else "a prompt component" if prompt_inputs is not None else "a step over embeddings" \
                if embed_inputs is not None else None
            if form is not None or not prompt_rule.startswith(LAST_TOKENS) or prefill_sources({token_input: prompt_rule}) \
                    != [token_input]:
                raise GenerationError(f"prompt_rule={prompt_rule!r}: the static loop feeds a prompt's last tokens "
                                      f"({LAST_TOKENS}{token_input}:<n>) through a step over token ids only"
                                      + (f", not {form}" if form else ""))
            last_tokens_count(prompt_rule)
        self.prompt_rule = prompt_rule
        if not isinstance(extra_slots, int) or extra_slots < 0:
            raise GenerationError(f"extra_slots={extra_slots!r}: the slots a prompt's call writes beyond its tokens, "
                                  "a count of 0 or more")
        if extra_slots and (token_by_token and prompt_inputs is None or whole_sequence or encoder is not None):
            form = "a step over the whole sequence" if whole_sequence else "an encoder-decoder's decoder" \
                if encoder is not None else "a prompt fed one token a call"
            raise GenerationError(f"extra_slots={extra_slots}: the static loop writes the slots a prompt's call writes "
                                  f"beyond its tokens at the prompt's one call over a cache, not through {form}")
        self.extra_slots = extra_slots
        self.components = dict(components)
        # a model without a cache: the step takes the whole sequence so far at every call (static_whole.py)
        self.whole_sequence = whole_sequence
        self.batch, self.max_cache_len, self.state = batch, max_cache_len, state
        self.cache_shapes = {k: tuple(v) for k, v in cache_shapes.items()}
        self.takes_positions, self.takes_mask = takes_positions, takes_mask
        self.generation = dict(generation)
        self.metadata = dict(metadata or {})
        self.token_input = token_input
        # the step takes one token a call (linear-attention states): the prompt goes in token by token
        self.token_by_token = token_by_token
        self.extras = dict(extras or {})
        # the caller's tensors generate passes unchanged to every call (static.py's ``same``): given to every step call
        self.same_inputs = list(same_inputs or ())
        self.embed_inputs = list(embed_inputs) if embed_inputs is not None else None
        # a ``prompt`` component runs the prompt (static_prefill.py): the caller's inputs it takes besides the tokens
        self.prompt_inputs = list(prompt_inputs) if prompt_inputs is not None else None
        self.encoder = dict(encoder) if encoder is not None else None
        self.rules = {"input_ids": "token", "cache_position": "next_position", **self.extras}
        if takes_positions:
            self.rules["position_ids"] = "next_position"
        if takes_mask:
            self.rules["attention_mask"] = "set_slot"
        self.prefill_rules = {"position_ids": "positions_from_mask"} if takes_positions else {}
        if prompt_rule is not None:
            self.prefill_rules[token_input] = prompt_rule
        self.trees = {"cache": len(self.cache_shapes)} if state == "inputs" else {}

    @property
    def backend(self) -> str:
        return self.components["step"].backend

    def fed(self, prompt: int) -> int:
        """The tokens the prompt's call takes of a prompt of ``prompt``: all of them, or under ``prompt_rule`` its
        last n."""
        return prompt if self.prompt_rule is None else min(prompt, last_tokens_count(self.prompt_rule))

    def prompt_slots(self, prompt: int) -> int:
        """The cache slots the prompt's call writes for a prompt of ``prompt`` tokens: the tokens it takes (all, or
        under ``prompt_rule`` the last n) and the ``extra_slots`` it writes beyond them (the decode steps write on
        from there)."""
        return self.extra_slots + self.fed(prompt)

    @property
    def cache_slots(self) -> int:
        """Every slot of the cache: ``max_cache_len`` for tokens and the ``extra_slots``."""
        return self.max_cache_len + self.extra_slots

    def _check(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, max_new_tokens: int,
               other: Mapping[str, Any]) -> None:
        takes = set(self.extras) | set(self.embed_inputs or ()) | set(self.prompt_inputs or ()) | set(self.same_inputs)
        unexpected = sorted(k for k in other if k not in takes)
        if unexpected:
            raise GenerationError(f"the static step takes input_ids, attention_mask and {sorted(takes)} only; "
                                  f"unexpected {unexpected}")
        missing = [k for k in self.same_inputs if not isinstance(other.get(k), torch.Tensor)]
        if missing:
            raise GenerationError(f"the static step takes {missing} at every call (generate passes them unchanged to "
                                  "every forward call); give them")
        missing = sorted(k for k in takes if other.get(k) is None and k not in ("input_ids", "attention_mask"))
        if missing:
            what = "the embed component's inputs, as at export, and per-token inputs shaped like input_ids" \
                if self.embed_inputs else "the prompt component's inputs, as at export, and per-token inputs shaped " \
                "like input_ids" if self.prompt_inputs else "per-token inputs shaped like input_ids"
            raise GenerationError(f"the static step takes {missing} with the prompt ({what}); not given")
        if input_ids is None or input_ids.dim() != 2:
            raise GenerationError("input_ids must be a [batch, prompt] tensor")
        for k in self.extras:  # [batch, S], or [batch, S, ...] (Idefics' image_attention_mask)
            if tuple(other[k].shape[:2]) != tuple(input_ids.shape):
                raise GenerationError(f"input {k!r} has shape {tuple(other[k].shape)}; the static step takes it "
                                      f"shaped like input_ids, {tuple(input_ids.shape)}")
        batch, prompt = input_ids.shape
        if batch != self.batch:
            raise GenerationError(f"input 'input_ids' dim 0 (batch) is {batch}; this static cache was exported for "
                                  f"batch {self.batch} exactly (export again with a batch of {batch})")
        if max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if prompt > self.max_cache_len:
            raise GenerationError(f"input 'input_ids' dim 1 (prompt) is {prompt}, longer than the static cache "
                                  f"(max_cache_len={self.max_cache_len})")
        written = self.prompt_slots(prompt)  # the slots the prompt's call writes
        if written + max_new_tokens - 1 > self.cache_slots:
            # a step over the whole sequence keeps no cache: its bound is the longest sequence one call takes
            need = "tokens in its last call" if self.whole_sequence else "cache slots"
            taken = self.fed(prompt)
            fed = f"a prompt of {prompt}" + (f" (its last {taken} fed: {self.prompt_rule})" if taken != prompt else "")
            extra = f" and the {self.extra_slots} slots its call writes beyond them" if self.extra_slots else ""
            has = f"max_cache_len is {self.max_cache_len}" + (f" (+ {self.extra_slots} extra slots: {self.cache_slots})"
                                                              if self.extra_slots else "")
            raise GenerationError(f"{fed}{extra} plus max_new_tokens={max_new_tokens} needs "
                                  f"{written + max_new_tokens - 1} {need}; {has} "
                                  f"(at most {self.cache_slots - written + 1} new tokens for this prompt)")
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise GenerationError(f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids "
                                  f"{tuple(input_ids.shape)}")
        exported = self.metadata.get("prompt_length")
        if self.prompt_inputs is not None and exported is not None and prompt != exported:
            raise GenerationError(f"input 'input_ids' dim 1 (prompt) is {prompt}; this generator's prompt component "
                                  f"was exported for a prompt of {exported} tokens exactly (export again at {prompt})")
        padded = attention_mask is not None and not bool((attention_mask == 1).all())
        if padded and self.token_by_token and self.prompt_inputs is None:
            raise GenerationError("this step keeps linear-attention states and takes one token a call; a model zeroes "
                                  "padded positions in its prompt path only, so the step cannot run a padded prompt "
                                  "(give rows of one length, without padding)")
        if padded and not self.takes_mask:
            raise GenerationError("this step takes no attention_mask (the model's generate passed none at export), "
                                  "so it cannot run a padded batch")

    def generate(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int | None = None, eos_token_id: int | list[int] | None = None,
                 pad_token_id: int | None = None, teacher_tokens: torch.Tensor | None = None,
                 return_dict_in_generate: bool = False, output_logits: bool = False,
                 **other: torch.Tensor) -> torch.Tensor | GenerateOutput:
        """Greedy generation through the step artifact; arguments as ``Generator.generate``."""
        max_new_tokens = max_new_tokens if max_new_tokens is not None else self.generation.get("max_new_tokens") or 20
        if self.encoder is not None:  # an encoder-decoder: the encoder, then the decoder one token a call
            from exporters.generation.static_encdec import generate_encoder_decoder

            if max_new_tokens < 1:
                raise GenerationError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
            eos, pad = end_and_pad(self.generation, eos_token_id, pad_token_id)
            given = {k: v for k, v in {"input_ids": input_ids, "attention_mask": attention_mask, **other}.items()
                     if v is not None}
            sequences, step_logits, cache = generate_encoder_decoder(self, given, max_new_tokens, eos, pad, teacher_tokens)
            if not return_dict_in_generate:
                return sequences
            return GenerateOutput(sequences, tuple(step_logits) if output_logits else (), cache, len(step_logits))
        self._check(input_ids, attention_mask, max_new_tokens, other)
        eos, pad = end_and_pad(self.generation, eos_token_id, pad_token_id)
        if self.whole_sequence:
            sequences, step_logits = self._generate_whole(input_ids, attention_mask, max_new_tokens, eos, pad,
                                                          teacher_tokens, {k: other[k] for k in self.extras})
            if not return_dict_in_generate:
                return sequences
            return GenerateOutput(sequences, tuple(step_logits) if output_logits else (), {}, len(step_logits))
        batch, prompt = input_ids.shape
        # the prompt's tokens the first call takes: all, or its last ``fed`` (prompt_rule); the mask stays the caller's
        # over the prompt's slots, as generate passes it (slot j gets the prompt's mask at j)
        fed = self.fed(prompt)
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        full = torch.zeros(batch, self.max_cache_len, dtype=torch.long)
        full[:, :prompt] = mask
        step = self.components["step"]
        extras = {k: other[k][:, prompt - fed:] for k in self.extras}
        tokens, embedded = {"input_ids": input_ids[:, prompt - fed:]}, {}
        if self.embed_inputs is not None:  # the embed component over the caller's inputs: the prompt's embeddings
            given = {"input_ids": input_ids, "attention_mask": attention_mask, **other}
            embedded = self.components["embed"](**{k: given[k] for k in self.embed_inputs if given.get(k) is not None}) \
                if "embed" in self.components else {"inputs_embeds": given["inputs_embeds"]}  # the caller's own
            tokens = {k: v for k, v in embedded.items() if per_token_embedding(k)}
        same = {k: other[k] for k in self.same_inputs}  # every call's, as the caller gave them
        feed: dict[str, torch.Tensor] = {**tokens, "cache_position": torch.arange(fed), **extras, **same}
        if self.takes_positions:
            positions = embedded.get("position_ids")
            if positions is None:
                positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)[..., prompt - fed:]
            feed["position_ids"] = positions
        cache = {k: torch.zeros(s) for k, s in self.cache_shapes.items()} if self.state == "inputs" else {}
        pending = None  # the prompt component's outputs: the first logits and the cache it wrote
        handed: dict[str, torch.Tensor] = {}  # the prompt's outputs every step call takes (``prompt_outputs``)
        if self.prompt_inputs is not None:
            pending, cache = self._call(self.components["prompt"], {
                **feed, **({"attention_mask": mask} if self.takes_mask else {}),  # the prompt's own, as generate's
                **{k: other[k] for k in self.prompt_inputs}}, cache)
            handed = {k: pending[out] for k, out in (self.metadata.get("prompt_outputs") or {}).items()}
        elif self.token_by_token and fed > 1:  # all but the prompt's last token, one a call
            for t in range(fed - 1):
                part = {**{k: v[:, t:t + 1] for k, v in tokens.items()}, "cache_position": torch.tensor([t]),
                        **{k: v[:, t:t + 1] for k, v in extras.items()}, **same}
                if self.takes_positions:
                    part["position_ids"] = positions[..., t:t + 1]
                if self.takes_mask:
                    part["attention_mask"] = full
                _, cache = self._call(step, part, cache)
            feed = {**{k: v[:, -1:] for k, v in tokens.items()}, "cache_position": torch.tensor([fed - 1]),
                    **{k: v[:, -1:] for k, v in extras.items()}, **same}
            if self.takes_positions:
                feed["position_ids"] = positions[..., -1:]
        unfinished = torch.ones(batch, dtype=torch.bool)
        new_tokens, step_logits = [], []
        for i in range(max_new_tokens):
            if self.takes_mask:
                feed["attention_mask"] = full
            outputs, cache = (pending, cache) if pending is not None else self._call(step, feed, cache)
            pending = None
            logits = outputs["logits"]
            token = greedy_token(self.generation, logits, length=prompt + i, prompt_length=prompt,
                                 max_length=prompt + max_new_tokens, eos=eos, pad=pad, unfinished=unfinished,
                                 teacher=None if teacher_tokens is None else teacher_tokens[:, i],
                                 sequence=torch.cat([input_ids, *(t[:, None] for t in new_tokens)], dim=1),
                                 encoder_ids=input_ids)  # generate's inputs_tensor: the prompt, as the dynamic loop
            new_tokens.append(token)
            step_logits.append(logits)
            if i == max_new_tokens - 1 or not unfinished.any():
                break
            # where the next call writes: after the prompt's call's slots (its tokens' and any extra ones); the mask
            # covers the caller's prompt, then each new token
            slot = self.extra_slots + fed + i
            full = full.clone()
            if prompt + i < self.max_cache_len:  # (past it, under prompt_rule: beyond every slot written)
                full[:, prompt + i] = 1
            extras = {k: apply_tensor_rule(rule, feed[k], token) for k, rule in self.extras.items()}
            tokens = {"input_ids": token[:, None]}
            if self.embed_inputs is not None:
                tokens = dict(self.components["embed_tokens"](input_ids=token[:, None]))  # embeddings, DeepStack zeros
            feed = {**tokens, "cache_position": torch.tensor([slot]), **extras, **handed, **same}
            if self.takes_positions:
                positions = positions[..., -1:] + 1
                feed["position_ids"] = positions
        sequences = torch.cat([input_ids, torch.stack(new_tokens, dim=1)], dim=1)
        if not return_dict_in_generate:
            return sequences
        return GenerateOutput(sequences, tuple(step_logits) if output_logits else (), cache, len(new_tokens))

    def _generate_whole(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int,
                        eos: list[int], pad: int | None, teacher_tokens: torch.Tensor | None,
                        extras: dict[str, torch.Tensor]):
        """The loop of a step over the whole sequence (no cache): each call takes every token so far, and the
        per-token ``extras`` grown by their rules."""
        step = self.components["step"]
        batch, prompt = input_ids.shape
        sequence = input_ids
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        unfinished = torch.ones(batch, dtype=torch.bool)
        new_tokens, step_logits = [], []
        for i in range(max_new_tokens):
            feed = {"input_ids": sequence, **extras}
            if self.takes_mask:
                feed["attention_mask"] = mask
            if self.takes_positions:
                feed["position_ids"] = positions_from_mask(mask)
            logits = step(**feed)["logits"]
            token = greedy_token(self.generation, logits, length=prompt + i, prompt_length=prompt,
                                 max_length=prompt + max_new_tokens, eos=eos, pad=pad, unfinished=unfinished,
                                 teacher=None if teacher_tokens is None else teacher_tokens[:, i],
                                 sequence=sequence, encoder_ids=input_ids)
            new_tokens.append(token)
            step_logits.append(logits)
            sequence = torch.cat([sequence, token[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype)], dim=1)
            extras = {k: apply_tensor_rule(self.extras[k], v, token) for k, v in extras.items()}
            if not unfinished.any():
                break
        return sequence, step_logits

    def _call(self, step, feed: Mapping[str, torch.Tensor], cache: dict[str, torch.Tensor]):
        """One step call; the cache the next call takes (the step's presents in the "inputs" form)."""
        outputs = step(**feed, **cache)
        if self.state == "inputs":
            cache = {k: outputs["present" + k.removeprefix("past")] for k in self.cache_shapes}
        return outputs, cache

    # ── saving ────────────────────────────────────────────────────────────────
    def save(self, directory: str | os.PathLike, runner: bool = False) -> str:
        """Every component and ``generator.json``. ``runner=True`` saves the folder a runtime's own LLM
        runner loads instead: on ExecuTorch ``model.pte`` (the step, its cache inside, the runner's
        metadata methods) and ``tokenizer.json`` (exporters/generation/runners.py), with
        ``generator.json`` beside them so that ``load_generator`` reads the folder too. A generator the
        runner would misread raises a GenerationError naming what it lacks, and nothing is written."""
        component_dirs = {name: name for name in self.components}
        if runner:
            self._check_runner()
            component_dirs = {"step": "."}
        os.makedirs(directory, exist_ok=True)
        for name, artifact in self.components.items():
            artifact.save(os.path.join(directory, component_dirs[name]))
        if runner:
            from exporters.generation.runners import word_tokenizer

            word_tokenizer(int(self.metadata["vocab_size"])).save(os.path.join(directory, "tokenizer.json"))
        doc = {"format": FORMAT, "backend": self.backend, "components": list(self.components),
               "component_dirs": component_dirs, "cache": "static",
               "batch": self.batch, "max_cache_len": self.max_cache_len, "state": self.state,
               "cache_shapes": self.cache_shapes, "takes_positions": self.takes_positions,
               "takes_mask": self.takes_mask, "token_input": self.token_input, "token_by_token": self.token_by_token,
               "extras": self.extras, "same_inputs": self.same_inputs, "embed_inputs": self.embed_inputs,
               "prompt_inputs": self.prompt_inputs,
               "encoder": self.encoder,
               "whole_sequence": self.whole_sequence, "prompt_rule": self.prompt_rule, "extra_slots": self.extra_slots,
               "generation": self.generation,
               **self.metadata}
        path = os.path.join(directory, GENERATOR_FILE)
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
        return path

    def _check_runner(self) -> None:
        """What ExecuTorch's LLM runner needs of the step (exporters/generation/runners.py)."""
        if self.backend != "executorch":
            raise GenerationError(f"save(runner=True) for a {self.backend} static generator: the runner folder is "
                                  "built for ExecuTorch's LLM runner (export with ExecutorchExporter)")
        step = self.components["step"]
        lacking = []
        if "prompt" in self.components:
            lacking.append("one program (a prompt component writes the cache the step reads, so both take it as inputs: "
                           f"{self.metadata.get('prompt_component')})")
        if self.prompt_rule is not None:
            lacking.append(f"a prompt fed whole (the model's generate feeds its first call only the prompt's last "
                           f"{last_tokens_count(self.prompt_rule)} tokens, {self.prompt_rule}, which this loop applies; "
                           "the runner prefills every prompt token)")
        if self.extra_slots:
            lacking.append(f"a cache of a slot a token (the prompt's call writes {self.extra_slots} slots beyond its "
                           "tokens, after which this loop writes the decode tokens; the runner's cache positions count "
                           "tokens)")
        if self.batch != 1:
            lacking.append(f"a batch of 1 (this step was exported for batch {self.batch}; the runner feeds one sequence)")
        if self.takes_mask:
            lacking.append("no attention_mask input (the runner passes tokens and cache positions only: export "
                           "from an unpadded prompt of batch 1)")
        want = ["input_ids"] if self.whole_sequence else ["input_ids", "cache_position"]
        if list(step.input_names) != want:
            lacking.append(f"the inputs ({'tokens' if self.whole_sequence else 'tokens, cache positions'}), not "
                           f"{list(step.input_names)}")
        methods = (step.metadata.get("config_values") or {}).get("constant_methods") or {}
        uses_cache = not self.whole_sequence  # what use_kv_cache must say (its absence is reported below)
        if methods.get("use_kv_cache", uses_cache) != uses_cache:
            form = "over a cache" if uses_cache else "over the whole sequence"
            lacking.append(f"use_kv_cache {uses_cache} (a step {form})")
        missing = [m for m in ("get_max_seq_len", "use_kv_cache", "get_vocab_size") if m not in methods]
        if missing:
            lacking.append(f"the runner's metadata methods {missing}")
        if "vocab_size" not in self.metadata:
            lacking.append("the model's vocabulary size (for the tokenizer)")
        from exporters.generation.runners import check_runner_generation

        check_runner_generation(self.generation, "ExecuTorch's LLM runner",
                                int(self.metadata["vocab_size"]) if "vocab_size" in self.metadata else None)
        if lacking:
            raise GenerationError("ExecuTorch's LLM runner would misread this program; it needs " + "; ".join(lacking))
