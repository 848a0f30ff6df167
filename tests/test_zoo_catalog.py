"""Catalog and name resolution of the tiny-model zoo (no model is built here)."""

import dataclasses
import time

import pytest

from sweeps.zoo import CatalogEntry, UnknownModelError, catalog, resolve_models


def test_catalog_is_complete_sorted_and_typed():
    from transformers.models.auto import configuration_auto, modeling_auto

    expected = set()
    for name in dir(modeling_auto):
        if name.endswith("_MAPPING_NAMES") and name != "CONFIG_MAPPING_NAMES":
            for v in getattr(modeling_auto, name).values():
                expected.update(v if isinstance(v, (tuple, list)) else (v,))
    entries = catalog()
    names = [e.class_name for e in entries]
    assert set(names) == expected
    assert names == sorted(names)
    assert len(names) == len(set(names))
    for e in entries:
        assert isinstance(e, CatalogEntry)
        assert e.config_class_name == configuration_auto.CONFIG_MAPPING_NAMES[e.model_type]
        assert e.tasks and all(isinstance(t, str) for t in e.tasks)
        assert e.blocked_by is None or isinstance(e.blocked_by, str)


def test_catalog_is_cheap_and_cached():
    catalog()
    t = time.perf_counter()
    for _ in range(10):
        catalog()
    assert time.perf_counter() - t < 0.1
    # a copy each call: mutating it cannot corrupt the cache
    a = catalog()
    a.clear()
    assert catalog()


def test_catalog_entry_is_frozen():
    e = catalog()[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.class_name = "x"


def test_catalog_knows_tasks_and_blocked():
    by = {e.class_name: e for e in catalog()}
    assert "causal_lm" in by["LlamaForCausalLM"].tasks
    assert by["BertModel"].model_type == "bert"
    assert by["BertModel"].config_class_name == "BertConfig"
    assert by["TimmWrapperModel"].blocked_by and "timm" in by["TimmWrapperModel"].blocked_by
    assert by["LlamaForCausalLM"].blocked_by is None


def test_resolve_by_type_class_case_and_glob():
    r = resolve_models(["nllb_moe"])
    assert r and all(e.model_type == "nllb-moe" for e in r)  # the type is spelled with a dash
    assert [e.class_name for e in resolve_models(["bertmodel"])] == ["BertModel"]
    assert [e.class_name for e in resolve_models(["BERTMODEL"])] == ["BertModel"]
    llamas = resolve_models(["Llama*"])
    assert "LlamaForCausalLM" in {e.class_name for e in llamas}
    assert all(e.class_name.lower().startswith("llama") or e.model_type.startswith("llama") for e in llamas)
    # repeatable, de-duplicated, catalog order
    both = resolve_models(["bert", "BertModel", "llama"])
    names = [e.class_name for e in both]
    assert len(names) == len(set(names))
    assert names == sorted(names)
    assert resolve_models("bert") == resolve_models(["bert"])


def test_unknown_name_lists_close_matches():
    with pytest.raises(UnknownModelError) as ei:
        resolve_models(["lamma"])
    msg = str(ei.value)
    assert "lamma" in msg and "llama" in msg.lower()
    assert isinstance(ei.value, ValueError)
    with pytest.raises(UnknownModelError):
        resolve_models(["BertModle"])
    with pytest.raises(UnknownModelError):
        resolve_models(["nothing_like_this_*"])
    with pytest.raises(UnknownModelError):
        resolve_models([""])


def test_source_parsing_matches_the_imported_mappings():
    from sweeps.zoo._names import import_name_mappings, read_name_mappings

    parsed_maps, parsed_cfg = read_name_mappings()
    imported_maps, imported_cfg = import_name_mappings()
    assert parsed_cfg == imported_cfg
    assert {k: dict(v) for k, v in parsed_maps.items()} == {k: dict(v) for k, v in imported_maps.items()}


def test_catalog_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, time; t = time.perf_counter(); from sweeps.zoo import catalog; n = len(catalog()); "
            "print(n, 'torch' in sys.modules, time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__import__("os").path.dirname(__import__("os").path.dirname(__file__))).stdout.split()
    assert int(out[0]) > 1000
    assert out[1] == "False"
    assert float(out[2]) < 1.0
