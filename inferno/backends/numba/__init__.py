"""The Numba backends: `simd` (one core, simd.py) and `pool` (its kernels on every core,
pool.py), with their kernels grouped by concern:
- dense float32 rows (dense.py) and flash attention (attention.py); the KV cache (kv_kernels.py);
  float32 rows quantized to Q8_0 and Q4_0 as gguf does it (quantizers.py);
- linears: which kernel multiplies a weight by how many rows on this CPU (dispatch.py, one
  table), float weights in one order (fdot.py), the drivers and the quantized kinds' float32
  kernels (qkernels.py), the K-quants' int8 rows and GEMM
  panels (qdot.py, qgemm.py), Q4_K stored as panels (kpanels.py), the legacy kinds' int16 rows
  and GEMM (ldot.py, lgemm.py), Q4_0, Q4_1 and MXFP4 stored as panels (lpanels.py); a step's experts
  (experts.py);
- the weight and cache kinds as the kernels branch on them (codes.py), vector lanes (lanes.py,
  ilanes.py);
- the runtime they sit on: BLAS (blas.py), the kernel cache (jitcache.py), the free cores
  (contention.py), Numba's inliner, SSA and branch pruning made to do less for the same code
  (compiler.py)."""
