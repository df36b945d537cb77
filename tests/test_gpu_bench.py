"""bench/gpu_decode.py's plumbing, end to end, with --dry-run: tiny shapes, the Triton kernel
under the interpreter on the CPU (compiled, if a GPU is there), the decode step uncaptured
(graphs="eager"). The numbers mean nothing here; what must hold is that every section runs, the
kernel agrees with torch's SDPA on every timed shape, and the JSON holds what the report
promises. The real run is documented in bench/RESULTS.md."""

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
    for section in ("env", "ceilings", "checks", "e2e", "transformers_eager", "server", "attention",
                    "splits", "transformers_static", "compiled", "prefill"):
        assert "error" not in res[section], (section, res[section])
    assert res["ceilings"]["read_gb_per_s"] > 0 and res["ceilings"]["copy_gb_per_s"] > 0
    assert res["checks"] and all(c["ok"] for c in res["checks"])
    assert {c["path"] for c in res["checks"]} == {"host", "device"}
    e2e = res["e2e"]
    assert {(r["model"], r["backend"], r["graphs"]) for r in e2e} == {
        ("0.6B", "gpu", "eager"), ("0.6B", "gpu", "off"), ("0.6B", "torch", "eager"), ("8B", "gpu", "eager")}
    assert all(r["decode_tok_s"] > 0 and r["new_tokens"] == 4 and r["of_read_ceiling"] > 0 for r in e2e)
    assert res["transformers_eager"][0]["decode_tok_s"] > 0
    server = [r for r in res["server"] if "streams" in r]
    assert [r["streams"] for r in server] == [1, 3] and all(r["tokens"] == 6 * r["streams"] for r in server)
    assert {r["faster"] for r in res["prefill"]} <= {"sdpa", "materialized"}
    assert len(res["attention"]) == 8
    for row in res["attention"]:
        assert all(row[f"{m}_gbs"] > 0 for m in ("serial", "pingpong", "sdpa")), row
        assert row["max_diff_vs_sdpa"] < 1e-5, row
    assert all(r["serial@2_gbs"] > 0 for r in res["splits"])
    # the markdown report is the last thing printed
    assert "| hd | gqa | kv | batch |" in proc.stdout and "| streams | aggregate tok/s |" in proc.stdout


def test_refuses_without_gpu_unless_dry(tmp_path):
    import torch
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_decode.py"), "--json",
                           str(tmp_path / "x.json"), "--budget-s", "1"],
                          capture_output=True, text=True, timeout=300)
    if torch.cuda.is_available():  # a GPU: it runs (with a 1 s budget it skips most work)
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        assert proc.returncode == 1 and "no CUDA GPU" in proc.stderr
