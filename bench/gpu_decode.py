"""GPU decode, end to end and kernel by kernel, on one CUDA GPU, in one call (issue 40).

    python3 bench/gpu_decode.py --json $OUT/gpu_decode.json      # on the GPU: under 6 minutes
    python bench/gpu_decode.py --dry-run --json /tmp/dry.json    # the plumbing, on the CPU

Sections, in order; each is written to the JSON as soon as it is done, and a time budget
(--budget-s) skips what would not fit, the targets' figures first:
1. ceilings: the card's read bandwidth (a reduction over 4 GiB, graph-timed: what a decode step
   that reads its weights once can reach) and one copy's (bytes read + written);
2. checks: each kernel variant against a float64 reference, on the host-planned path and on the
   device path (slots and lengths in device memory, the grid sized for a capacity);
3. e2e: random Qwen3-0.6B- and Qwen3-8B-shaped models through Engine.stream, greedy: `gpu` and
   `torch`, bf16, with the decode step captured in CUDA graphs (graphs=on) and op by op
   (graphs=off), prompts of 512 and 8192 tokens; TTFT, decode tok/s, and the weight and KV
   bytes a token reads over its time against the read ceiling;
4. transformers: the same 0.6B shape through transformers' generate in the same run: eager
   (dynamic cache), and with its static cache, which generate compiles itself (torch.compile,
   "reduce-overhead": CUDA graphs) as transformers documents (cache_implementation="static");
5. server: the 0.6B shape on `gpu` through the server's BatchEngine (the scheduler and its
   captured steps), 1, 8, 32 and 64 streams at once: aggregate generated tok/s;
6. attention: achieved bandwidth (K and V bytes / time) of the kernel's `serial` and `pingpong`
   loops and of torch's SDPA, each replayed in CUDA graphs over enough cache copies to exceed
   4x the L2, at KV 1k-128k, GQA 16:1/16:2/16:8, head dim 64/128, batch 1/8; then the split
   count swept at the shapes where the default grid is weakest;
7. compiled: what each loop variant compiled to (MMA and wait instructions, registers, spills;
   the PTX and SASS to <json>.kernels.txt);
8. prefill: the gpu backend's two prefill paths (materialized scores, SDPA).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled

KV_LENS = [1024, 8192, 32768, 131072]
GQA = [(16, 1), (16, 2), (16, 8)]
HEAD_DIMS = [64, 128]
BATCHES = [1, 8]
STREAMS = [1, 8, 32, 64]
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
# Dry run: the same code paths on shapes the interpreter gets through in seconds.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True)
DRY = dict(kv_lens=[64, 200], gqa=[(16, 1), (16, 8)], head_dims=[64], batches=[1, 2], streams=[1, 3],
           model=TINY, big=dict(TINY, num_hidden_layers=3, tie_word_embeddings=False))


class Bench:
    def __init__(self, args):
        self.args = args
        self.dry = args.dry_run
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.t0 = time.perf_counter()
        self.results: dict = {"command": " ".join(sys.argv), "dry_run": self.dry, "notes": []}
        from inferno.backends.torch import triton_decode
        self.td = triton_decode

    # -- bookkeeping ------------------------------------------------------------------------------
    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def note(self, msg: str) -> None:
        self.results["notes"].append(msg)
        self.log(f"NOTE: {msg}")

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        Path(self.args.json).write_text(json.dumps(self.results, indent=1, default=str))

    def section(self, name, fn, need_s: float = 0.0):
        if self.left() < need_s:
            self.results[name] = {"skipped": f"time budget: {self.left():.0f} s left, {need_s:.0f} wanted"}
            self.log(f"-- {name} skipped: time budget")
            self.save()
            return
        self.log(f"-- {name}")
        try:
            self.results[name] = fn()
        except Exception as e:  # one failed section must not lose the others' numbers
            self.results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            self.log(f"{name} FAILED: {e}")
        if self.cuda:
            torch.cuda.empty_cache()
        self.save()

    def partial(self, key, rows):
        self.results[key] = rows
        self.save()

    # -- timing -----------------------------------------------------------------------------------
    def time_calls(self, fn, n_slots: int, target_s: float = 0.15) -> tuple[float, str]:
        """Median seconds per call of fn(slot) over slots 0..n_slots-1, each timed unit one pass
        over all slots. CUDA: a graph of one pass, replayed between events (no launch gaps); a
        capture that fails is an error, not an eager timing in disguise. CPU: wall clock."""
        if not self.cuda:  # (Triton's interpreter or torch on the CPU: nothing to compile first)
            t = time.perf_counter()
            for i in range(n_slots):
                fn(i)
            return (time.perf_counter() - t) / n_slots, "wall"
        for i in range(min(2, n_slots)):
            fn(i)  # compile and warm up
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(n_slots):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(n_slots):
                fn(i)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        once = max(start.elapsed_time(end) / 1e3, 1e-6)
        times = []
        for _ in range(int(min(50, max(7, target_s / once)))):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / n_slots)
        return statistics.median(times), "graph"

    def slots_for(self, nbytes: int) -> int:
        """Copies of the inputs to rotate over, so one pass exceeds 4x the L2."""
        if not self.cuda:
            return 2
        l2 = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 64 << 20)
        return int(min(1024, max(2, math.ceil(4 * l2 / nbytes))))

    # -- 1. the card ------------------------------------------------------------------------------
    def env(self):
        import triton
        info = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}
        try:
            import transformers
            info["transformers"] = transformers.__version__
        except ImportError:
            info["transformers"] = None
        if self.cuda:
            p = torch.cuda.get_device_properties(self.device)
            info.update(name=p.name, sms=p.multi_processor_count, memory_gb=p.total_memory / 1e9,
                        l2_mb=getattr(p, "L2_cache_size", 0) / 2**20, capability=f"{p.major}.{p.minor}")
        else:
            info["name"] = "cpu (Triton interpreter)"
        return info

    def ceilings(self):
        n = (64 << 20) if self.dry else (4 << 30)  # bytes read
        x = torch.empty(n // 2, dtype=torch.bfloat16, device=self.device).normal_()  # never zeros
        total = torch.empty((), dtype=torch.float32, device=self.device)
        read_s, how = self.time_calls(lambda i: torch.sum(x, dim=0, dtype=torch.float32, out=total), 1, 0.3)
        del x
        m = (32 << 20) if self.dry else (2 << 30)
        src = torch.empty(m // 4, device=self.device).normal_()
        dst = torch.empty_like(src)
        copy_s, _ = self.time_calls(lambda i: dst.copy_(src), 1, 0.3)
        self.read_gbs = n / read_s / 1e9
        return {"read_bytes": n, "read_gb_per_s": self.read_gbs, "copy_bytes": 2 * m,
                "copy_gb_per_s": 2 * m / copy_s / 1e9, "timing": how}

    # -- 2. checks --------------------------------------------------------------------------------
    def checks(self):
        td, rows, dev = self.td, [], self.device
        # (n_heads, n_kv, head_dim, kv_len, new tokens); bf16 everywhere, fp16 and fp32 on two
        shapes = [(16, 1, 128, 1000, 1), (16, 2, 64, 4097, 4), (9, 3, 64, 300, 2), (16, 8, 128, 65, 1)]
        cases = [(torch.bfloat16, s) for s in shapes] + [
            (dt, s) for dt in (torch.float16, torch.float32) for s in shapes[:2]]
        if self.dry:
            cases = [(dt, s) for dt in (torch.float32, torch.float16)
                     for s in [(16, 1, 64, 130, 1), (9, 3, 64, 70, 4)]]
        tol = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
        g = torch.Generator(device=dev).manual_seed(0)
        for variant in td.VARIANTS:
            for dtype, (nh, nkv, hd, kv, new) in cases:
                q = torch.randn(new, nh * hd, device=dev, generator=g).to(dtype)
                k = torch.randn(kv + 5, nkv * hd, device=dev, generator=g).to(dtype)
                v = torch.randn(kv + 5, nkv * hd, device=dev, generator=g).to(dtype)
                k[kv:], v[kv:] = float("nan"), float("nan")
                ref = td.reference_attention(q, k, v, kv, nh, nkv, hd)
                out = torch.full_like(q, float("nan"))
                td.decode_attention(q, k, v, kv, nh, nkv, hd, variant=variant, out=out)
                # the device path: a batch of one whose length is in device memory, the grid
                # sized for the cache's whole capacity
                dev_out = td.decode_attention_device(
                    q[None], k[None], v[None], torch.zeros(1, dtype=torch.int64, device=dev),
                    torch.full((1,), kv, dtype=torch.int64, device=dev), nh, nkv, hd, variant)[0]
                for path, o in (("host", out), ("device", dev_out)):
                    err = (o.double() - ref).abs().max().item()  # NaN stays NaN: fails below
                    rows.append(dict(variant=variant, path=path, dtype=str(dtype).split(".")[-1],
                                     n_heads=nh, n_kv=nkv, head_dim=hd, kv_len=kv, new=new,
                                     max_err=err, ok=bool(err < tol[dtype])))
        bad = [r for r in rows if not r["ok"]]
        self.broken = {r["variant"] for r in bad}
        if bad:
            self.note(f"{len(bad)} kernel checks FAILED: {bad}")
        return rows

    # -- 3. end to end ----------------------------------------------------------------------------
    def checkpoint(self, shape: dict, label: str):
        """A random Qwen3 of `shape`: every layer shares one random set of matrices (a token
        reads every layer's weights all the same; generating 8B random numbers would not fit
        the budget), so a load copies them to the device once per layer."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers.models import WordLevel

        from inferno.model.config import ModelConfig
        from inferno.loading.loader import Checkpoint
        from inferno.tokenizers.tokenizer import Tokenizer
        cfg = ModelConfig(architecture="qwen3", rms_norm_eps=1e-6, rope_theta=1e6,
                          max_position_embeddings=40960, **shape)
        rng = np.random.default_rng(0)
        hd, hidden, inter = cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
        mat = lambda o, i: rng.standard_normal((o, i), dtype=np.float32) * np.float32(0.02)  # noqa: E731
        ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
        layer = {"input_layernorm.weight": ones(hidden), "post_attention_layernorm.weight": ones(hidden),
                 "self_attn.q_proj.weight": mat(cfg.q_width, hidden),
                 "self_attn.k_proj.weight": mat(cfg.kv_width, hidden),
                 "self_attn.v_proj.weight": mat(cfg.kv_width, hidden),
                 "self_attn.o_proj.weight": mat(hidden, cfg.q_width),
                 "self_attn.q_norm.weight": ones(hd), "self_attn.k_norm.weight": ones(hd),
                 "mlp.gate_proj.weight": mat(inter, hidden), "mlp.up_proj.weight": mat(inter, hidden),
                 "mlp.down_proj.weight": mat(hidden, inter)}
        t = {"model.embed_tokens.weight": mat(cfg.vocab_size, hidden), "model.norm.weight": ones(hidden)}
        if not cfg.tie_word_embeddings:
            t["lm_head.weight"] = mat(cfg.vocab_size, hidden)
        for i in range(cfg.num_hidden_layers):
            t.update({f"model.layers.{i}.{name}": w for name, w in layer.items()})
        tok = Tokenizer(HFTokenizer(WordLevel({f"t{i}": i for i in range(cfg.vocab_size)}, unk_token="t0")))
        return lambda: Checkpoint(cfg, dict(t), tok, source=f"random {label} shape")

    def engine(self, make, name: str, opts: dict):
        from inferno.backends import create_backend
        from inferno.engine import Engine
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        if name == "gpu" and not self.cuda:  # dry run: the kernel under the interpreter
            from inferno.backends.torch.gpu import GpuBackend
            ops = GpuBackend(**opts, device="cpu")
        else:
            ops = create_backend(name, **opts)
        return Engine(make(), ops)

    def end_to_end(self):
        cpu_graphs = "eager"  # the CPU cannot capture: the device step runs uncaptured there
        on = "on" if self.cuda else cpu_graphs
        if self.dry:
            small, big = self.checkpoint(TINY, "tiny"), self.checkpoint(DRY["big"], "tiny, untied")
            runs = [(16, 4)]
            configs = [(small, "0.6B", "gpu", {"graphs": on}, runs), (small, "0.6B", "gpu", {"graphs": "off"}, runs),
                       (small, "0.6B", "torch", {"device": "cpu", "graphs": on}, runs),
                       (big, "8B", "gpu", {"graphs": on}, runs)]
        else:
            small, big = self.checkpoint(QWEN3_06B, "Qwen3-0.6B"), None
            long = [(512, 128), (8192, 64)]
            configs = [(small, "0.6B", "gpu", {"dtype": "bf16", "graphs": "on"}, long),
                       (small, "0.6B", "gpu", {"dtype": "bf16", "graphs": "off"}, long),
                       (small, "0.6B", "torch", {"dtype": "bf16", "graphs": "on"}, [(512, 128)]),
                       (small, "0.6B", "torch", {"dtype": "bf16", "graphs": "off"}, [(512, 128)]),
                       (small, "0.6B", "gpu", {"dtype": "bf16", "graphs": "on", "decode": "pingpong"}, [(512, 128)]),
                       (None, "8B", "gpu", {"dtype": "bf16", "graphs": "on"}, [(512, 128), (8192, 64)]),
                       (None, "8B", "gpu", {"dtype": "bf16", "graphs": "off"}, [(512, 32)])]
        rows = []
        ids = np.random.default_rng(1).integers(0, 512 if self.dry else 151936, 8192)
        for make, label, name, opts, runs in configs:
            if self.left() < (60 if label == "8B" else 25):
                self.note(f"e2e {label} {name} {opts} skipped: time budget")
                continue
            if make is None:
                big = big or self.checkpoint(QWEN3_8B, "Qwen3-8B")
                make = big
            t_load = time.perf_counter()
            engine = self.engine(make, name, opts)
            load_s = time.perf_counter() - t_load
            try:
                cfg = engine.config
                kv_per_token = 2 * cfg.num_hidden_layers * cfg.kv_width * (2 if "bf16" in opts.values() else 4)
                for prompt, new in runs:
                    generate(engine, ids[:prompt], 8)  # warm up: allocator, cuBLAS, a grown cache's capture
                    r = generate(engine, ids[:prompt], new)
                    ctx = prompt + new / 2  # the keys an average decode step reads
                    read = engine.weight_bytes_per_token + kv_per_token * ctx
                    row = dict(model=label, backend=name, **{k: v for k, v in opts.items() if k != "device"},
                               prompt=prompt, new_tokens=r.generated_tokens, load_s=load_s,
                               ttft_ms=r.ttft_s * 1e3, prefill_tok_s=r.prefill_tokens_per_s,
                               decode_tok_s=r.decode_tokens_per_s, gb_per_token=read / 1e9,
                               read_gb_s=read * r.decode_tokens_per_s / 1e9,
                               peak_gb=r.peak_memory_bytes / 1e9)
                    if getattr(self, "read_gbs", None):
                        row["of_read_ceiling"] = row["read_gb_s"] / self.read_gbs
                        row["limit_tok_s"] = self.read_gbs * 1e9 / read
                    rows.append(row)
                    self.log(f"e2e {row}")
                    self.partial("e2e", rows)
            finally:
                engine.close()
                del engine
        return rows

    # -- 4. transformers --------------------------------------------------------------------------
    def hf_model(self):
        import transformers
        shape = TINY if self.dry else QWEN3_06B
        config = transformers.Qwen3Config(rope_theta=1e6, max_position_embeddings=40960,
                                          rms_norm_eps=1e-6, **shape)
        with torch.device(self.device):
            model = transformers.Qwen3ForCausalLM(config)
        return model.to(torch.float32 if self.dry else torch.bfloat16).eval()

    def hf_generate(self, model, ids, new: int, **kw) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                 pad_token_id=0, **kw)
        if self.cuda:
            torch.cuda.synchronize()
        assert out.shape[1] == ids.shape[1] + new
        return time.perf_counter() - t

    def hf_rows(self, kind: str, runs, **kw):
        model, rows = self.hf_model(), []
        vocab = model.config.vocab_size
        for prompt, new in runs:
            ids = torch.from_numpy(np.random.default_rng(1).integers(0, vocab, (1, prompt))).to(self.device)
            self.hf_generate(model, ids, 8, **kw)  # warm up (and, with the static cache, compile)
            first = statistics.median(self.hf_generate(model, ids, 1, **kw) for _ in range(3))
            whole = statistics.median(self.hf_generate(model, ids, new, **kw) for _ in range(3 if self.dry else 1))
            rows.append(dict(model="0.6B", backend=f"transformers {kind}", prompt=prompt, new_tokens=new,
                             ttft_ms=first * 1e3,  # decode: the steps after the first token
                             decode_tok_s=(new - 1) / (whole - first) if whole > first else float("nan")))
            self.log(f"transformers {rows[-1]}")
        del model
        return rows

    def transformers_eager(self):
        # (dry: 16 new tokens, so that the decode after the first stands clear of the timings' noise
        # on a busy CPU; with 4 the median of three whole runs once came under the first token's)
        return self.hf_rows("eager", [(16, 16)] if self.dry else [(512, 128), (8192, 64)])

    def transformers_static(self):
        """transformers' own recipe: generate(..., cache_implementation="static") compiles the
        decoding forward (its default CompileConfig: torch.compile "reduce-overhead")."""
        if not self.cuda:
            return [{"skipped": "the static cache's compiled generate is a CUDA graph: CUDA only"}]
        return self.hf_rows("static cache + compile", [(512, 128)], cache_implementation="static")

    # -- 5. the server's batch ---------------------------------------------------------------------
    def server(self):
        from inferno.serve.batch import BatchEngine
        streams = DRY["streams"] if self.dry else STREAMS
        make = self.checkpoint(TINY if self.dry else QWEN3_06B, "Qwen3-0.6B")
        opts = {"graphs": "on" if self.cuda else "eager"} | ({} if self.dry else {"dtype": "bf16"})
        engine = self.engine(make, "gpu", opts)
        prompt, new = (8, 6) if self.dry else (128, 128)
        rows = []
        try:
            t = time.perf_counter()
            with BatchEngine(engine, parallel=max(streams), ctx_size=prompt + new + 8) as batch:
                rows.append(dict(capture_s=time.perf_counter() - t,
                                 captured=batch.slots.runner().captured))
                rng = np.random.default_rng(2)
                for n in [streams[0]] + streams:  # the first round warms up
                    prompts = [rng.integers(0, engine.config.vocab_size, prompt).tolist() for _ in range(n)]
                    opts_ = engine.options(max_tokens=new, temperature=0)
                    got, firsts = [0] * n, [None] * n
                    t0 = time.perf_counter()
                    handles = [batch.submit(p, opts_) for p in prompts]

                    def drain(i):
                        for event in handles[i]:
                            got[i] += len(event.token_ids)
                            if firsts[i] is None and event.token_ids:
                                firsts[i] = time.perf_counter() - t0
                    threads = [threading.Thread(target=drain, args=(i,)) for i in range(n)]
                    for th in threads:
                        th.start()
                    for th in threads:
                        th.join()
                    wall = time.perf_counter() - t0
                    rows.append(dict(streams=n, tokens=sum(got), wall_s=wall, aggregate_tok_s=sum(got) / wall,
                                     ttft_ms_median=1e3 * statistics.median(f for f in firsts if f is not None)))
                    self.log(f"server {rows[-1]}")
                    self.partial("server", rows)
                rows.pop(1)  # the warm-up round
        finally:
            engine.close()
        one = next((r["aggregate_tok_s"] for r in rows if r.get("streams") == 1), None)
        for r in rows:
            if one and "streams" in r:
                r["over_one_stream"] = r["aggregate_tok_s"] / one
        return rows

    # -- 6. attention bandwidth -------------------------------------------------------------------
    def attention(self):
        sweep = DRY if self.dry else dict(kv_lens=KV_LENS, gqa=GQA, head_dims=HEAD_DIMS, batches=BATCHES)
        # longest KV first: if the budget runs out, the shapes the targets name are measured
        shapes = [(hd, nh, nkv, kv, b) for kv in sorted(sweep["kv_lens"], reverse=True)
                  for hd in sweep["head_dims"] for (nh, nkv) in sweep["gqa"] for b in sweep["batches"]]
        rows = []
        for shape in shapes:
            if self.left() < 40:
                self.note(f"attention {shape} and later skipped: time budget")
                break
            rows.append(self.attention_row(*shape))
            self.log(f"attention {rows[-1]}")
            self.partial("attention", rows)
        return rows

    def split_sweep(self):
        """The kernel (serial) at the shapes with the fewest programs per split, across forced
        split counts: what the default grid (PROGRAMS_PER_SM programs per SM, MIN_BLOCKS_PER_SPLIT
        blocks a split) leaves on the table."""
        shapes = [(64, 16, 1, 200, 1)] if self.dry else [
            (128, 16, 1, 131072, 1), (64, 16, 1, 131072, 1), (64, 16, 1, 8192, 1), (128, 16, 1, 8192, 1)]
        counts = [1, 2] if self.dry else [32, 64, 128, 256, 512, 1024]
        rows = []
        for shape in shapes:
            if self.left() < 30:
                self.note(f"split sweep {shape} and later skipped: time budget")
                break
            rows.append(self.attention_row(*shape, splits=counts))
            self.log(f"splits {rows[-1]}")
            self.partial("splits", rows)
        return rows

    def attention_row(self, hd, nh, nkv, kv, batch, splits=None):
        td, dev = self.td, self.device
        dtype = torch.float32 if self.dry else torch.bfloat16
        width = nkv * hd
        nbytes = 2 * batch * kv * width * dtype.itemsize  # K and V, read once
        slots = self.slots_for(nbytes)
        k_all = torch.randn(slots, batch, kv, width, device=dev, dtype=dtype)
        v_all = torch.randn(slots, batch, kv, width, device=dev, dtype=dtype)
        q_all = torch.randn(slots, batch, 1, nh * hd, device=dev, dtype=dtype)
        out = torch.empty(batch, 1, nh * hd, device=dev, dtype=dtype)
        seq_slots = torch.arange(batch, device=dev)
        lens = torch.full((batch,), kv, dtype=torch.int64, device=dev)
        plan = td.plan_splits(kv, batch, nkv, td.default_block_n(hd), None, dev)
        row = dict(head_dim=hd, gqa=f"{nh}:{nkv}", kv_len=kv, batch=batch, splits=plan.num_splits,
                   mb_kv=nbytes / 2**20, slots=slots)

        def kernel(variant, num_splits=None):
            # lengths and slots in device memory, as in the captured decode step
            return lambda i: td.decode_attention_device(q_all[i], k_all[i], v_all[i], seq_slots, lens,
                                                        nh, nkv, hd, variant, out=out, num_splits=num_splits)

        def sdpa(i):
            qh = q_all[i].view(batch, 1, nh, hd).transpose(1, 2)  # [b, nh, 1, hd]
            kh = k_all[i].view(batch, kv, nkv, hd).transpose(1, 2)  # [b, nkv, kv, hd], in place
            vh = v_all[i].view(batch, kv, nkv, hd).transpose(1, 2)
            return F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)

        if splits is None:
            methods = [(v, kernel(v)) for v in td.VARIANTS if v not in getattr(self, "broken", ())]
            methods.append(("sdpa", sdpa))
        else:
            methods = [(f"serial@{n}", kernel("serial", n)) for n in splits]
        for name, fn in methods:
            try:
                sec, how = self.time_calls(fn, slots)
                row[f"{name}_us"] = sec * 1e6
                row[f"{name}_gbs"] = nbytes / sec / 1e9
                row["timing"] = how
            except Exception as e:
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"
        if splits is None and "serial_us" in row and "sdpa_us" in row:  # a sanity check of every shape
            a = kernel("serial")(0).float()
            b = sdpa(0).transpose(1, 2).reshape(batch, 1, nh * hd).float()
            row["max_diff_vs_sdpa"] = (a - b).abs().max().item()
        return row  # the caches are freed with this frame, before the next shape allocates

    # -- 7. what the kernels compiled to ----------------------------------------------------------
    def compiled(self):
        """The PTX and (where cuobjdump is on the PATH) the SASS of every variant go to
        <json>.kernels.txt; the table counts MMA, wgmma waits, exp2, registers and spills."""
        if not self.cuda:
            return {"skipped": "no compiled kernels under the interpreter"}
        import re
        import shutil
        import subprocess
        import tempfile
        out, dump = [], []
        for hd, (nh, nkv), block_h in [(128, (16, 1), None), (64, (16, 2), None), (128, (16, 1), 64)]:
            for variant in self.td.VARIANTS:
                q = torch.randn(1, nh * hd, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(4096, nkv * hd, device="cuda", dtype=torch.bfloat16)
                _, (split, _) = self.td._launch(q, k, k, 4096, nh, nkv, hd, variant, block_h=block_h)
                ptx = split.asm.get("ptx", "")
                waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
                out.append(dict(
                    variant=variant, head_dim=hd, gqa=f"{nh}:{nkv}", block_h=block_h or 16,
                    mma_sync=ptx.count("mma.sync"), wgmma=ptx.count("wgmma.mma_async"),
                    wgmma_wait_pending=sorted(set(int(w) for w in waits)), ex2=ptx.count("ex2.approx"),
                    registers=getattr(split, "n_regs", None), spills=getattr(split, "n_spills", None)))
                dump.append(f"==== {variant} head_dim={hd} gqa={nh}:{nkv} block_h={block_h or 16}: PTX\n{ptx}")
                cubin = split.asm.get("cubin")
                if cubin and shutil.which("cuobjdump"):
                    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                        f.write(cubin)
                        f.flush()
                        sass = subprocess.run(["cuobjdump", "--dump-sass", f.name],
                                              capture_output=True, text=True, timeout=60).stdout
                    dump.append(f"==== {variant} head_dim={hd}: SASS\n{sass}")
        Path(self.args.json).with_suffix(".kernels.txt").write_text("\n".join(dump))
        return out

    # -- 8. prefill paths -------------------------------------------------------------------------
    def prefill_paths(self):
        from inferno.backends.torch.gpu import sdpa_attention
        from inferno.backends.torch.torch_backend import materialized_gqa
        rows = []
        cases = [(64, torch.float32)] if self.dry else [
            (512, torch.bfloat16), (2048, torch.bfloat16), (8192, torch.bfloat16), (512, torch.float32)]
        nh, nkv, hd = 16, 8, 128
        for seq, dtype in cases:
            q = torch.randn(seq, nh * hd, device=self.device, dtype=dtype)
            k = torch.randn(seq, nkv * hd, device=self.device, dtype=dtype)
            row = dict(seq=seq, dtype=str(dtype).split(".")[-1])
            for name, fn in (("materialized", materialized_gqa), ("sdpa", sdpa_attention)):
                sec, _ = self.time_calls(lambda i: fn(q, k, k, nh, nkv, hd, True), 1, target_s=0.2)
                row[f"{name}_ms"] = sec * 1e3
            row["faster"] = min(("materialized", "sdpa"), key=lambda n: row[f"{n}_ms"])
            rows.append(row)
        return rows

    # -- report -----------------------------------------------------------------------------------
    def report(self) -> str:
        res, lines = self.results, []
        env, ceil = res.get("env", {}), res.get("ceilings", {})
        lines.append(f"## {env.get('name', '?')}: torch {env.get('torch')}, triton {env.get('triton')}, "
                     f"transformers {env.get('transformers')}")
        if "read_gb_per_s" in ceil:
            lines.append(f"read ceiling {ceil['read_gb_per_s']:.0f} GB/s; one copy (read + write) "
                         f"{ceil['copy_gb_per_s']:.0f} GB/s")
        checks = res.get("checks")
        if isinstance(checks, list):
            bad = [c for c in checks if not c["ok"]]
            lines.append(f"kernel checks: {len(checks) - len(bad)}/{len(checks)} ok" + (f"; FAILED: {bad}" if bad else ""))
        e2e = [r for key in ("e2e", "transformers_eager", "transformers_static")
               if isinstance(res.get(key), list) for r in res[key] if "decode_tok_s" in r]
        if e2e:
            lines += ["", "| model | backend | options | prompt | new | TTFT ms | decode tok/s | GB/s read | of ceiling | peak GB |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for r in e2e:
                opts = " ".join(f"{k}={r[k]}" for k in ("dtype", "graphs", "decode") if k in r) or "-"
                gbs = f"{r['read_gb_s']:.0f}" if "read_gb_s" in r else "-"
                share = f"{r['of_read_ceiling']:.0%}" if "of_read_ceiling" in r else "-"
                peak = f"{r['peak_gb']:.2f}" if "peak_gb" in r else "-"
                lines.append(f"| {r['model']} | {r['backend']} | {opts} | {r['prompt']} | {r['new_tokens']} | "
                             f"{r['ttft_ms']:.1f} | {r['decode_tok_s']:.1f} | {gbs} | {share} | {peak} |")
        server = [r for r in res.get("server", []) if isinstance(r, dict) and "streams" in r] \
            if isinstance(res.get("server"), list) else []
        if server:
            lines += ["", "| streams | aggregate tok/s | x one stream | TTFT median ms |", "|---|---|---|---|"]
            for r in server:
                lines.append(f"| {r['streams']} | {r['aggregate_tok_s']:.0f} | {r.get('over_one_stream', 0):.1f} | "
                             f"{r['ttft_ms_median']:.1f} |")
        if isinstance(res.get("attention"), list):
            lines += ["", "| hd | gqa | kv | batch | splits | serial GB/s | pingpong GB/s | sdpa GB/s | "
                      "best kernel / sdpa | pingpong / serial |", "|" + "---|" * 10]
            for r in sorted(res["attention"], key=lambda r: (r["head_dim"], r["gqa"], r["kv_len"], r["batch"])):
                s, p, d = (r.get(f"{m}_gbs") for m in ("serial", "pingpong", "sdpa"))
                best = max(x for x in (s, p) if x) if (s or p) else None
                fmt = lambda x: f"{x:.0f}" if x else "-"  # noqa: E731
                kv = f"{r['kv_len'] // 1024}k" if r["kv_len"] >= 1024 else str(r["kv_len"])
                lines.append(f"| {r['head_dim']} | {r['gqa']} | {kv} | {r['batch']} | {r['splits']} | {fmt(s)} | "
                             f"{fmt(p)} | {fmt(d)} | {f'{best / d:.2f}' if best and d else '-'} | "
                             f"{f'{p / s:.3f}' if p and s else '-'} |")
        if isinstance(res.get("splits"), list):
            lines += ["", "split sweep (serial GB/s at each forced split count; default count in brackets):"]
            for r in res["splits"]:
                counts = [(k.split("@")[1].removesuffix("_gbs"), v) for k, v in r.items()
                          if k.startswith("serial@") and k.endswith("_gbs")]
                lines.append(f"- hd {r['head_dim']} {r['gqa']} kv {r['kv_len']} batch {r['batch']} [{r['splits']}]: "
                             + ", ".join(f"{n}: {v:.0f}" for n, v in counts))
        if isinstance(res.get("compiled"), list):
            lines += ["", "| variant | hd | gqa | tile rows | mma.sync | wgmma | wgmma wait | ex2 | regs | spills |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for c in res["compiled"]:
                lines.append(f"| {c['variant']} | {c['head_dim']} | {c['gqa']} | {c['block_h']} | {c['mma_sync']} | "
                             f"{c['wgmma']} | {c['wgmma_wait_pending']} | {c['ex2']} | {c['registers']} | {c['spills']} |")
        if isinstance(res.get("prefill"), list):
            lines += ["", "| prefill attention | dtype | materialized ms | sdpa ms | faster |", "|---|---|---|---|---|"]
            for r in res["prefill"]:
                lines.append(f"| {r['seq']} tokens | {r['dtype']} | {r['materialized_ms']:.3f} | "
                             f"{r['sdpa_ms']:.3f} | {r['faster']} |")
        for note in res.get("notes", []):
            lines.append(f"NOTE: {note}")
        lines.append(f"elapsed {res.get('elapsed_s')} s; JSON: {self.args.json}")
        return "\n".join(lines)


def generate(engine, ids, new_tokens: int):
    """Greedy generation from token ids through the engine's own loop and timers."""
    stream = engine.stream(prompt_ids=ids.tolist(), max_tokens=new_tokens, temperature=0)
    for _ in stream:
        pass
    return stream.result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--json", required=True, help="where to write the full results")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes, Triton's interpreter on the CPU when there is no GPU")
    p.add_argument("--budget-s", type=float, default=330.0,
                   help="stop starting new measurements after this many seconds")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        if not args.dry_run:
            print("gpu_decode: no CUDA GPU here; --dry-run checks the plumbing on the CPU", file=sys.stderr)
            return 1
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
    bench = Bench(args)
    bench.section("env", bench.env)
    bench.section("ceilings", bench.ceilings)
    bench.section("checks", bench.checks)
    bench.section("e2e", bench.end_to_end)  # the targets first
    bench.section("transformers_eager", bench.transformers_eager, need_s=30)
    bench.section("server", bench.server, need_s=40)
    bench.section("attention", bench.attention, need_s=60)
    bench.section("splits", bench.split_sweep, need_s=30)
    bench.section("transformers_static", bench.transformers_static, need_s=120)
    bench.section("compiled", bench.compiled, need_s=15)
    bench.section("prefill", bench.prefill_paths, need_s=10)
    print(bench.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
