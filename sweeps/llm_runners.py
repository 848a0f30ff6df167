"""One runner item: export a decoder LM the way a runtime's own LLM runner loads it, save the folder
(``save(runner=True)``), run that runner on it, and check against eager ``model.generate``.

- ``executorch-llm``: ``export_for_generation(cache="static")`` from an unpadded prompt of batch 1, then
  ExecuTorch's ``TextLLMRunner`` (temperature 0) over ``model.pte`` + ``tokenizer.json``;
- ``ort-genai``: the one-graph decoder of exporters/generation/genai.py, then ``onnxruntime_genai``'s
  greedy ``Generator`` over ``model.onnx`` + ``genai_config.json`` (the prompt through the folder's
  tokenizer, which must give back the ids).

The check: the runner's new tokens are eager's (``NEW_TOKENS``, greedy, the model's end token stops
both), except from a step where eager's top two logits are closer than the backend's tolerance
(``tie_steps``, as in the generate sweep); and the runner's own count agrees with the tokens it gave
(ExecuTorch: ``num_generated_tokens`` counts the decode loop, one less than the tokens streamed;
onnxruntime-genai: the sequence length is prompt + new tokens, less an end token it stopped at, which it
does not append).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from sweeps.generate import (
    GENERATE_INIT_RANGES,
    MIN_DISTINCT_TOKENS,
    NEW_TOKENS,
    GenerateMismatch,
    _static_length,
    _ties,
    build_for_generate,
)


def _eos(model) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def _prompt_choices() -> list[tuple[int, float]]:
    """The (prompt row, init range) pairs an item tries in turn until eager's greedy tokens hold
    ``MIN_DISTINCT_TOKENS`` distinct ones: the zoo's first row at each init range, then its second row. A
    prompt whose continuation is one end token checks no generation (KimiLinear's first row: eager stops at
    once, while TextLLMRunner does not test the prefill's token against the end ids and goes on)."""
    return [(row, init_range) for row in (0, 1) for init_range in GENERATE_INIT_RANGES]


def run_runner_case(case, record: Callable[[str, Any], None]) -> None:
    """Run one runner item; raise ``sweeps.runner.StageFailure`` naming the stage."""
    from exporters import get_exporter
    from sweeps.runner import StageFailure, passes_through

    stage = "build"
    record("stage", stage)
    start = time.perf_counter()
    assigned: list = []
    try:
        for row, init_range in _prompt_choices():
            stage = "build"
            model, inputs, notes = build_for_generate(case, init_range)
            for k, v in notes.items():  # what the zoo gives generate unlike the forward
                record(k, v)
            if "input_ids" not in inputs:
                raise TypeError(f"{case.entry.class_name}'s zoo inputs hold no input_ids {sorted(inputs)}")
            if row >= inputs["input_ids"].shape[0]:
                continue
            prompt = inputs["input_ids"][row:row + 1]  # the runners feed one unpadded sequence
            if not _eos(model):
                # the tiny config names no end token (every real checkpoint has one), and onnxruntime-genai
                # cannot run without one (it ends at its pad id); give eager and the runner the same one
                from exporters.generation.runners import vocab_size

                model.generation_config.eos_token_id = vocab_size(model) - 1
                assigned.append(model)  # the tiny model is shared with the class's other items: reset after
                record("eos_assigned", model.generation_config.eos_token_id)
            stage = "eager"
            record("stage", stage)
            with torch.no_grad():
                eager = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                       do_sample=False, return_dict_in_generate=True, output_logits=True)
            new = eager.sequences[0, prompt.shape[1]:].tolist()
            chosen = {"prompt_row": row, "init_range": init_range}  # the last tried, where none has enough
            if len(set(new)) >= MIN_DISTINCT_TOKENS:
                break
        for k, v in chosen.items():
            record(k, v)
        record("new_tokens", len(new))
        record("distinct_tokens", len(set(new)))
        stage = "export"
        record("stage", stage)
        exporter = get_exporter(case.backend)
        with tempfile.TemporaryDirectory() as folder:
            if case.variant == "llm":
                from exporters.generation.runners import run_executorch_llm

                # one program, the form the runner loads: the prompt fed to the step as the runner feeds it
                generator = exporter.export_for_generation(model, {"input_ids": prompt}, cache="static",
                                                           max_cache_len=_static_length(prompt.shape[1] + NEW_TOKENS),
                                                           prompt="step")
                generator.save(folder, runner=True)
                fired = generator.components["step"].workarounds_fired
                stage = "run"
                record("stage", stage)
                got, stats = run_executorch_llm(folder, prompt[0].tolist(), NEW_TOKENS)
                consistent = not got or stats.get("num_generated_tokens") == len(got) - 1
            else:
                from exporters.generation import _generation_dict
                from exporters.generation.genai import export_genai_folder, run_ort_genai

                # what Generator.save(runner=True) checks and writes, without exporting prefill and decode first
                artifact = export_genai_folder(folder, exporter, model, {"input_ids": prompt},
                                               exporter.config_class(dynamic=True, max_dim=64), _generation_dict(model))
                fired = artifact.workarounds_fired
                stage = "run"
                record("stage", stage)
                got, stats = run_ort_genai(folder, prompt[0].tolist(), NEW_TOKENS)
                ended = bool(got) and got[-1] in _eos(model)  # not part of onnxruntime-genai's sequence
                consistent = stats["sequence_length"] == prompt.shape[1] + len(got) - ended
            record("workarounds_fired", sorted(fired))
            record("runner_stats", stats)
        stage = "compare"
        record("stage", stage)
        eos = _eos(model)
        stopped = len(got) == NEW_TOKENS or (got and got[-1] in eos)
        if not consistent or not stopped:
            raise GenerateMismatch(f"runner: it reported {stats} for the {len(got)} tokens it gave ({got}); "
                                   f"max_new_tokens {NEW_TOKENS}, end tokens {eos}")
        if got != new:
            first = next((i for i, (a, b) in enumerate(zip(got, new)) if a != b), min(len(got), len(new)))
            ties = _ties(tuple(step[:1] for step in eager.logits), case.backend)
            if first not in ties:
                raise GenerateMismatch(f"tokens: the runner's greedy tokens differ from eager's at step {first} "
                                       f"(runner {got}, eager {new})")
            record("tie_steps", ties)
        stage = "done"
        record("stage", stage)
    except BaseException as exc:
        if passes_through(exc):
            raise
        raise StageFailure(stage, exc) from exc
    finally:
        for model in assigned:
            model.generation_config.eos_token_id = None
        record("duration_s", round(time.perf_counter() - start, 3))
