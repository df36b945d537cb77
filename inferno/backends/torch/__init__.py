"""The torch backends: `torch` (every op in torch, on cuda, mps or cpu) and `gpu` (torch plus the
Triton decode kernel, triton_decode.py)."""
