"""Fixtures of the sweep items."""

import contextlib

import pytest


@pytest.fixture(scope="session")
def trace_store(request):
    """One torch.export trace per class and shape config, shared by its items on the three backends where
    their patches agree (exporters/trace_reuse.py); the items of a class run together in one process.
    ``--no-shared-traces`` traces every item itself."""
    if request.config.option.no_shared_traces:
        return None
    from exporters.trace_reuse import TraceStore
    from exporters.utils import DEFAULT_REGISTRY

    return TraceStore(DEFAULT_REGISTRY)  # active around each sweep item only (_in_store)


@contextlib.contextmanager
def _in_store(store):
    """The session's trace store active for one item (exporters.trace_reuse.activated), or nothing."""
    if store is None:
        yield
        return
    from exporters.trace_reuse import activated

    with activated(store):
        yield


@pytest.fixture
def export_patches(sweep_case, trace_store):
    """Guard the patch registry around one item: the exporter installs the registered patches of
    the item's backend and must restore them, pass or fail. A target left patched fails this item,
    naming the target, and is put back so the next item starts clean."""
    with _in_store(trace_store):
        yield from _guarded(sweep_case)


@pytest.fixture
def generate_patches(generate_case, trace_store):
    """The same guard around a generate item (two exports: prefill and decode). Its components' traces are
    shared with the class's generate items on the other backends like a forward's (trace_reuse)."""
    with _in_store(trace_store):
        yield from _guarded(generate_case)


@pytest.fixture
def runner_patches(runner_case):
    """The same guard around a runner item (one export for the runner's folder)."""
    yield from _guarded(runner_case)


@pytest.fixture
def quantized_patches(quantized_case):
    """The same guard around a quantized item (stage 0's trace and the backend's export)."""
    yield from _guarded(quantized_case)


def _guarded(case):
    import exporters
    from exporters.utils import NOTSET, find_leaked_patches, patch_targets_snapshot, resolve_path

    exporters.get_exporter(case.backend)  # its module registers its patches: snapshot them too
    backends = ("dynamo", case.backend) if case.backend != "dynamo" else ("dynamo",)
    snapshot = patch_targets_snapshot(*backends)
    yield snapshot
    leaked = find_leaked_patches(snapshot)
    for path in leaked:
        owner, name = resolve_path(path)
        if snapshot[path] is NOTSET:  # inherited before: remove the leaked override
            delattr(owner, name)
        else:
            setattr(owner, name, snapshot[path])
    if leaked:
        pytest.fail(f"patches not restored after {case.id}: {', '.join(leaked)}")


@pytest.fixture
def keep_artifacts(request):
    return request.config.option.keep_artifacts
