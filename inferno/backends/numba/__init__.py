"""The Numba backends: `simd` (one core) and `pool` (its kernels on every core), with their
kernels grouped by concern: dense and attention (kernels.py), the KV cache (kv_kernels.py),
quantized linears and int8 (qkernels.py, qdot.py), vector lanes (lanes.py, ilanes.py), and the
runtime they sit on (blas.py, jitcache.py, contention.py)."""
