"""A greedy generation loop that runs only exported components: prefill, then decode steps whose
inputs follow the rules read off the model's own ``generate`` (exporters/generation/steps.py)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from exporters.generation.capture import GenerationError
from exporters.generation.component import flat_inputs
from exporters.generation.empty_past import zeros_for
from exporters.generation.processors import end_and_pad, greedy_token
from exporters.generation.steps import (
    ATTRIBUTES,
    LAST_TOKENS,
    PREVIOUS_OUTPUT,
    TRIMMED,
    apply_tensor_rule,
    carried_tree,
    derive_prefill_input,
    prefill_sources,
    tree_output_names,
)

GENERATOR_FILE = "generator.json"
FORMAT = "exporters.generator/1"


@dataclasses.dataclass
class GenerateOutput:
    sequences: torch.Tensor  # prompt + new tokens, as model.generate returns them
    logits: tuple[torch.Tensor, ...] = ()  # per step, [batch, vocab]: the logits each token was chosen from
    cache: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # the state after the last step
    steps: int = 0


class Generator:
    """``components``: ``{"prefill": artifact, "decode": artifact}`` after the encoders, for an
    encoder-decoder ``"encoder"``, for a multimodal model ``"image_encoder"`` / ``"video_encoder"``;
    ``rules``: decode input -> rule; ``prefill_inputs``: what the caller passes (the
    encoder's inputs and the prefill's); ``trees``: decode tree inputs and how many leaves each has;
    ``generation``: the generation config used at export; ``prefill_rules``: prefill inputs derived from
    the caller's (position_ids, decoder_input_ids); ``prefill_trees``: prefill trees filled by a
    component (encoder_outputs -> "encoder"); ``token_input``: input_ids or decoder_input_ids;
    ``encoder_outputs``: each encoder's output names in the order the prefill's tree takes them."""

    def __init__(self, components: Mapping[str, Any], rules: Mapping[str, str], prefill_inputs: list[str],
                 trees: Mapping[str, int], generation: Mapping[str, Any], metadata: Mapping[str, Any] | None = None,
                 prefill_rules: Mapping[str, str] | None = None, prefill_trees: Mapping[str, str] | None = None,
                 token_input: str = "input_ids", encoder_outputs: Mapping[str, list[str]] | None = None,
                 empty_past: Mapping[str, Mapping[str, Any]] | None = None):
        self.components = dict(components)
        self.rules = dict(rules)
        self.prefill_inputs = list(prefill_inputs)
        self.trees = dict(trees)
        self.generation = dict(generation)
        self.metadata = dict(metadata or {})
        self.prefill_rules = dict(prefill_rules or {})
        self.prefill_trees = dict(prefill_trees or {})
        self.token_input = token_input
        # each encoder's outputs in the order the prefill's tree takes them (its flattening order)
        self.encoder_outputs = {k: list(v) for k, v in (encoder_outputs or {}).items()}
        # no prefill component: the decode graph runs the prompt from these cache leaves, empty along their past
        # axis (exporters/generation/empty_past.py)
        self.empty_past = {k: dict(v) for k, v in (empty_past or {}).items()}
        # (exporter, model, inputs, config) this generator was exported from, kept in memory only (never
        # saved): save(runner=True) exports onnxruntime-genai's one-graph form from it
        self.source: tuple | None = None

    @property
    def backend(self) -> str:
        return self.components["decode"].backend

    # ── the loop ──────────────────────────────────────────────────────────────
    def generate(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int | None = None, eos_token_id: int | list[int] | None = None,
                 pad_token_id: int | None = None, teacher_tokens: torch.Tensor | None = None,
                 return_dict_in_generate: bool = False, output_logits: bool = False,
                 **other: torch.Tensor) -> torch.Tensor | GenerateOutput:
        """Greedy generation through the exported components only. ``teacher_tokens`` ([batch, n]) feeds
        those tokens instead of the argmax (teacher forcing: per-step logits stay comparable after a
        near-tie). Stops at ``max_new_tokens`` or when every sequence has emitted an end token."""
        max_new_tokens = max_new_tokens if max_new_tokens is not None else self.generation.get("max_new_tokens") or 20
        if max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        eos, pad = end_and_pad(self.generation, eos_token_id, pad_token_id)
        given = self._checked_inputs({"input_ids": input_ids, "attention_mask": attention_mask, **other})
        if "prefill" not in self.components and not self.empty_past:
            raise GenerationError(f"components {list(self.components)}: no prefill, and no empty cache to run the "
                                  "decode graph from (empty_past)")
        prefill = self.components.get("prefill") or self.components["decode"]
        trees: dict[str, list[torch.Tensor]] = {}
        encoded: list[torch.Tensor] = []
        for label, encoder in self.components.items():  # the encoders, in the order generate ran them
            if label.endswith("encoder"):
                out = encoder(**{k: given[k] for k in encoder.input_names})
                encoded += [out[n] for n in self.encoder_outputs.get(label) or encoder.output_names]
        for name, rule in self.prefill_trees.items():  # rule "encoder": the encoders' outputs, in order
            if rule == "encoder":
                trees[name] = encoded
        # a baked input (exporters/specialize.py) too: the artifact checks its value, and a decode step may take it again
        tensors = {k: v for k, v in given.items() if k in self.prefill_inputs and (k in prefill.input_specs
                                                                                  or isinstance(prefill.constants.get(k), torch.Tensor))}
        derived: dict[str, torch.Tensor] = {}
        for name, rule in self.prefill_rules.items():  # in order: filled_like reads an input derived before it
            derived[name] = derive_prefill_input(rule, given, self.generation, derived)
        tensors.update(derived)
        # no prefill component: the decode graph from an empty cache, at the caller's batch
        empty = {} if "prefill" in self.components else zeros_for(self.empty_past, tensors[self.token_input].shape[0])
        outputs = prefill(**flat_inputs(tensors, trees), **empty)
        # the sequences start with the caller's ids, not the prefill's where it appends a column (XLM's mask token)
        # or takes their last tokens (MusicgenForCausalLM's)
        extended = self.token_input in prefill_sources(self.prefill_rules)
        prompt = _prompt({} if extended else tensors, given, self.token_input, outputs["logits"].shape[0])
        unfinished = torch.ones(prompt.shape[0], dtype=torch.bool)
        new_tokens, step_logits = [], []
        decode = self.components["decode"]
        names = prefill.output_names
        for step in range(max_new_tokens):
            logits = outputs["logits"][:, -1, :] if outputs["logits"].dim() == 3 else outputs["logits"]
            sequence = torch.cat([prompt, *(t[:, None] for t in new_tokens)], dim=1)
            token = greedy_token(self.generation, logits, length=prompt.shape[1] + step, prompt_length=prompt.shape[1],
                                 max_length=prompt.shape[1] + max_new_tokens, eos=eos, pad=pad, unfinished=unfinished,
                                 teacher=None if teacher_tokens is None else teacher_tokens[:, step], sequence=sequence,
                                 encoder_ids=given.get("input_ids"))  # generate's inputs_tensor: the prompt, when decoder-only
            new_tokens.append(token)
            step_logits.append(logits)
            if step == max_new_tokens - 1 or not unfinished.any():
                break
            tensors, trees = self._next_inputs(tensors, trees, outputs, names, token)
            outputs = decode(**flat_inputs(tensors, trees))
            names = decode.output_names
        sequences = torch.cat([prompt, torch.stack(new_tokens, dim=1)], dim=1)
        if not return_dict_in_generate:
            return sequences
        cache = {n: outputs[n] for tree in self.trees if carried_tree(self.rules.get(tree, ""))
                 for n in tree_output_names(names, tree)}
        return GenerateOutput(sequences, tuple(step_logits) if output_logits else (), cache, len(new_tokens))

    def _checked_inputs(self, given: dict[str, Any]) -> dict[str, torch.Tensor]:
        given = {k: v for k, v in given.items() if v is not None}
        if "attention_mask" not in self.prefill_inputs and "attention_mask" in given:
            if not bool((given["attention_mask"] == 1).all()):
                raise GenerationError("this generator's components take no attention_mask (the model's generate passed "
                                      "none at export), so they cannot run a padded batch")
            del given["attention_mask"]  # all ones: what generate itself does with it
        if "attention_mask" in self.prefill_inputs and "attention_mask" not in given and "input_ids" in given:
            given["attention_mask"] = torch.ones_like(given["input_ids"])
        optional = {"decoder_input_ids"} if "decoder_start" in self.prefill_rules.values() else set()
        unknown = [k for k in given if k not in self.prefill_inputs and k not in optional]
        missing = [k for k in self.prefill_inputs if k not in given]
        if unknown or missing:
            raise GenerationError(f"the prefill takes {self.prefill_inputs}"
                                  + (f"; missing {missing}" if missing else "") + (f"; unexpected {unknown}" if unknown else ""))
        return given

    def _next_inputs(self, tensors, trees, outputs, output_names, token):
        nxt, nxt_trees = {}, {}
        for name, rule in self.rules.items():
            if name in self.trees:
                if rule in ("outputs", "updated", ATTRIBUTES):  # "updated": a tree the component returns after the call
                    nxt_trees[name] = [outputs[n] for n in tree_output_names(output_names, name)]
                elif rule.startswith(TRIMMED):  # less its last n positions along dim 0 (XLNet's mems)
                    cut = int(rule[len(TRIMMED):])
                    nxt_trees[name] = [outputs[n][:-cut] for n in tree_output_names(output_names, name)]
                else:  # "same": what the previous call had (encoder outputs; an empty cache: no leaves)
                    nxt_trees[name] = trees.get(name, []) if not self.trees[name] else trees[name]
                if len(nxt_trees[name]) != self.trees[name]:
                    raise GenerationError(f"{name}: the previous component returned {len(nxt_trees[name])} leaves, "
                                          f"the decode step takes {self.trees[name]}")
            elif rule.startswith(PREVIOUS_OUTPUT):  # one of the previous component's outputs
                nxt[name] = outputs[rule[len(PREVIOUS_OUTPUT):]]
            elif rule != "as_prefill":
                nxt[name] = apply_tensor_rule(rule, tensors.get(name), token)
        for name, rule in self.rules.items():  # made from this step's own ids, as the prefill's were from its own
            if rule == "as_prefill":
                nxt[name] = derive_prefill_input(self.prefill_rules[name], {self.token_input: nxt[self.token_input]})
        return nxt, nxt_trees

    def _save_runner(self, directory) -> str:
        from exporters.generation.genai import CONFIG_FILE, export_genai_folder

        cut = [rule for rule in self.prefill_rules.values() if rule.startswith(LAST_TOKENS)]
        if cut:  # onnxruntime-genai prefills every prompt token, through the model's forward
            raise GenerationError(f"save(runner=True): the model's generate feeds its first call only the prompt's last "
                                  f"tokens ({cut[0]}), which this generator applies and onnxruntime-genai, prefilling "
                                  "every prompt token, would not")
        if self.backend != "onnx":
            raise GenerationError(f"save(runner=True) for a {self.backend} generator with a growing cache: the runner "
                                  "folder is onnxruntime-genai's (ONNX); ExecuTorch's LLM runner takes "
                                  "cache='static' (export_for_generation(..., cache='static'))")
        if self.source is None:
            raise GenerationError("this generator was loaded from a folder: it has no model to export the "
                                  "onnxruntime-genai graph from (save(runner=True) right after export_for_generation)")
        exporter, model, inputs, config = self.source
        export_genai_folder(directory, exporter, model, inputs, config, self.generation)
        return os.path.join(directory, CONFIG_FILE)

    # ── saving ────────────────────────────────────────────────────────────────
    def save(self, directory: str | os.PathLike, runner: bool = False) -> str:
        """Every component and ``generator.json``. ``runner=True`` saves instead the folder
        onnxruntime-genai loads (exporters/generation/genai.py: one decoder graph from past length 0,
        ``genai_config.json``, a tokenizer), exported from the model this generator was exported from;
        a model its config cannot describe raises a GenerationError naming what is missing."""
        if runner:
            return self._save_runner(directory)
        os.makedirs(directory, exist_ok=True)
        for name, artifact in self.components.items():
            artifact.save(os.path.join(directory, name))
        doc = {"format": FORMAT, "backend": self.backend, "components": list(self.components),
               "rules": self.rules, "prefill_inputs": self.prefill_inputs, "prefill_rules": self.prefill_rules,
               "prefill_trees": self.prefill_trees, "token_input": self.token_input, "trees": self.trees,
               "encoder_outputs": self.encoder_outputs, **({"empty_past": self.empty_past} if self.empty_past else {}),
               "generation": self.generation, **self.metadata}
        path = os.path.join(directory, GENERATOR_FILE)
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
        return path


def _prompt(tensors: dict[str, torch.Tensor], given: dict[str, torch.Tensor], token_input: str, batch: int) -> torch.Tensor:
    """The ids the returned sequences start with: the prefill's token input, or where the prefill takes the prompt as
    ``inputs_embeds``, the ids the caller gave beside them (none: an empty prompt, as generate returns only the new
    tokens then)."""
    if token_input in tensors:
        return tensors[token_input]
    if token_input in given:
        return given[token_input]
    return torch.zeros(batch, 0, dtype=torch.long)
