"""The CLI end to end, in a subprocess, on a tiny random model: streaming, stats, JSON, trace,
and a one-line error with a non-zero exit for each kind of bad input."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

import inferno


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "inferno", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=300)


def test_generate_streams_text_and_prints_stats(qwen3_dir):
    p = cli("generate", "--model", qwen3_dir, "--prompt", "Hello there", "-n", 12,
            "--temperature", 0.9, "--seed", 5)
    assert p.returncode == 0, p.stderr
    want = inferno.load(qwen3_dir, progress=False).generate(
        "Hello there", max_tokens=12, temperature=0.9, seed=5)
    assert p.stdout == want.text + "\n"
    lines = p.stderr.splitlines()
    assert any(re.fullmatch(r"load: [\d.]+ s \(.+, pool backend\)", ln) for ln in lines), p.stderr
    assert any(re.fullmatch(r"prefill: \d+ prompt tokens, time to first token [\d.]+ ms, [\d.]+ tokens/s", ln)
               for ln in lines), p.stderr
    cut = r" \(stopped at --max-tokens\)" if want.finish_reason == "length" else ""
    assert any(re.fullmatch(rf"decode: {want.generated_tokens} tokens, [\d.]+ tokens/s{cut}", ln)
               for ln in lines), p.stderr
    assert any(re.fullmatch(r"memory: peak \d+ MiB", ln) for ln in lines)


def test_json_output(qwen3_dir):
    p = cli("generate", "-m", qwen3_dir, "-p", "Hi", "-n", 5, "-t", 0, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["generated_tokens"] == len(out["token_ids"]) <= 5
    assert out["prompt_tokens"] > 0 and out["ttft_s"] > 0 and isinstance(out["text"], str)


def test_prompt_from_stdin_and_raw(llama_dir):
    a = cli("generate", "-m", llama_dir, "-p", "-", "-n", 6, "-t", 0, "--raw", "--json", stdin="Once upon")
    b = cli("generate", "-m", llama_dir, "-p", "Once upon", "-n", 6, "-t", 0, "--raw", "--json")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert json.loads(a.stdout)["token_ids"] == json.loads(b.stdout)["token_ids"]
    engine = inferno.load(llama_dir, progress=False)
    assert json.loads(a.stdout)["prompt_tokens"] == len(engine.tokenizer.encode("Once upon"))


def histogram(stderr: str) -> dict[str, int]:
    rows = {}
    for line in stderr.splitlines():
        m = re.fullmatch(r"(\w+)\s+(\d+)\s+[\d.]+\s+[\d.]+%\s+#*", line)
        if m:
            rows[m.group(1)] = int(m.group(2))
    return rows


def test_trace_shows_one_attention_call_per_layer(qwen3_dir):
    """On pool (the default) a prompt's rows attend through the decode kernel, as a decode
    step's would (Backend.batch_invariant): one call a layer, no flash or materialized scores."""
    layers = inferno.load(qwen3_dir, progress=False).config.num_hidden_layers
    p = cli("generate", "-m", qwen3_dir, "-p", "A long enough prompt for a prefill", "-n", 1, "--trace")
    assert p.returncode == 0, p.stderr
    ops = histogram(p.stderr)
    assert ops["decode_attention"] == layers
    assert ops["linear_many"] == 2 * layers  # q/k/v and gate/up, each one call
    assert ops["linear"] == 2 * layers + 1  # o and down, and the lm head
    for absent in ("fill_strict_upper_tri", "transpose_2d", "softmax_rows", "flash_attention_prefill",
                   "materialized_attention"):
        assert absent not in ops


def test_trace_of_decode_and_of_flash_off(qwen3_dir):
    layers = inferno.load(qwen3_dir, progress=False).config.num_hidden_layers
    p = cli("generate", "-m", qwen3_dir, "-p", "Hello", "-n", 4, "-t", 0, "--trace", "--flash", "off")
    assert p.returncode == 0, p.stderr
    ops = histogram(p.stderr)
    assert ops["materialized_attention"] == layers and "flash_attention_prefill" not in ops
    decoded = ops["decode_attention"] // layers
    assert ops["decode_attention"] == decoded * layers and 1 <= decoded <= 3


