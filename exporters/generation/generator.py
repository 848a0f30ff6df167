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
from exporters.generation.steps import apply_tensor_rule, derive_prefill_input, tree_output_names

GENERATOR_FILE = "generator.json"
FORMAT = "exporters.generator/1"


@dataclasses.dataclass
class GenerateOutput:
    sequences: torch.Tensor  # prompt + new tokens, as model.generate returns them
    logits: tuple[torch.Tensor, ...] = ()  # per step, [batch, vocab]: the logits each token was chosen from
    cache: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # the state after the last step
    steps: int = 0


class Generator:
    """``components``: ``{"prefill": artifact, "decode": artifact}``; ``rules``: decode input -> rule;
    ``prefill_inputs``: the prefill's tensor inputs (what the caller passes); ``trees``: decode tree
    inputs and how many leaves each has; ``generation``: the generation config used at export."""

    def __init__(self, components: Mapping[str, Any], rules: Mapping[str, str], prefill_inputs: list[str],
                 trees: Mapping[str, int], generation: Mapping[str, Any], metadata: Mapping[str, Any] | None = None,
                 prefill_rules: Mapping[str, str] | None = None):
        self.components = dict(components)
        self.rules = dict(rules)
        self.prefill_inputs = list(prefill_inputs)
        self.trees = dict(trees)
        self.generation = dict(generation)
        self.metadata = dict(metadata or {})
        self.prefill_rules = dict(prefill_rules or {})  # prefill inputs derived from the caller's (position_ids)

    @property
    def backend(self) -> str:
        return self.components["prefill"].backend

    # ── the loop ──────────────────────────────────────────────────────────────
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
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
        eos = self._token_ids(eos_token_id if eos_token_id is not None else self.generation.get("eos_token_id"))
        pad = pad_token_id if pad_token_id is not None else self.generation.get("pad_token_id")
        if pad is None and eos:
            pad = eos[0]
        given = {"input_ids": input_ids, "attention_mask": attention_mask, **other}
        if "attention_mask" in self.prefill_inputs and attention_mask is None:
            given["attention_mask"] = torch.ones_like(input_ids)
        if "attention_mask" not in self.prefill_inputs and attention_mask is not None:
            if not bool((attention_mask == 1).all()):
                raise GenerationError("this generator's components take no attention_mask (the model's generate passed "
                                      "none at export), so they cannot run a padded batch")
            given["attention_mask"] = None  # all ones: what generate itself does with it
        unknown = [k for k, v in given.items() if v is not None and k not in self.prefill_inputs]
        missing = [k for k in self.prefill_inputs if given.get(k) is None]
        if unknown or missing:
            raise GenerationError(f"the prefill takes {self.prefill_inputs}"
                                  + (f"; missing {missing}" if missing else "") + (f"; unexpected {unknown}" if unknown else ""))
        tensors = {k: given[k] for k in self.prefill_inputs}
        tensors.update({k: derive_prefill_input(rule, tensors) for k, rule in self.prefill_rules.items()})
        outputs = self.components["prefill"](**tensors)
        batch = input_ids.shape[0]
        unfinished = torch.ones(batch, dtype=torch.bool)
        new_tokens, step_logits = [], []
        decode = self.components["decode"]
        for step in range(max_new_tokens):
            logits = outputs["logits"][:, -1, :] if outputs["logits"].dim() == 3 else outputs["logits"]
            token = logits.argmax(-1) if teacher_tokens is None else teacher_tokens[:, step]
            if pad is not None and eos:
                token = torch.where(unfinished, token, torch.full_like(token, pad))
            new_tokens.append(token)
            step_logits.append(logits)
            if eos:
                unfinished &= ~torch.isin(token, torch.tensor(eos))
            if step == max_new_tokens - 1 or not unfinished.any():
                break
            tensors, trees = self._next_inputs(tensors, outputs, decode.output_names if step else
                                               self.components["prefill"].output_names, token)
            outputs = decode(**flat_inputs(tensors, trees))
        sequences = torch.cat([input_ids, torch.stack(new_tokens, dim=1)], dim=1)
        if not return_dict_in_generate:
            return sequences
        last = decode.output_names if len(new_tokens) > 1 else self.components["prefill"].output_names
        cache = {n: outputs[n] for tree in self.trees for n in tree_output_names(last, tree)}
        return GenerateOutput(sequences, tuple(step_logits) if output_logits else (), cache, len(new_tokens))

    def _next_inputs(self, tensors, outputs, output_names, token):
        nxt, trees = {}, {}
        for name, rule in self.rules.items():
            if name in self.trees:
                trees[name] = [outputs[n] for n in tree_output_names(output_names, name)]  # rule "outputs"
                if len(trees[name]) != self.trees[name]:
                    raise GenerationError(f"{name}: the previous component returned {len(trees[name])} leaves, "
                                          f"the decode step takes {self.trees[name]}")
            else:
                nxt[name] = apply_tensor_rule(rule, tensors.get(name), token)
        return nxt, trees

    @staticmethod
    def _token_ids(value) -> list[int]:
        if value is None:
            return []
        return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]

    # ── saving ────────────────────────────────────────────────────────────────
    def save(self, directory: str | os.PathLike) -> str:
        os.makedirs(directory, exist_ok=True)
        for name, artifact in self.components.items():
            artifact.save(os.path.join(directory, name))
        doc = {"format": FORMAT, "backend": self.backend, "components": list(self.components),
               "rules": self.rules, "prefill_inputs": self.prefill_inputs, "prefill_rules": self.prefill_rules,
               "trees": self.trees,
               "generation": self.generation, **self.metadata}
        path = os.path.join(directory, GENERATOR_FILE)
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
        return path
