"""The token ``generate`` chose at each captured step, which the decode rules are checked against
(exporters/generation/steps.py): read off the sequences ``generate`` returns where they are the prompt followed by
one token per call, else off the captured calls themselves.

A ``generate`` of its own may return its sequences in another layout than its forward takes: Musicgen's decoder
takes ``batch * num_codebooks`` rows of ids, and its ``generate`` returns ``(batch, num_codebooks, length)`` after
applying its delay pattern and dropping every pad id (the decoder start among them). There each step's token is
read where the forward took it: the ids of the next call, one token per row in the forward's layout. That reading
holds only if the token fed is the one the greedy loop chooses, so each is checked against the argmax of the call
before's last logits, through the processors the capture switched on (``processors.process``, min_new_tokens as
``capture_generate`` sets it): a generate that feeds other ids than it chose (a delay pattern that overwrites a
codebook's token with a pad) fails the export here, naming the step, rather than exporting a loop that would
feed its argmax."""

from __future__ import annotations

import torch

from exporters.generation.capture import Call, GenerationError
from exporters.generation.processors import process

TOKEN_INPUTS = ("input_ids", "decoder_input_ids")
# settings the check does not apply: the n-gram bans need the whole sequence, which the calls do not all hold
UNCHECKED = ("no_repeat_ngram_size", "encoder_no_repeat_ngram_size")


def in_sequences(sequences: torch.Tensor, prompt_length: int, calls: list[Call]) -> bool:
    """Whether ``sequences`` are rows of the prompt followed by (at least) one token per call after the first."""
    return sequences.dim() == 2 and sequences.shape[-1] >= prompt_length + len(calls) - 1


def step_tokens(calls: list[Call], sequences: torch.Tensor, prompt_length: int, returned: list,
                generation: dict | None = None) -> list[torch.Tensor]:
    """``[token chosen after calls[0], after calls[1], ...]``, one per call but the last, each ``[rows]`` in the
    layout the forward takes; ``returned``: what each call left (``steps.record_returns``: its logits), or Nones."""
    if in_sequences(sequences, prompt_length, calls):
        return [sequences[:, prompt_length + i] for i in range(len(calls) - 1)]
    token_input = next((k for k in TOKEN_INPUTS if k in calls[1].tensors), None)
    fed = [None if token_input is None else c.tensors.get(token_input) for c in calls[1:]]
    if any(ids is None or ids.dim() != 2 or ids.shape[-1] != 1 for ids in fed):
        raise GenerationError(f"generate returned sequences of shape {list(sequences.shape)} for a prompt of "
                              f"{prompt_length} and {len(calls)} forward calls: they are not the prompt followed by one "
                              "token per call, and the decode calls do not each take one token to read them from")
    tokens = [ids[:, 0] for ids in fed]
    settings = {k: v for k, v in (generation or {}).items() if k not in UNCHECKED}
    settings["min_new_tokens"] = len(calls)  # as capture_generate asks generate for: no end token during the capture
    for i, token in enumerate(tokens):
        logits = None if returned[i] is None else returned[i].outputs.get("logits")
        if logits is None or logits.shape[0] != token.shape[0]:
            raise GenerationError(f"the decode calls' {token_input!r} cannot be checked against the greedy choice: call "
                                  f"{i} returned no logits with their {token.shape[0]} rows")
        last = (logits[:, -1] if logits.dim() == 3 else logits).float()
        choice = process(settings, last, prompt_length + i, prompt_length, prompt_length + len(calls)).argmax(-1)
        if not torch.equal(choice, token):
            rows = (choice != token).nonzero().flatten().tolist()
            raise GenerationError(
                f"generate returned sequences of shape {list(sequences.shape)}, not the prompt followed by one token per "
                f"call, and the {token_input!r} its call {i + 1} takes are not the greedy choice of call {i}'s logits "
                f"(rows {rows[:4]}: fed {token[rows[:4]].tolist()}, argmax {choice[rows[:4]].tolist()}): it feeds other "
                "ids than it chooses (a delay pattern that writes pads over some rows), which the exported loop does not"
            )
    return tokens
