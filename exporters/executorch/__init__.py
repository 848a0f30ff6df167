"""The ExecuTorch backend: its artifact and runtime (artifact.py), the lowering loop and its retries
(lowering.py), and the data-dependent sizes the retries bound (unbacked.py, unbacked_bounds.py, constant_scalars.py)."""
