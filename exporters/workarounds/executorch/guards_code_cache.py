"""ExecuTorch patch: a program's guards are printed once per shape environment state, not once per partition.

Cause. Every ``torch.export.ExportedProgram`` prints its shape environment's guards as Python source
when it is built (``ExportedProgram.__init__`` -> ``_convert_guards_to_code``,
torch/export/exported_program.py), for ``ep.module()`` and serialization. ExecuTorch's delegation
builds several programs per delegate partition (``create_exported_program_from_submodule``, then
one per pass of XNNPACK's ``preprocess``), and all of them share the whole program's shape
environment: a dynamic program with G guards cut into P partitions prints P x G guards, each a sympy
expression. py-spy on ``UnlimitedOcrModel``'s ExecuTorch dynamic lowering put 21.8% of its samples
there (10.8% from the partitions, 9.9% from XNNPACK's preprocess).

What this changes (during the ExecuTorch lowering only). The printed list is kept on the shape
environment with the state it was printed from: the number of guards and of symbol sources. While
neither has grown, the next program gets a copy of that list; otherwise torch's function runs again.
Guards and sources are only ever appended, so an unchanged count means unchanged inputs.

    before: per program: print every guard of the shared shape environment
    after:  per shape-environment state: print them once; later programs copy the list

Remove it when torch prints guards lazily (on ``module()`` or serialization) or ExecuTorch builds its
partition programs without them.
"""

from __future__ import annotations

import functools

from exporters.utils import ActedFlag, register_patch

PATH = "torch.export.exported_program._convert_guards_to_code"


def _state(shape_env) -> tuple[int, int]:
    return len(shape_env.guards), sum(len(sources) for sources in shape_env.var_to_sources.values())


@register_patch("executorch", PATH)
def _patch_guards_code_printed_once(original):
    """Each partition's program re-printed every guard of the shared shape environment: the list
    is kept per environment state and copied.

    before: _convert_guards_to_code(gm)   (G guards printed, per program)
    after:  the list printed for this shape environment at this guard count, copied
    """
    from torch.export.exported_program import _get_shape_env

    acted = ActedFlag()  # set when a call reused a printed list

    @functools.wraps(original)
    def convert_guards_to_code(graph_module):
        shape_env = _get_shape_env(graph_module)
        if shape_env is None:
            return original(graph_module)
        state = _state(shape_env)
        kept = shape_env.__dict__.get("_guards_code_printed")
        if kept is not None and kept[0] == state:
            acted.set()
            return list(kept[1])
        code = original(graph_module)
        shape_env.__dict__["_guards_code_printed"] = (state, list(code))
        return code

    convert_guards_to_code.acted = acted
    return convert_guards_to_code