@pytest.fixture(scope="module")
def gpt2_dir(qwen3_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    for f in qwen3_dir.iterdir():
        shutil.copy(f, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


BAD = {
    "missing folder": (["--model", "/no/such/model"], "/no/such/model"),
    "no config": (["--model", "{empty}"], "no config.json"),
    "unsupported architecture": (["--model", "{gpt2}"], "unsupported architecture GPT2LMHeadModel"),
    "prompt too long": (["-n", "600"], "exceeds the model's context of 512 tokens: lower --max-tokens"),
    "ctx-size": (["-n", "5", "--ctx-size", "8"], "exceeds the context of 8 set by --ctx-size: raise --ctx-size"),
    "negative temperature": (["--temperature", "-0.5"], "--temperature must be >= 0"),
    "top-p zero": (["--top-p", "0"], "--top-p must be in (0, 1]"),
    "top-p above one": (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
    "max-tokens zero": (["-n", "0"], "--max-tokens must be at least 1"),
    "unknown backend": (["--backend", "quantum"], "invalid choice: 'quantum'"),
    "bad number": (["--temperature", "hot"], "invalid float value: 'hot'"),
    "flag of another backend": (["--decode", "serial"], "--decode does not apply to backend 'pool' (only to: gpu)"),
    "threads off the pool": (["-b", "cpu", "--threads", "2"], "--threads does not apply to backend 'cpu' (only to: pool)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_nonzero(case, qwen3_dir, gpt2_dir, tmp_path):
    args, message = BAD[case]
    args = [a.format(empty=tmp_path, gpt2=gpt2_dir) for a in args]
    if "--model" not in args:
        args = ["--model", str(qwen3_dir)] + args
    p = cli("generate", *args, "--prompt", "Hello there, how are you today?")
    assert p.returncode != 0
    assert message in p.stderr
    assert "Traceback" not in p.stderr
    assert p.stdout == ""  # nothing half-written
    errors = [ln for ln in p.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, p.stderr


def test_help_shows_defaults():
    p = cli("generate", "--help")
    assert p.returncode == 0
    words = " ".join(p.stdout.split())  # argparse wraps the help text
    for text in ("--max-tokens", "(default: 256, or up to the end of the context", "--top-p", "(default: the model's, else 0.95)",
                 "--backend"):
        assert text in words


def test_stop_flag_repeats_and_cuts_the_reply(qwen3_dir):
    engine = inferno.load(qwen3_dir, progress=False)
    whole = engine.generate("Hello there", max_tokens=12, temperature=0).text
    assert len(whole) > 4
    cut = whole[2:4]
    want = engine.generate("Hello there", max_tokens=12, temperature=0, stop=["@@", cut]).text
    p = cli("generate", "-m", qwen3_dir, "-p", "Hello there", "-n", 12, "-t", 0, "--stop", "@@", "--stop", cut)
    assert p.returncode == 0, p.stderr
    assert p.stdout == want + "\n" and len(want) <= 2
    assert "(stopped at a --stop string)" in p.stderr
    p = cli("generate", "-m", qwen3_dir, "-p", "Hello there", "--stop", "")
    assert p.returncode == 1 and "--stop takes non-empty text" in p.stderr


def test_default_max_tokens_stops_at_a_small_context_and_blank_prompts_are_errors(qwen3_dir):
    p = cli("generate", "-m", qwen3_dir, "-p", "hi", "-c", 40, "-t", 0, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["prompt_tokens"] + out["generated_tokens"] <= 40 and (out["context_full"] or out["finish_reason"] == "stop")
    assert out["model"] == str(qwen3_dir) and out["backend"] == "pool" and out["weight_type"] == "F32"
    assert out["sampling"]["temperature"] == 0 and "top_k" in out["sampling"] and out["cache_type"] == "f16"
    p = cli("generate", "-m", qwen3_dir, "-p", "hi", "-c", 40, "-t", 0, "-n", 100)
    assert p.returncode == 1 and "exceeds the context of 40" in p.stderr  # asked for more than fits
    for prompt in ("   ", "\n\t"):
        p = cli("generate", "-m", qwen3_dir, "-p", prompt)
        assert p.returncode == 1 and "the prompt is empty" in p.stderr


def test_warmup_compiles_ahead_and_says_so(qwen3_dir):
    p = cli("warmup", "-m", qwen3_dir, "-b", "simd")
    assert p.returncode == 0, p.stderr
    assert re.search(r"warmup: .+ on simd: ready in [\d.]+ s", p.stderr), p.stderr
    bad = cli("warmup", "-m", qwen3_dir, "-b", "nope")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
