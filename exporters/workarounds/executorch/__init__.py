"""ExecuTorch workarounds: exir, XNNPACK partitioner and memory-planning patches, the program fix
(complex_as_real.py) and the node fixes (missing_kernels.py, kernel_semantics.py, dynamic_sizes.py)."""
