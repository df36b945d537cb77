"""Requantise a GGUF with llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize), so
the files benchmarked are the ones llama.cpp users make: K-quant mixes with their per-tensor
fallbacks (Q5_0/Q5_1/Q8_0 where rows are not multiples of 256), Q8_0, and so on.

    python bench/quantize.py -m smollm2-135m --type q8_0      # -> ~/.cache/inferno/bench/...
    python bench/quantize.py -m model.f16.gguf --type q4_k_m --out model.q4_k_m.gguf

Requantising an already quantised file (SmolLM2 ships as Q4_1) goes through float32, as
llama-quantize --allow-requantize does; it is what a user with only that file can do.

Without llama-cpp-python (a 4-20 minute build) it runs llama.cpp's own `llama-quantize` binary,
the one built beside llama-bench by ../shared/bin/llama-server.sh (`cmake --build build --target
llama-quantize` in that tree, seconds once the libraries are built), or the one LLAMA_QUANTIZE
names. The two give the same file: the same quantizer from the same sources.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

TYPES = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k")
BENCH_DIR = Path("~/.cache/inferno/bench").expanduser()


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2 (C code's stderr) for the duration."""
    saved = os.dup(2)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def quantize_binary() -> str | None:
    """llama.cpp's llama-quantize: LLAMA_QUANTIZE, else the vendored build's, else on PATH."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser()
    ver = os.environ.get("LLAMA_CPP_PYTHON", "0.3.36")
    for candidate in (os.environ.get("LLAMA_QUANTIZE"),
                      cache / f"llama.cpp-vendored-{ver}" / "build" / "bin" / "llama-quantize"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return shutil.which("llama-quantize")


def quantize(src: Path, dst: Path, qtype: str, threads: int | None = None) -> Path:
    """Write `src` requantised to `qtype` at `dst` (under a temporary name, renamed when done)."""
    threads = threads or os.cpu_count() or 1
    dst.parent.mkdir(parents=True, exist_ok=True)
    part = dst.with_name(dst.name + ".part")
    try:
        import llama_cpp
    except ImportError:
        binary = quantize_binary()
        if binary is None:
            raise SystemExit("requantising needs llama.cpp's quantizer: pip install llama-cpp-python, "
                             "or build llama-quantize (../shared/bin/llama-server.sh, then cmake --build "
                             "<its tree>/build --target llama-quantize) or name it in LLAMA_QUANTIZE")
        run = subprocess.run([binary, "--allow-requantize", str(src), str(part), qtype.upper(), str(threads)],
                             capture_output=True, text=True)
        if run.returncode != 0:
            part.unlink(missing_ok=True)
            raise SystemExit(f"llama-quantize failed ({run.returncode}) on {src}:\n{run.stderr[-2000:]}")
        os.replace(part, dst)
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}")
    params.allow_requantize = True
    params.nthread = threads
    with quiet_stderr():  # llama.cpp prints a line per tensor
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(part).encode(), params)
    if rc != 0:
        part.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize failed ({rc}) on {src}")
    os.replace(part, dst)
    return dst


def main(argv=None) -> int:
    from inferno.loading.resolve import resolve

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", "-m", default="smollm2-135m", help="a .gguf file or an alias")
    p.add_argument("--type", "-t", required=True, choices=TYPES)
    p.add_argument("--out", type=Path, default=None, help=f"default: {BENCH_DIR}/NAME.TYPE.gguf")
    args = p.parse_args(argv)
    src = resolve(args.model)
    stem = src.name.removesuffix(".gguf").rsplit(".", 1)[0]  # drop the source's own type suffix
    dst = args.out or BENCH_DIR / f"{stem}.{args.type.upper()}.gguf"
    t0 = time.perf_counter()
    quantize(src, dst, args.type)
    print(f"wrote {dst} ({dst.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
