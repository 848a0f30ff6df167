"""Load what ``Artifact.save`` and ``Generator.save`` wrote, in a fresh process, without the model.

    from exporters import load_artifact, load_generator
    artifact = load_artifact("out/")                 # model.pt2 | model.onnx | model.pte + metadata.json
    generator = load_generator("gen/")               # generator.json + one folder per component

Nothing here unpickles or evaluates text from the files: metadata is JSON, a ``.pt2``'s pytree
contexts are JSON resolved against an allow-list (exporters/pytrees.py), ``.onnx`` and ``.pte`` are
read by their runtimes. What a loaded artifact checks on each call: input names, dtypes, the dynamic
dims' bounds and which dims share a size; a dynamo artifact also checks the conditions torch.export
recorded (its program keeps them). The ONNX and ExecuTorch files do not carry those conditions, so
a loaded ONNX or ExecuTorch artifact checks bounds and shared dims only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import torch

from exporters.base import Artifact
from exporters.generation import DelegatedGenerator, Generator
from exporters.generation.delegated import HANDOFF, delegated_from
from exporters.generation.generator import FORMAT, GENERATOR_FILE
from exporters.generation.static_loop import FORMAT as STATIC_FORMAT
from exporters.generation.static_loop import StaticGenerator

METADATA_FILE = "metadata.json"


class LoadError(ValueError):
    """A saved folder that cannot be loaded; the message names the file and what is wrong."""


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        raise LoadError(f"{path} does not exist: is this a folder written by Artifact.save / Generator.save?")
    with open(path) as f:
        return json.load(f)


def _dtype(name: str, where: str) -> torch.dtype:
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise LoadError(f"{where}: unknown dtype {name!r}")
    return value


def _constant(doc: dict[str, Any], where: str) -> Any:
    if "tensor" in doc:
        return torch.tensor(doc["tensor"], dtype=_dtype(doc["dtype"], where))
    if "value" in doc:
        return doc["value"]
    raise LoadError(f"{where}: the constant input was saved as {doc.get('repr', doc)!r}, which cannot be rebuilt "
                    "from JSON; re-export, or keep the artifact in the process that made it")


def _artifact_kwargs(meta: dict[str, Any], config_class, where: str) -> dict[str, Any]:
    specs = {}
    for name in meta["input_names"]:
        spec = meta["inputs"][name]
        dims = {int(d): dict(v) for d, v in meta.get("dynamic_dims", {}).get(name, {}).items()}
        specs[name] = (tuple(spec["shape"]), _dtype(spec["dtype"], where), dims)
    fields = {f.name for f in dataclasses.fields(config_class)}
    config = config_class(**{k: v for k, v in meta.get("config_values", {}).items() if k in fields})
    constants = {k: _constant(v, f"{where}: constant {k!r}") for k, v in meta.get("constants", {}).items()}
    extra = {k: meta[k] for k in ("component", "optimize", "planned_bytes", "max_dim") if k in meta}
    return dict(input_names=meta["input_names"], output_names=meta["output_names"], input_specs=specs,
                constants=constants, fired=meta.get("workarounds_fired", []), config=config, extra_metadata=extra)


def load_artifact(directory: str | os.PathLike) -> Artifact:
    """The artifact saved in ``directory``, runnable with the backend's runtime only."""
    directory = os.fspath(directory)
    where = os.path.join(directory, METADATA_FILE)
    meta = _read_json(where)
    backend = meta.get("backend")
    if backend == "dynamo":
        return _load_dynamo(directory, meta, where)
    if backend == "onnx":
        return _load_onnx(directory, meta, where)
    if backend == "executorch":
        return _load_executorch(directory, meta, where)
    raise LoadError(f"{where}: unknown backend {backend!r} (one of dynamo, onnx, executorch)")


def _load_dynamo(directory, meta, where):
    import transformers.modeling_outputs  # noqa: F401 - registers the ModelOutput classes an output spec names

    from exporters.exporter_dynamo import DynamoArtifact, DynamoConfig
    from exporters.pytrees import register_pytree_nodes
    from exporters.tracing import module_with_guards

    register_pytree_nodes()
    program = torch.export.load(os.path.join(directory, DynamoArtifact.file_name))
    module = module_with_guards(program)
    return DynamoArtifact(program, module, guards=getattr(module, "_guards_fn", None),
                          **_artifact_kwargs(meta, DynamoConfig, where))


