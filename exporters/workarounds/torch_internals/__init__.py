"""Patches of torch internals (symbolic shapes, sympy, decompositions, torch functions every model traces
through); each module docstring names the torch behaviour it works around."""
