"""bench/gpu_decode.py's plumbing, end to end, with --dry-run: tiny shapes, the Triton kernel
under the interpreter on the CPU (compiled, if a GPU is there). The numbers mean nothing here;
what must hold is that every section runs, the kernel agrees with torch's SDPA on every timed
shape, and the JSON holds what the report promises. The real run is documented in
bench/RESULTS.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dry_run(tmp_path):
    out = tmp_path / "dry.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_decode.py"), "--dry-run",
                           "--json", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for section in ("env", "copy", "checks", "compiled", "prefill", "e2e", "attention"):
        assert "error" not in res[section], (section, res[section])
    assert res["copy"]["gb_per_s"] > 0
    assert res["checks"] and all(c["ok"] for c in res["checks"])
    assert {r["backend"] for r in res["e2e"]} == {"torch", "gpu"} and len(res["e2e"]) == 3
    assert all(r["decode_tok_s"] > 0 and r["new_tokens"] == 4 for r in res["e2e"])
    assert {r["faster"] for r in res["prefill"]} <= {"sdpa", "materialized"}
    assert len(res["attention"]) == 8
    for row in res["attention"]:
        assert all(row[f"{m}_gbs"] > 0 for m in ("serial", "pingpong", "sdpa")), row
        assert row["max_diff_vs_sdpa"] < 1e-5, row
    # the markdown report is the last thing printed
    assert "| hd | gqa | kv | batch |" in proc.stdout and "pingpong/serial" in proc.stdout


def test_refuses_without_gpu_unless_dry(tmp_path):
    import torch
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_decode.py"), "--json",
                           str(tmp_path / "x.json"), "--budget-s", "1"],
                          capture_output=True, text=True, timeout=300)
    if torch.cuda.is_available():  # a GPU: it runs (with a 1 s budget it skips most work)
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        assert proc.returncode == 1 and "no CUDA GPU" in proc.stderr
