"""`inferno bench` end to end on a tiny model: a well-formed table and JSON. Nothing here asserts
a speed: the numbers are checked for shape, never for value."""

from __future__ import annotations

import json
import re

import pytest

from inferno import bench
from inferno.cli import main
from inferno.errors import InfernoError

NUMBER_PM = re.compile(r"^\d+\.\d+ ± \d+\.\d+$")


def table_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.strip().splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_bench_cli_table(qwen3_dir, capsys):
    """Three backends, each in its own process, one repetition: pp and tg rows for each."""
    assert main(["bench", "-m", str(qwen3_dir), "-b", "cpu,simd", "-b", "pool", "-p", "9",
                 "-n", "4", "-r", "1"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert rows[0] == bench.COLUMNS
    assert all(re.fullmatch(r"-+:?", cell) for cell in rows[1])
    body = rows[2:]
    col = bench.COLUMNS.index
    assert [(r[col("backend")], r[col("test")]) for r in body] == [
        (b, t) for b in ("cpu", "simd", "pool") for t in ("pp9", "tg4")]
    for r in body:
        assert len(r) == len(bench.COLUMNS)
        cell = dict(zip(bench.COLUMNS, r))
        assert cell["model"] == qwen3_dir.name and cell["flash"] == "on"
        assert cell["type"] == "F32"  # the tiny model's float32 safetensors
        assert NUMBER_PM.match(cell["t/s"]), cell["t/s"]
        if cell["test"].startswith("pp"):
            assert re.fullmatch(r"\d+\.\d ± \d+\.\d", cell["ttft ms"]) and cell["GB/s"] == ""
        else:
            assert cell["ttft ms"] == "" and re.fullmatch(r"\d+\.\d", cell["GB/s"])
        assert int(cell["peak MiB"]) > 0 and float(cell["load s"]) >= 0
    threads = {r[col("backend")]: r[col("threads")] for r in body}
    assert threads["simd"] == "1" and threads["cpu"] == "-" and int(threads["pool"]) >= 1


def test_bench_json_flash_on_and_off(qwen3_dir):
    """Both attention paths on one backend, in process; JSON keeps every repetition."""
    rows = bench.run(qwen3_dir, ["pool"], flash=bench.parse_flash("on,off"), n_prompts=[70],
                     n_gens=[0], reps=2, isolate=False, backend_options={"threads": 2})
    data = json.loads(bench.to_json(rows))
    assert [(d["backend"], d["flash"], d["test"], d["threads"]) for d in data] == \
        [("pool", True, "pp70", 2), ("pool", False, "pp70", 2)]
    for d in data:
        assert len(d["seconds"]) == 2 and d["tokens_per_s_mean"] > 0 and d["ttft_ms_mean"] > 0
        assert d["weight_bytes_per_token"] > 0


def test_bench_options_only_reach_backends_that_take_them(qwen3_dir):
    rows = bench.run(qwen3_dir, ["simd"], n_prompts=[0], n_gens=[3], reps=1, isolate=False,
                     backend_options={"threads": 2, "device": None})
    assert [(r.backend, r.test, r.threads) for r in rows] == [("simd", "tg3", 1)]


@pytest.mark.parametrize("argv,message", [
    (["-p", "abc"], "-p takes token counts"),
    (["-n", "-3"], "-n takes token counts of 0 or more"),
    (["--flash", "maybe"], "--flash takes on, off or on,off"),
    (["-b", "cpu,nope"], "unknown backend 'nope'"),
    (["-p", "0", "-n", "0"], "nothing to measure"),
])
def test_bench_bad_flags(qwen3_dir, capsys, argv, message):
    assert main(["bench", "-m", str(qwen3_dir), *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_format_table_from_rows():
    rows = [bench.Row("m", "Q4_1", "pool", 2, True, "pp4", 4, [0.5, 0.25], 1000, 2**30, 1.5),
            bench.Row("m", "F32", "peer", None, None, "tg2", 2, [1.0], 10**9, 2**20, 0.1)]
    table = table_rows(bench.format_table(rows))
    assert table[2] == ["m", "Q4_1", "pool", "2", "on", "pp4", "12.00 ± 5.66", "375.0 ± 176.8", "",
                        "1024", "1.50"]
    assert table[3] == ["m", "F32", "peer", "-", "-", "tg2", "2.00 ± 0.00", "", "2.0", "1", "0.10"]
    assert bench.ratio(rows, "pool", "peer", "pp4") is None


def test_decode_at_depth(qwen3_dir):
    """--depth: the tg tests decode after an untimed synthetic context, and say so in the name."""
    rows = bench.run(str(qwen3_dir), ["simd"], n_prompts=[0], n_gens=[3], reps=1, isolate=False,
                     depth=20)
    assert [(r.test, r.n_tokens) for r in rows] == [("tg3@d20", 3)]
    with pytest.raises(InfernoError, match="--depth must be 0 or more"):
        bench.run(str(qwen3_dir), ["simd"], n_prompts=[0], n_gens=[3], reps=1, depth=-1)
