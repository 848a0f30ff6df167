"""Every workaround, in one folder per thing it patches (``exporters.utils.WORKAROUND_PACKAGES``):
models/ (transformers model code), torch_internals/ (torch), onnx/ and executorch/ (one backend's
lowering and runtime). The default registry imports each folder's modules itself; ``_*.py`` are helpers.
docs/extending.md, "Where does my patch go?", says which folder and file a new one goes in."""
