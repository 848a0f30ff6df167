"""Patches of transformers model code, one file per model family (or per piece of code several families
share); each module docstring names the model-side change that would remove it."""
