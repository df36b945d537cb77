"""A newcomer's first minutes: the bare command and --version, flags refused before anything
loads, errors that speak the caller's language (parameters in Python, flags on the command
line) and give the right advice, one rule for empty prompts, and sampling defaults taken from
the model."""

from __future__ import annotations

import json
import shutil

import pytest
from test_cli import cli

import inferno
import inferno.engine
from inferno import cli as inferno_cli
from inferno.errors import InfernoError


def test_bare_command_prints_help_and_succeeds():
    p = cli()
    assert p.returncode == 0, p.stderr
    for command in ("generate", "chat", "pull", "list", "bench"):
        assert command in p.stdout
    assert "error" not in p.stderr


def test_version():
    p = cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"inferno {inferno.__version__}"


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if anything tries to load a model."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(inferno.engine, "load", refuse)
    monkeypatch.setattr(inferno.engine, "open_checkpoint", refuse)


@pytest.mark.parametrize("args,message", [
    (["--ctx-size", "0"], "--ctx-size must be at least 1, got 0"),
    (["--ctx-size", "-5"], "--ctx-size must be at least 1, got -5"),
    (["-n", "0"], "--max-tokens must be at least 1, got 0"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--top-p", "2"], "--top-p must be in (0, 1]"),
    (["--prompt", ""], "the prompt is empty"),
    (["--prompt", "", "--raw"], "the prompt is empty"),
])
def test_flags_are_checked_before_any_load(args, message, no_load, capsys):
    if "--prompt" not in args:
        args = args + ["--prompt", "hi"]
    assert inferno_cli.main(["generate", "-m", "/never/loaded", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("inferno: error: ") and len(err.strip().splitlines()) == 1, err
    assert message in err, err


def test_ctx_size_is_checked_against_the_config_before_the_weights(qwen3_dir, monkeypatch):
    built = []
    monkeypatch.setattr(inferno.engine.Engine, "__init__", lambda *a, **k: built.append(1))
    with pytest.raises(InfernoError, match=r"ctx_size 100000 exceeds the model's context of 512"):
        inferno.load(qwen3_dir, ctx_size=100000, progress=False)
    assert built == []  # refused before the backend saw a weight


def test_errors_name_parameters_in_python_and_flags_on_the_command_line(qwen3_dir):
    engine = inferno.load(qwen3_dir, progress=False)
    with pytest.raises(InfernoError, match=r"^max_tokens must be at least 1, got 0$"):
        engine.generate("hi", max_tokens=0)
    with pytest.raises(InfernoError, match=r"^temperature must be >= 0") as e:
        engine.generate("hi", temperature=-1)
    assert e.value.for_cli().startswith("--temperature must be >= 0")
    with pytest.raises(InfernoError) as e:
        engine.generate("hi", max_tokens=10, ctx_size=12)
    said = str(e.value)
    assert "exceeds the context of 12 set by ctx_size: raise ctx_size (the model allows up to 512)" in said
    assert "--" not in said  # the Python API speaks in parameter names
    p = cli("generate", "-m", qwen3_dir, "-p", "hi", "-n", 10, "-c", 12)
    assert p.returncode == 1
    assert "set by --ctx-size: raise --ctx-size (the model allows up to 512), lower --max-tokens" in p.stderr


def test_stdin_prompt_loses_one_trailing_newline(qwen3_dir):
    def prompt_tokens(*args, stdin=None):
        p = cli("generate", "-m", qwen3_dir, "-n", 1, "--json", *args, stdin=stdin)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["prompt_tokens"]
    assert prompt_tokens("-p", "-", "--raw", stdin="Hello there\n") == prompt_tokens("-p", "Hello there", "--raw")
    assert prompt_tokens("-p", "-", "--raw", stdin="Hello there\n\n") == prompt_tokens("-p", "Hello there\n", "--raw")


@pytest.fixture(scope="module")
def sampled_dir(qwen3_dir, tmp_path_factory):
    """The tiny Qwen3 with a generation_config.json that asks for its own sampling."""
    folder = tmp_path_factory.mktemp("sampled")
    for f in qwen3_dir.iterdir():
        shutil.copy(f, folder)
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.3, "top_k": 7, "top_p": 0.5}))
    return folder


def test_sampling_defaults_come_from_the_model_and_flags_win(sampled_dir):
    engine = inferno.load(sampled_dir, progress=False)
    d = engine.sampling
    assert (d.values["temperature"], d.values["top_k"], d.values["top_p"]) == (0.3, 7, 0.5)
    assert d.sources["temperature"] == "generation_config.json"
    assert d.values["min_p"] == 0.05 and d.sources["min_p"] == "llama.cpp's default"
    # Left unset, a call takes the model's settings; given, the caller's win.
    same = engine.generate("Once upon", max_tokens=12, seed=3)
    explicit = engine.generate("Once upon", max_tokens=12, seed=3, temperature=0.3, top_k=7, top_p=0.5)
    assert same.token_ids == explicit.token_ids
    assert engine.sampling.params(temperature=0.0).temperature == 0.0

    p = cli("generate", "-m", sampled_dir, "-p", "Once upon", "-n", 12, "--seed", 3)
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("sampling: "))
    assert "--temperature 0.3, --top-k 7, --top-p 0.5 (generation_config.json)" in line
    assert "--min-p 0.05" in line and "(llama.cpp's default)" in line
    assert p.stdout == same.text + "\n"
    greedy = cli("generate", "-m", sampled_dir, "-p", "Once upon", "-n", 12, "-t", 0)
    assert greedy.stdout == engine.generate("Once upon", max_tokens=12, temperature=0).text + "\n"


def test_do_sample_false_means_greedy(sampled_dir, tmp_path):
    folder = tmp_path / "greedy"
    shutil.copytree(sampled_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.7}))
    assert inferno.load(folder, progress=False).sampling.values["temperature"] == 0.0


def test_alias_carries_the_model_cards_sampling():
    from inferno.loading.resolve import alias_sampling
    source, values = alias_sampling("smollm2-135m")
    assert values == {"temperature": 0.2, "top_p": 0.9} and "alias" in source
    assert alias_sampling(None) == alias_sampling("smollm2-135m")  # the default model
    assert alias_sampling("/some/folder") is None


def test_a_base_model_without_a_template_is_continued_raw_and_says_so(base_model_dir):
    p = cli("generate", "-m", base_model_dir, "-p", "Once upon", "-n", 4, "-t", 0)
    assert p.returncode == 0, p.stderr
    assert "no chat template" in p.stderr and "--raw" in p.stderr
    raw = cli("generate", "-m", base_model_dir, "-p", "Once upon", "-n", 4, "-t", 0, "--raw")
    assert raw.stdout == p.stdout and "no chat template" not in raw.stderr


def test_the_sampling_line_says_what_the_flags_set(sampled_dir):
    p = cli("generate", "-m", sampled_dir, "-p", "Once upon", "-n", 2, "-t", 0, "--top-k", 3)
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("sampling: "))
    assert "--temperature 0, --top-k 3 (given)" in line
    assert "--top-p 0.5 (generation_config.json)" in line


def test_a_models_bad_sampling_value_is_one_error(sampled_dir, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(sampled_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": "hot"}))
    with pytest.raises(InfernoError, match=r"generation_config.json: temperature is 'hot', not a number"):
        inferno.load(folder, progress=False)