@dataclasses.dataclass
class _SavedOnnx:
    model_proto: Any


def _load_onnx(directory, meta, where):
    import onnx

    from exporters.exporter_onnx import OnnxArtifact, OnnxConfig

    proto = onnx.load(os.path.join(directory, OnnxArtifact.file_name))
    return OnnxArtifact(_SavedOnnx(proto), **_artifact_kwargs(meta, OnnxConfig, where))


def _load_executorch(directory, meta, where):
    from exporters.exporter_executorch import ExecutorchArtifact, ExecutorchConfig

    with open(os.path.join(directory, ExecutorchArtifact.file_name), "rb") as f:
        buffer = f.read()
    return ExecutorchArtifact(buffer, mutated_inputs=tuple(meta.get("mutated_inputs", ())),
                              **_artifact_kwargs(meta, ExecutorchConfig, where))


def load_generator(directory: str | os.PathLike) -> Generator | StaticGenerator | DelegatedGenerator:
    """The generator saved in ``directory`` (``Generator.save``, ``StaticGenerator.save`` or
    ``DelegatedGenerator.save``): its components and step rules."""
    directory = os.fspath(directory)
    where = os.path.join(directory, GENERATOR_FILE)
    doc = _read_json(where)
    if doc.get("format") not in (FORMAT, STATIC_FORMAT):
        raise LoadError(f"{where}: format {doc.get('format')!r}, this version of exporters reads {FORMAT!r} "
                        f"and {STATIC_FORMAT!r}")
    dirs = doc.get("component_dirs") or {}
    for name, where_to in dirs.items():
        if os.path.isabs(where_to) or ".." in where_to.replace("\\", "/").split("/"):
            raise LoadError(f"{where}: component {name!r} lies outside the folder ({where_to!r})")
    delegated = doc.pop("delegated", None)  # a model whose generate hands a sub-model's generate its inputs
    inner = _load_generator(directory, where, doc, dirs)
    if delegated is None:
        return inner
    try:
        return delegated_from(delegated, load_artifact(os.path.join(directory, HANDOFF)), inner)
    except ValueError as exc:
        raise LoadError(f"{where}: {exc}") from None


def _load_generator(directory: str, where: str, doc: dict, dirs: dict) -> Generator | StaticGenerator:
    components = {name: load_artifact(os.path.join(directory, dirs.get(name, name))) for name in doc["components"]}
    if doc["format"] == STATIC_FORMAT:
        known = ("format", "backend", "components", "component_dirs", "cache", "batch", "max_cache_len", "state", "cache_shapes",
                 "takes_positions", "takes_mask", "token_input", "token_by_token", "generation", "extras", "embed_inputs", "encoder",
                 "whole_sequence", "prompt_inputs", "prompt_rule", "same_inputs", "extra_slots")
        return StaticGenerator(components, batch=doc["batch"], max_cache_len=doc["max_cache_len"], state=doc["state"],
                               cache_shapes=doc["cache_shapes"], takes_positions=doc["takes_positions"],
                               takes_mask=doc["takes_mask"], generation=doc["generation"],
                               metadata={k: v for k, v in doc.items() if k not in known},
                               token_input=doc.get("token_input", "input_ids"),
                               token_by_token=bool(doc.get("token_by_token", False)), extras=doc.get("extras") or {},
                               embed_inputs=doc.get("embed_inputs"), encoder=doc.get("encoder"),
                               whole_sequence=bool(doc.get("whole_sequence", False)),
                               prompt_inputs=doc.get("prompt_inputs"), prompt_rule=doc.get("prompt_rule"),
                               same_inputs=doc.get("same_inputs"), extra_slots=int(doc.get("extra_slots") or 0))
    known = ("format", "backend", "components", "rules", "prefill_inputs", "prefill_rules", "prefill_trees",
             "token_input", "trees", "generation", "encoder_outputs", "empty_past")
    return Generator(components, doc["rules"], doc["prefill_inputs"], doc["trees"], doc["generation"],
                     {k: v for k, v in doc.items() if k not in known}, doc.get("prefill_rules", {}),
                     doc.get("prefill_trees", {}), doc.get("token_input", "input_ids"), doc.get("encoder_outputs"),
                     doc.get("empty_past"))
