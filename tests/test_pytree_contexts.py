"""Pytree contexts in saved programs are JSON, and loading one never runs code.

A ``.pt2`` (and a ``.pte``) stores the output spec as JSON, with the context of every registered node
(our Cache and tensor-holder registrations) inside it. These tests check the round trip, a saved
program loaded in a fresh process, and that tampered contexts (an unknown class name, a pickle, as
files from before this change held) raise ``ContextError`` and execute nothing.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import zipfile

import pytest
import torch
from torch.utils import _pytree as pytree

from exporters.pytrees import CONTEXT_FORMAT, ContextError, context_from_json, context_to_json, register_pytree_nodes

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cache(layers: int = 2):
    from transformers import DynamicCache

    cache = DynamicCache()
    for i in range(layers):
        cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), i)
    return cache


def test_round_trip_keeps_the_spec():
    register_pytree_nodes()
    leaves, spec = pytree.tree_flatten({"past_key_values": _cache(), "n": 3})
    text = pytree.treespec_dumps(spec)
    assert CONTEXT_FORMAT in text and "pickle" not in text
    back = pytree.treespec_loads(text)
    assert back == spec
    rebuilt = pytree.tree_unflatten(leaves, back)["past_key_values"]
    assert type(rebuilt).__name__ == "DynamicCache"
    assert torch.equal(rebuilt.layers[1].keys, leaves[2])


def test_rebuilt_with_other_leaves_keeps_the_structure():
    """tree_map and ExecuTorch's emitter rebuild outputs with non-tensor leaves; flattening the result
    must give the same spec (a value-driven flatten turned the layers into constants: the .pte out spec
    then failed to serialize, or, when it was pickled, stored the wrong structure)."""
    register_pytree_nodes()
    leaves, spec = pytree.tree_flatten(_cache())
    mapped = pytree.tree_unflatten(list(range(len(leaves))), spec)
    again, spec2 = pytree.tree_flatten(mapped)
    assert again == list(range(len(leaves)))
    assert spec2 == spec
    assert pytree.treespec_loads(pytree.treespec_dumps(spec2)) == spec
    mapped.layers.append(mapped.layers[0])  # a changed structure is flattened afresh, not forced
    assert pytree.tree_flatten(mapped)[1] != spec


def test_constant_values_round_trip():
    from transformers.cache_utils import DynamicLayer

    ctx = ("dict", tuple((k, ("const", _const(v))) for k, v in {
        "a": None, "b": True, "c": 7, "d": 0.5, "e": float("inf"), "f": "x", "g": torch.bfloat16,
        "h": torch.device("cpu"), "i": DynamicLayer, "j": (1, [2, 3]), "k": {0: False, 1: True},
    }.items()))
    cls = type(_cache())
    back_cls, back = context_from_json(context_to_json((cls, ctx)))
    assert back_cls is cls
    assert back == ctx
    values = {k: c[1].value for k, c in back[1]}
    assert values["i"] is DynamicLayer and values["g"] is torch.bfloat16 and values["k"] == {0: False, 1: True}
    assert isinstance(values["j"], tuple) and isinstance(values["j"][1], list)


def test_a_configuration_attribute_round_trips_as_its_json():
    """xLSTMCache keeps its model's config: stored as the config's JSON and rebuilt by its class."""
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    ctx = ("dict", (("config", ("const", _const(config))),))
    text = context_to_json((type(_cache()), ctx))
    assert '"LlamaConfig"' not in text and "transformers.models.llama.configuration_llama.LlamaConfig" in text
    back = context_from_json(text)[1][1][0][1][1].value
    assert type(back) is LlamaConfig and back.hidden_size == 16 and back.to_dict() == config.to_dict()


def _const(value):
    from exporters.pytrees import _Const

    return _Const(value)


def test_unstorable_constant_names_the_attribute():
    ctx = ("dict", (("stream", ("const", _const(object()))),))
    with pytest.raises(ContextError, match=r"\.stream: an attribute of type builtins\.object"):
        context_to_json((type(_cache()), ctx))


def _marker_pickle(path: str) -> str:
    class Payload:
        def __reduce__(self):
            return (open, (path, "w"))

    return base64.b64encode(pickle.dumps(Payload())).decode("ascii")


def test_tampered_contexts_raise_and_run_nothing(tmp_path):
    marker = str(tmp_path / "ran")
    good = json.loads(context_to_json((type(_cache()), ("dict", ()))))
    tampered = [
        _marker_pickle(marker),  # what files saved before this change held: never unpickled now
        json.dumps({**good, "class": "builtins.eval"}),
        json.dumps({**good, "class": "os.system"}),
        json.dumps({**good, "tree": {"node": "object", "class": "subprocess.Popen", "fields": []}}),
        json.dumps({**good, "tree": {"node": "const", "value": {"class": "builtins.exec"}}}),
        json.dumps({**good, "tree": {"node": "const", "value": {"dtype": "load"}}}),
        json.dumps({**good, "format": "pickle"}),
        json.dumps({**good, "tree": {"node": "const", "value": {"config": ["subprocess.Popen", {"args": "x"}]}}}),
        json.dumps({**good, "tree": {"node": "const", "value": {"config": ["builtins.eval", {}]}}}),
    ]
    for text in tampered:
        with pytest.raises(ContextError):
            context_from_json(text)
    assert not os.path.exists(marker)


def _tamper_pt2(src: str, dst: str, replace) -> int:
    """Copy a .pt2, applying ``replace`` to every stored context of ours; return how many it changed."""
    count = 0

    def walk(obj):
        nonlocal count
        if isinstance(obj, dict):
            if isinstance(obj.get("context"), str) and CONTEXT_FORMAT in obj["context"]:
                obj["context"] = replace(obj["context"])
                count += 1
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, str) and CONTEXT_FORMAT in obj:
            return json.dumps(walk(json.loads(obj)))
        return obj

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith(".json") and CONTEXT_FORMAT.encode() in data:
                data = json.dumps(walk(json.loads(data))).encode()
            zout.writestr(item, data)
    return count


_LOAD = """
import sys, torch
import transformers.modeling_outputs  # registers the ModelOutput classes with pytree, as any transformers import of them does
from exporters.pytrees import register_pytree_nodes
register_pytree_nodes()
ep = torch.export.load(sys.argv[1])
out = ep.module()(input_ids=torch.tensor([[1, 2, 3]]))
print(type(out.past_key_values).__name__, tuple(out.logits.shape))
"""


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from exporters import DynamoExporter

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg).eval()
    artifact = DynamoExporter().export(model, {"input_ids": torch.tensor([[1, 2, 3]]), "use_cache": True})
    return artifact.save(tmp_path_factory.mktemp("llama"))


def _load_in_fresh_process(path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": _ROOT}
    return subprocess.run([sys.executable, "-c", _LOAD, path], capture_output=True, text=True, env=env, timeout=600)


def test_saved_program_loads_in_a_fresh_process(saved_llama):
    done = _load_in_fresh_process(saved_llama)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["DynamicCache", "(1,", "3,", "32)"]


def test_tampered_program_fails_to_load_and_runs_nothing(saved_llama, tmp_path):
    marker = str(tmp_path / "ran")
    bad = str(tmp_path / "bad.pt2")
    assert _tamper_pt2(saved_llama, bad, lambda _: _marker_pickle(marker)) >= 1
    done = _load_in_fresh_process(bad)
    assert done.returncode != 0
    assert "ContextError" in done.stderr and "not JSON" in done.stderr
    assert not os.path.exists(marker)


def test_a_registered_cache_is_a_torch_export_input():
    """A model taking a DynamicCache exports after our registration: torch.export (non-strict) makes a source of
    every leaf's key, and an attribute key holding a '.' ('0.key', the leaf's path in the cache) is refused
    ("AttrSource member must not contain '.'"); the leaves are named by their path all the same."""
    from transformers import DynamicCache

    from exporters.pytrees import flatten_outputs, register_pytree_nodes

    class Step(torch.nn.Module):
        def forward(self, x, cache):
            layer = cache.layers[0]
            return x + layer.keys.sum() + layer.values.sum()

    cache = DynamicCache()
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), 0)
    register_pytree_nodes(cache)
    ep = torch.export.export(Step(), (torch.randn(2), cache), strict=False)
    assert torch.allclose(ep.module()(torch.ones(2), cache), Step()(torch.ones(2), cache))
    assert {"cache.0.key", "cache.0.value"} <= set(flatten_outputs({"cache": cache}))
