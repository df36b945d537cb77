"""Decode attention bandwidth and end-to-end decode speed on one CUDA GPU, in one call.

    python3 bench/gpu_decode.py --json $OUT/gpu_decode.json      # on the GPU: < 5 minutes
    python bench/gpu_decode.py --dry-run --json /tmp/dry.json    # the plumbing, on the CPU

Sections, in order (each is written to the JSON as soon as it is done, and a time budget skips
what would not fit):
1. ceilings: the card's copy bandwidth (bytes read + written per second, a 2 GiB copy);
2. checks: each kernel variant against a float64 reference on the device (bf16, fp16, fp32,
   one and several new tokens), and what each variant compiled to (MMA and wait instructions,
   registers, spills): the ping-pong's overlap shows as independent MMA and softmax work in
   one iteration, and with 64-row tiles as `wgmma.wait_group 1` instead of 0;
3. attention (the issue's targets, so it runs before the rest): achieved bandwidth (bytes of K
   and V read / kernel time) of `serial`, `pingpong` and torch's scaled_dot_product_attention
   at KV 1k, 8k, 32k, 128k, GQA 16:1, 16:2, 16:8, head dim 64 and 128, batch 1 and 8 (the
   kernel's entry point takes a batch dimension), bf16, longest KV first. Each timing is the
   median over CUDA-graph replays of calls rotating over enough cache copies to exceed 4x the
   L2, so no call finds its K/V in cache; the kernel is compared with SDPA on every shape;
4. prefill: the gpu backend's two prefill paths (materialized scores, torch SDPA) on the
   Qwen3-0.6B attention shape: the faster one should be GpuBackend's default;
5. end-to-end: a random Qwen3-0.6B-shaped model (28 layers, 16/8 heads, head dim 128, hidden
   1024, intermediate 3072, vocab 151936, tied) through Engine.generate on `torch` and `gpu`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
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
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128)
# Dry run: the same code paths on shapes the interpreter gets through in seconds.
DRY = dict(kv_lens=[64, 200], gqa=[(16, 1), (16, 8)], head_dims=[64], batches=[1, 2],
           model=dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32))


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

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        Path(self.args.json).write_text(json.dumps(self.results, indent=1, default=str))

    def section(self, name, fn):
        self.log(f"-- {name}")
        try:
            self.results[name] = fn()
        except Exception as e:  # one failed section must not lose the others' numbers
            self.results[name] = {"error": f"{type(e).__name__}: {e}",
                                  "traceback": traceback.format_exc()}
            self.log(f"{name} FAILED: {e}")
        self.save()

    # -- timing -----------------------------------------------------------------------------------
    def time_calls(self, fn, n_slots: int, target_s: float = 0.15) -> tuple[float, str]:
        """Median seconds per call of fn(slot) over slots 0..n_slots-1, each timed unit one pass
        over all slots. CUDA: a graph of one pass, replayed between events (no launch gaps);
        eager events if capture fails. CPU: wall clock."""
        for i in range(min(2, n_slots)):
            fn(i)  # compile and warm up
        if not self.cuda:
            t = time.perf_counter()
            for i in range(n_slots):
                fn(i)
            return (time.perf_counter() - t) / n_slots, "wall"
        torch.cuda.synchronize()
        run = None
        try:
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
            run, how = graph.replay, "graph"
        except Exception as e:
            self.results["notes"].append(f"graph capture failed ({e}); eager timing")
            torch.cuda.synchronize()

            def run():
                for i in range(n_slots):
                    fn(i)
            how = "eager"
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        run()
        start.record()
        run()
        end.record()
        end.synchronize()
        once = max(start.elapsed_time(end) / 1e3, 1e-6)
        times = []
        for _ in range(int(min(50, max(7, target_s / once)))):
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / n_slots)
        return statistics.median(times), how

    def slots_for(self, nbytes: int) -> int:
        """Copies of the inputs to rotate over, so one pass exceeds 4x the L2."""
        if not self.cuda:
            return 2
        l2 = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 64 << 20)
        return int(min(1024, max(2, math.ceil(4 * l2 / nbytes))))

    # -- 1. ceilings ------------------------------------------------------------------------------
    def env(self):
        info = {"torch": torch.__version__, "python": sys.version.split()[0]}
        import triton
        info["triton"] = triton.__version__
        if self.cuda:
            p = torch.cuda.get_device_properties(self.device)
            info.update(name=p.name, sms=p.multi_processor_count, memory_gb=p.total_memory / 1e9,
                        l2_mb=getattr(p, "L2_cache_size", 0) / 2**20, capability=f"{p.major}.{p.minor}")
        else:
            info["name"] = "cpu (Triton interpreter)"
        return info

    def copy_bandwidth(self):
        n = (64 << 20) if self.dry else (2 << 30)  # bytes per buffer
        src = torch.randn(n // 4, device=self.device)
        dst = torch.empty_like(src)
        sec, how = self.time_calls(lambda i: dst.copy_(src), 1, target_s=0.3)
        return {"bytes": 2 * n, "seconds": sec, "gb_per_s": 2 * n / sec / 1e9, "timing": how}

    # -- 2. checks --------------------------------------------------------------------------------
    def checks(self):
        td, rows = self.td, []
        # (n_heads, n_kv, head_dim, kv_len, new tokens); every shape in bf16, the first two in
        # fp16 and fp32 too (each combination is a compile: keep the count down)
        shapes = [(16, 1, 128, 1000, 1), (16, 2, 64, 4097, 4), (9, 3, 64, 300, 2), (16, 8, 128, 65, 1)]
        cases = [(torch.bfloat16, s) for s in shapes] + [
            (dt, s) for dt in (torch.float16, torch.float32) for s in shapes[:2]]
        if self.dry:
            cases = [(dt, s) for dt in (torch.float32, torch.float16)
                     for s in [(16, 1, 64, 130, 1), (9, 3, 64, 70, 4)]]
        tol = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
        g = torch.Generator(device=self.device).manual_seed(0)
        for variant in td.VARIANTS:
            for dtype, (nh, nkv, hd, kv, new) in cases:
                q = torch.randn(new, nh * hd, device=self.device, generator=g).to(dtype)
                k = torch.randn(kv + 5, nkv * hd, device=self.device, generator=g).to(dtype)
                v = torch.randn(kv + 5, nkv * hd, device=self.device, generator=g).to(dtype)
                k[kv:], v[kv:] = float("nan"), float("nan")
                out = torch.full_like(q, float("nan"))
                td.decode_attention(q, k, v, kv, nh, nkv, hd, variant=variant, out=out)
                ref = td.reference_attention(q, k, v, kv, nh, nkv, hd)
                err = (out.double() - ref).abs().max().item()  # NaN stays NaN: fails below
                rows.append(dict(variant=variant, dtype=str(dtype).split(".")[-1], n_heads=nh,
                                 n_kv=nkv, head_dim=hd, kv_len=kv, new=new, max_err=err,
                                 ok=bool(err < tol[dtype])))
        bad = [r for r in rows if not r["ok"]]
        self.broken = {r["variant"] for r in bad}
        if bad:
            self.results["notes"].append(f"{len(bad)} kernel checks FAILED: {bad}")
        return rows

    def compiled(self):
        """What each variant compiled to, from the PTX of a real launch. The PTX and (where
        cuobjdump is on the PATH) the SASS of every kernel go to <json>.kernels.txt, to read
        after the lease: look for the HMMAs of S(i+1) interleaved with MUFU.EX2 in the
        ping-pong's loop body."""
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
                    wgmma_wait_pending=sorted(set(int(w) for w in waits)),
                    cp_async=ptx.count("cp.async.") - ptx.count("cp.async.bulk"),
                    tma=ptx.count("cp.async.bulk"), ex2=ptx.count("ex2.approx"),
                    registers=getattr(split, "n_regs", None), spills=getattr(split, "n_spills", None),
                    shared_bytes=getattr(getattr(split, "metadata", None), "shared", None)))
                dump.append(f"==== {variant} head_dim={hd} gqa={nh}:{nkv} block_h={block_h or 16}: PTX\n{ptx}")
                cubin = split.asm.get("cubin")
                if cubin and shutil.which("cuobjdump"):
                    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                        f.write(cubin)
                        f.flush()
                        sass = subprocess.run(["cuobjdump", "--dump-sass", f.name],
                                              capture_output=True, text=True, timeout=60).stdout
                    dump.append(f"==== {variant} head_dim={hd} gqa={nh}:{nkv} block_h={block_h or 16}: SASS\n{sass}")
        Path(self.args.json).with_suffix(".kernels.txt").write_text("\n".join(dump))
        return out

    # -- 3. prefill paths -------------------------------------------------------------------------
    def prefill_paths(self):
        from inferno.backends.torch.gpu import sdpa_attention
        from inferno.backends.torch.torch_backend import materialized_gqa
        rows = []
        cases = [(64, torch.float32)] if self.dry else [
            (512, torch.bfloat16), (2048, torch.bfloat16), (8192, torch.bfloat16),
            (512, torch.float32), (2048, torch.float32)]
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

    # -- 4. end to end ----------------------------------------------------------------------------
    def random_checkpoint(self):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers.models import WordLevel

        from inferno.model.config import ModelConfig
        from inferno.model.loader import Checkpoint
        from inferno.model.tokenizer import Tokenizer
        shape = DRY["model"] if self.dry else QWEN3_06B
        cfg = ModelConfig(architecture="qwen3", rms_norm_eps=1e-6, rope_theta=1e6,
                          max_position_embeddings=40960, tie_word_embeddings=True,
                          **shape)
        rng = np.random.default_rng(0)
        hd, hidden, inter = cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
        mat = lambda o, i: rng.standard_normal((o, i), dtype=np.float32) * np.float32(0.02)  # noqa: E731
        ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
        t = {"model.embed_tokens.weight": mat(cfg.vocab_size, hidden), "model.norm.weight": ones(hidden)}
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            t.update({p + "input_layernorm.weight": ones(hidden),
                      p + "post_attention_layernorm.weight": ones(hidden),
                      p + "self_attn.q_proj.weight": mat(cfg.q_width, hidden),
                      p + "self_attn.k_proj.weight": mat(cfg.kv_width, hidden),
                      p + "self_attn.v_proj.weight": mat(cfg.kv_width, hidden),
                      p + "self_attn.o_proj.weight": mat(hidden, cfg.q_width),
                      p + "self_attn.q_norm.weight": ones(hd), p + "self_attn.k_norm.weight": ones(hd),
                      p + "mlp.gate_proj.weight": mat(inter, hidden),
                      p + "mlp.up_proj.weight": mat(inter, hidden),
                      p + "mlp.down_proj.weight": mat(hidden, inter)})
        vocab = {f"t{i}": i for i in range(cfg.vocab_size)}
        tok = Tokenizer(HFTokenizer(WordLevel(vocab, unk_token="t0")))
        return lambda: Checkpoint(cfg, dict(t), tok, source="random Qwen3-0.6B shape")

    def end_to_end(self):
        from inferno.backends import create_backend
        from inferno.engine import Engine
        make = self.random_checkpoint()
        vocab = make().config.vocab_size
        if self.dry:
            configs = [("torch", {"device": self.device.type}, [(16, 4)]),
                       ("gpu", {"decode": "pingpong"}, [(16, 4)]),
                       ("gpu", {"decode": "serial", "prefill": "materialized"}, [(16, 4)])]
        else:
            long = [(512, 128), (8192, 64)]
            configs = [("torch", {"dtype": "bf16"}, long),
                       ("gpu", {"dtype": "bf16", "decode": "pingpong"}, long),
                       ("gpu", {"dtype": "bf16", "decode": "serial"}, long),
                       ("gpu", {"dtype": "bf16", "decode": "pingpong", "prefill": "materialized"}, long),
                       ("torch", {}, [(512, 128)]),
                       ("gpu", {"decode": "pingpong"}, [(512, 128)])]
        rows = []
        ids = np.random.default_rng(1).integers(0, vocab, 8192)
        for name, opts, runs in configs:
            if self.left() < 40:
                self.results["notes"].append(f"end-to-end {name} {opts} skipped: time budget")
                continue
            if self.cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            if name == "gpu" and not self.cuda:  # dry run: the kernel under the interpreter
                from inferno.backends.torch.gpu import GpuBackend
                ops = GpuBackend(**opts, device="cpu")
            else:
                ops = create_backend(name, **opts)
            engine = Engine(make(), ops)
            try:
                for prompt, new in runs:
                    generate(engine, ids[:prompt], 8)  # warm up: compiles, allocator, cuBLAS
                    r = generate(engine, ids[:prompt], new)
                    row = dict(backend=name, **{k: v for k, v in opts.items() if k != "device"},
                               prompt=prompt, new_tokens=r.generated_tokens,
                               ttft_ms=r.ttft_s * 1e3, prefill_tok_s=r.prefill_tokens_per_s,
                               decode_tok_s=r.decode_tokens_per_s,
                               peak_gb=r.peak_memory_bytes / 1e9)
                    rows.append(row)
                    self.log(f"e2e {row}")
            finally:
                engine.close()
                del engine, ops
        return rows

    # -- 5. attention bandwidth -------------------------------------------------------------------
    def attention(self):
        sweep = (DRY if self.dry else dict(kv_lens=KV_LENS, gqa=GQA, head_dims=HEAD_DIMS, batches=BATCHES))
        # longest KV first: if the budget runs out, the shapes the targets name are measured
        shapes = [(hd, nh, nkv, kv, b) for kv in sorted(sweep["kv_lens"], reverse=True)
                  for hd in sweep["head_dims"] for (nh, nkv) in sweep["gqa"] for b in sweep["batches"]]
        if not self.dry:  # 64-row tiles: wgmma on Hopper, where the ping-pong can stay async
            shapes += [(hd, 16, nkv, 131072, 1, 64) for hd in HEAD_DIMS for nkv in (1, 2)]
        rows = []
        for shape in shapes:
            if self.left() < 10:
                self.results["notes"].append(f"attention {shape} and later skipped: time budget")
                break
            rows.append(self.attention_row(*shape))
            self.log(f"attention {rows[-1]}")
            self.save_partial("attention", rows)
        return rows

    def save_partial(self, key, rows):
        self.results[key] = rows
        self.save()

    def attention_row(self, hd, nh, nkv, kv, batch, block_h=None):
        td, dev = self.td, self.device
        dtype = torch.float32 if self.dry else torch.bfloat16
        width = nkv * hd
        nbytes = 2 * batch * kv * width * dtype.itemsize  # K and V, read once
        slots = self.slots_for(nbytes)
        k_all = torch.randn(slots, batch, kv, width, device=dev, dtype=dtype)
        v_all = torch.randn(slots, batch, kv, width, device=dev, dtype=dtype)
        q_all = torch.randn(slots, batch, 1, nh * hd, device=dev, dtype=dtype)
        out = torch.empty(batch, 1, nh * hd, device=dev, dtype=dtype)
        plan = td.plan_splits(kv, batch, nkv, td.default_block_n(hd), None, dev)
        partials = td.alloc_partials(batch, 1, nh, plan.num_splits, hd, dev)
        row = dict(head_dim=hd, gqa=f"{nh}:{nkv}", kv_len=kv, batch=batch, block_h=block_h or 16,
                   splits=plan.num_splits, mb_kv=nbytes / 2**20, slots=slots)

        def kernel(variant):
            return lambda i: td.decode_attention(q_all[i], k_all[i], v_all[i], kv, nh, nkv, hd,
                                                 variant=variant, out=out, partials=partials,
                                                 block_h=block_h)

        def sdpa(i):
            qh = q_all[i].view(batch, 1, nh, hd).transpose(1, 2)  # [b, nh, 1, hd]
            kh = k_all[i].view(batch, kv, nkv, hd).transpose(1, 2)  # [b, nkv, kv, hd], in place
            vh = v_all[i].view(batch, kv, nkv, hd).transpose(1, 2)
            return F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)

        methods = [(v, kernel(v)) for v in td.VARIANTS if v not in getattr(self, "broken", ())]
        if block_h is None:
            methods.append(("sdpa", sdpa))
        for name, fn in methods:
            try:
                sec, how = self.time_calls(fn, slots)
                row[f"{name}_us"] = sec * 1e6
                row[f"{name}_gbs"] = nbytes / sec / 1e9
                row["timing"] = how
            except Exception as e:
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"
        # the kernel against SDPA on slot 0's inputs: a sanity check of every timed shape
        if block_h is None and "pingpong_us" in row and "sdpa_us" in row:
            a = kernel("pingpong")(0).float()
            b = sdpa(0).transpose(1, 2).reshape(batch, 1, nh * hd).float()
            row["max_diff_vs_sdpa"] = (a - b).abs().max().item()
        return row  # the caches are freed with this frame, before the next shape allocates

    # -- report -----------------------------------------------------------------------------------
    def report(self) -> str:
        res, lines = self.results, []
        copy = res.get("copy", {})
        ceiling = copy.get("gb_per_s")
        env = res.get("env", {})
        lines.append(f"## {env.get('name', '?')}: torch {env.get('torch')}, triton {env.get('triton')}")
        if ceiling:
            lines.append(f"copy bandwidth (read + write): {ceiling:.0f} GB/s")
        checks = res.get("checks")
        if isinstance(checks, list):
            bad = [c for c in checks if not c["ok"]]
            lines.append(f"kernel checks: {len(checks) - len(bad)}/{len(checks)} ok"
                         + (f"; FAILED: {bad}" if bad else ""))
        if isinstance(res.get("compiled"), list):
            lines += ["", "| variant | hd | gqa | tile rows | mma.sync | wgmma | wgmma wait | ex2 | regs | spills |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for c in res["compiled"]:
                lines.append(f"| {c['variant']} | {c['head_dim']} | {c['gqa']} | {c['block_h']} | "
                             f"{c['mma_sync']} | {c['wgmma']} | {c['wgmma_wait_pending']} | "
                             f"{c['ex2']} | {c['registers']} | {c['spills']} |")
        if isinstance(res.get("prefill"), list):
            lines += ["", "| prefill attention | dtype | materialized ms | sdpa ms | faster |",
                      "|---|---|---|---|---|"]
            for r in res["prefill"]:
                lines.append(f"| {r['seq']} tokens | {r['dtype']} | {r['materialized_ms']:.3f} | "
                             f"{r['sdpa_ms']:.3f} | {r['faster']} |")
        if isinstance(res.get("e2e"), list):
            lines += ["", "| backend | options | prompt | new | TTFT ms | prefill tok/s | decode tok/s | peak GB |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in res["e2e"]:
                opts = " ".join(f"{k}={r[k]}" for k in ("dtype", "decode", "prefill") if k in r) or "f32"
                lines.append(f"| {r['backend']} | {opts} | {r['prompt']} | {r['new_tokens']} | "
                             f"{r['ttft_ms']:.1f} | {r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} | "
                             f"{r['peak_gb']:.2f} |")
        if isinstance(res.get("attention"), list):
            lines += ["", "| hd | gqa | kv | batch | tile | splits | serial GB/s | pingpong GB/s | sdpa GB/s | "
                      "pingpong/serial | best kernel / copy |", "|" + "---|" * 11]
            order = lambda r: (r["block_h"], r["head_dim"], r["gqa"], r["kv_len"], r["batch"])  # noqa: E731
            for r in sorted(res["attention"], key=order):
                s, p, d = (r.get(f"{m}_gbs") for m in ("serial", "pingpong", "sdpa"))
                best = max(x for x in (s, p) if x) if (s or p) else None
                fmt = lambda x: f"{x:.0f}" if x else "-"  # noqa: E731
                kv = f"{r['kv_len'] // 1024}k" if r["kv_len"] >= 1024 else str(r["kv_len"])
                ratio = f"{p / s:.3f}" if (p and s) else "-"
                share = f"{best / ceiling:.0%}" if (best and ceiling) else "-"
                lines.append(f"| {r['head_dim']} | {r['gqa']} | {kv} | {r['batch']} | {r['block_h']} | "
                             f"{r['splits']} | {fmt(s)} | {fmt(p)} | {fmt(d)} | {ratio} | {share} |")
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
    p.add_argument("--budget-s", type=float, default=270.0,
                   help="stop starting new measurements after this many seconds")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        if not args.dry_run:
            print("gpu_decode: no CUDA GPU here; --dry-run checks the plumbing on the CPU",
                  file=sys.stderr)
            return 1
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
    bench = Bench(args)
    bench.section("env", bench.env)
    bench.section("copy", bench.copy_bandwidth)
    bench.section("checks", bench.checks)
    bench.section("compiled", bench.compiled)
    bench.section("attention", bench.attention)  # the targets first
    bench.section("prefill", bench.prefill_paths)
    bench.section("e2e", bench.end_to_end)
    print(bench.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
