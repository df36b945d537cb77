"""`inferno generate | chat | serve | embed | bench | pull | list`: parse flags, call the engine, print.

Generated text goes to stdout as it streams; stats, progress and errors go to stderr, so
`inferno generate ... > answer.txt` captures just the answer. A user error (InfernoError) is
one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from inferno import __version__
from inferno.backends import DEFAULT_BACKEND, backend_names
from inferno.backends.base import CACHE_TYPES
from inferno.formats.quant import QUANTIZERS
from inferno.errors import InfernoError, as_flags
from inferno.loading.resolve import DEFAULT_MODEL
from inferno.draft import DRAFT_DEFAULT, DRAFT_MAX, SPEC_TYPES
from inferno.sampling import SAMPLING_FIELDS, SamplingParams

EXIT_ERROR = 1

_LLAMA_CPP = SamplingParams()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Flags every command that loads a model shares."""
    p.add_argument("--model", "-m", default=DEFAULT_MODEL,
                   help="a model folder, a .gguf file, a hub id (Qwen/Qwen3-0.6B) or an alias "
                        "(see `inferno list`); aliases are fetched on first use")
    p.add_argument("--backend", "-b", default=DEFAULT_BACKEND, choices=backend_names(),
                   help="how every op runs")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="threads for the pool backend (default: the cores)")
    p.add_argument("--device", default=None,
                   help="torch backend device: cuda, mps or cpu (default: the first available)")
    p.add_argument("--dtype", default=None, choices=["f32", "bf16"],
                   help="torch/gpu backend weight dtype (default: f32)")
    p.add_argument("--decode", default=None, choices=["serial", "pingpong"],
                   help="gpu backend: the Triton decode kernel's KV loop (default: serial)")
    p.add_argument("--graphs", default=None, choices=["on", "eager", "off"],
                   help="torch/gpu backends: decode steps sampled on the device and captured in "
                        "CUDA graphs (on), the same step uncaptured (eager), or op by op with "
                        "sampling on the host (off) (default: on with CUDA, else off)")
    p.add_argument("--prefill", default=None, choices=["sdpa", "materialized"],
                   help="gpu backend: prefill attention path (default: sdpa)")
    p.add_argument("--flash", default="on", choices=["on", "off"],
                   help="off: prefill with materialized attention scores (for comparison)")
    p.add_argument("--weights", default=None, choices=QUANTIZERS,
                   help="quantize the float weights at load (a Hugging Face folder's bf16, say); "
                        "a GGUF's quantized blocks stay as stored (default: as the file has them)")
    p.add_argument("--cache-type", default=None, choices=CACHE_TYPES,
                   help="KV cache element type (default: f16 on simd and pool, f32 on cpu, the "
                        "dtype on torch and gpu)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    d = _LLAMA_CPP
    # Sampling flags default to None, "not given": the model's own defaults (its generation
    # config, or its alias's) apply, then llama.cpp's.
    model = "(default: the model's, else {})".format
    p.add_argument("--max-tokens", "-n", type=int, default=None,
                   help="most tokens to generate (default: 256, or up to the end of the context if that comes first)")
    p.add_argument("--temperature", "-t", type=float, help=f"0 is greedy {model(d.temperature)}")
    p.add_argument("--top-k", type=int, help=f"keep the k likeliest tokens; 0 is off {model(d.top_k)}")
    p.add_argument("--top-p", type=float, help=f"nucleus mass in (0, 1]; 1 is off {model(d.top_p)}")
    p.add_argument("--min-p", type=float,
                   help=f"drop tokens below min-p x the top probability; 0 is off {model(d.min_p)}")
    p.add_argument("--repeat-penalty", type=float,
                   help=f"penalise repeated tokens; 1 is off {model(d.repeat_penalty)}")
    p.add_argument("--seed", type=int, default=None, help="random seed; same seed, same output (default: random)")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="end the reply where this text appears (cut off); repeat for several")
    p.add_argument("--system", default=None, help="system message for the chat template")
    p.add_argument("--no-think", action="store_true", help="switch Qwen3 thinking off (enable_thinking=False)")
    p.add_argument("--ctx-size", "-c", type=int, default=None,
                   help="context size in tokens, prompt and reply together (default: the model's)")


def add_reasoning_args(p: argparse.ArgumentParser, where: str) -> None:
    from inferno.harmony import EFFORTS
    p.add_argument("--reasoning-effort", default=None, choices=EFFORTS,
                   help="how long a reasoning model reasons before it answers: gpt-oss's (harmony) "
                        "effort; a model whose chat template takes none refuses it (default: medium)")
    p.add_argument("--hide-reasoning", action="store_true",
                   help=f"show only a reasoning model's answer, not its reasoning (shown {where}, "
                        f"dimmed on a terminal)")


def add_pooling_arg(p: argparse.ArgumentParser) -> None:
    from inferno.embedding import POOLINGS
    p.add_argument("--pooling", default=None, choices=POOLINGS,
                   help="how a text's token vectors become one: the last token's, their mean, the "
                        "first's, or none (one per token) (default: what the model's files say, else last)")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="threads for the pool backend (default: every core)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 opens the server to the network")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--parallel", "-np", type=_positive_int, default=4,
                   help="sequences decoded together, each in its own KV cache slot")
    p.add_argument("--ctx-size", "-c", type=_positive_int, default=None,
                   help="positions per slot: prompt + max_tokens (default: 2048, or the model's context if less)")
    p.add_argument("--queue-limit", type=int, default=64, help="sequences that may wait for a slot; past it, 429")
    p.add_argument("--prefill-chunk", type=_positive_int, default=256,
                   help="prompt tokens prefilled per step, so running streams keep decoding")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` (default: $INFERNO_API_KEY, or none)")
    p.add_argument("--alias", default=None, help="the model name clients send (default: the --model name)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="server log: info has a line per request")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM, seconds running requests get to finish before they are cancelled")
    p.add_argument("--embeddings", action="store_true",
                   help="serve /v1/embeddings with a model that is not an embedding model (an embedding "
                        "model serves them without this flag)")
    add_pooling_arg(p)
    p.add_argument("--reasoning-format", choices=("auto", "none"), default="auto",
                   help="auto: a thinking model's <think> block (Qwen3, QwQ, DeepSeek-R1) goes out as the "
                        "message's reasoning_content, as llama-server's and vLLM's; none: it stays in content")
    p.add_argument("--ray", action="store_true", help="run as Ray Serve replicas (pip install -e '.[ray]' in inferno's folder)")
    p.add_argument("--replicas", type=_positive_int, default=1, help="with --ray: replicas, each with its own engine")
    p.add_argument("--router", choices=("default", "prefix"), default="default",
                   help="with --ray: Ray Serve's default router, or routing on the prompt's prefix to the "
                        "replica that holds it (power-of-two choices once the replicas' queues differ by two requests)")
    p.add_argument("--ray-address", default=None,
                   help="with --ray: the cluster to join ('auto', or HOST:6379 from `ray start --head`; "
                        "default: a local cluster)")


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default, unless the help already says it or there is none to show."""

    def _get_help_string(self, action):
        if "(default" in (action.help or "") or action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error, like inferno's own: the usage block would bury it."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="inferno", description="Run Llama, Qwen and Gemma LLMs (GGUF files or "
                    "Hugging Face folders) on CPU or GPU backends.",
                    epilog="`inferno COMMAND --help` shows a command's flags.")
    parser.add_argument("--version", action="version", version=f"inferno {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    fmt = DefaultsFormatter

    g = sub.add_parser("generate", help="generate text from a prompt", formatter_class=fmt)
    add_model_args(g)
    g.add_argument("--prompt", "-p", required=True, help="prompt text, or - to read it from stdin")
    add_sampling_args(g)
    g.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    add_reasoning_args(g, "on stderr")
    g.add_argument("--json-schema", "-j", default=None, metavar="FILE_OR_JSON",
                   help="constrain the reply to a JSON Schema: a file, or the schema itself as JSON")
    g.add_argument("--grammar-file", default=None, metavar="FILE",
                   help="constrain the reply to a GBNF grammar (llama.cpp's format) read from FILE")
    add_spec_args(g)
    g.add_argument("--json", action="store_true", help="print one JSON object (text and stats) instead of streaming")
    g.add_argument("--trace", action="store_true", help="print a histogram of every backend op after generation")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("chat", help="talk with a model, turn by turn (/clear, /bye)", formatter_class=fmt)
    add_model_args(c)
    add_sampling_args(c)
    c.add_argument("--verbose", "-v", action="store_true", help="print stats after each reply")
    add_reasoning_args(c, "before it")
    add_spec_args(c)
    c.set_defaults(func=cmd_chat)

    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching",
                       formatter_class=fmt, conflict_handler="resolve")
    add_model_args(s)
    add_serve_args(s)
    add_spec_args(s)
    s.set_defaults(func=cmd_serve)

    e = sub.add_parser("embed", help="vectors for texts, one JSON array per line (as /v1/embeddings "
                       "gives them)", formatter_class=fmt)
    add_model_args(e)
    e.add_argument("text", nargs="+", help="texts to embed; - reads one text per line from stdin")
    add_pooling_arg(e)
    e.add_argument("--no-normalize", action="store_true", help="the pooled vectors as they are, not of unit length")
    e.add_argument("--dimensions", type=_positive_int, default=None,
                   help="keep the first N values (a model trained for it: Matryoshka), then normalise")
    e.add_argument("--ctx-size", "-c", type=_positive_int, default=None,
                   help="most tokens a text may have (default: the model's context)")
    e.set_defaults(func=cmd_embed)

    w = sub.add_parser("warmup", help="compile a model's kernels on a backend ahead of time (an image "
                       "build, a CI job): the first reply then waits on nothing", formatter_class=fmt)
    add_model_args(w)
    w.set_defaults(func=cmd_warmup)

    pl = sub.add_parser("pull", help="fetch a model (an alias or a hub id) ahead of time", formatter_class=fmt)
    pl.add_argument("name", help="an alias (see `inferno list`) or a hub id such as Qwen/Qwen3-0.6B")
    pl.set_defaults(func=cmd_pull)

    ls = sub.add_parser("list", help="list the model aliases and what is cached", formatter_class=fmt)
    ls.set_defaults(func=cmd_list)

    # bench takes lists where the other commands take one value: --backend and --flash are
    # redefined (conflict_handler="resolve") on top of the shared model flags.
    b = sub.add_parser("bench", help="throughput table, llama-bench style: pp (prefill) and tg "
                       "(decode) tokens/s per backend", formatter_class=fmt, conflict_handler="resolve")
    add_model_args(b)
    b.add_argument("--backend", "-b", action="append", default=argparse.SUPPRESS,
                   help="backends to compare: a comma list or the flag repeated (default: cpu,simd,pool)")
    b.add_argument("--flash", default="on", help="on, off (materialized scores) or on,off for both")
    b.add_argument("--n-prompt", "--prompt-tokens", "-p", default="512",
                   help="synthetic prompt sizes for the ppN tests, comma list; 0 skips them")
    b.add_argument("--n-gen", "-n", default="128",
                   help="tokens to decode for the tgN tests, comma list; 0 skips them")
    b.add_argument("--repetitions", "-r", type=_positive_int, default=5,
                   help="timed runs per test, after one warm-up run")
    b.add_argument("--depth", "-d", type=int, default=0,
                   help="run the tgN tests after a synthetic context of this many tokens (tg128@d4096)")
    b.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompt")
    b.add_argument("--json", action="store_true", help="print JSON (every run's time) instead of the table")
    b.set_defaults(func=cmd_bench)
    return parser


def add_spec_args(p) -> None:
    p.add_argument("--spec-type", choices=("none",) + SPEC_TYPES, default="none",
                   help="speculative decoding: ngram drafts tokens by prompt lookup and checks them all in "
                        "one pass: the same text (with a seed, sampled too), in fewer steps where the reply "
                        "repeats its prompt; suffix also drafts from earlier requests' replies (what an "
                        "agent or a tool repeats from request to request); draft: a draft model's greedy "
                        "tokens (--model-draft)")
    p.add_argument("--draft-max", type=int, default=DRAFT_DEFAULT, help="tokens drafted a step at most (--spec-type)")
    p.add_argument("--model-draft", "-md", default=None, metavar="MODEL",
                   help="a smaller model with the same tokenizer that drafts (--spec-type draft, its default then)")


def speculative(args) -> dict:
    """The --spec-type, --draft-max and --model-draft flags as Options' speculative and
    spec_type, checked (--model-draft alone means --spec-type draft)."""
    if args.model_draft is not None and args.spec_type == "none":
        args.spec_type = "draft"
    if args.spec_type == "draft" and args.model_draft is None:
        raise InfernoError("--spec-type draft needs --model-draft (a smaller model with the same tokenizer)",
                           params=("spec_type",))
    if args.spec_type == "none":
        return {"speculative": 0}
    if not 1 <= args.draft_max <= DRAFT_MAX:
        raise InfernoError(f"--draft-max must be between 1 and {DRAFT_MAX}, got {args.draft_max}",
                           params=("speculative",))
    return {"speculative": args.draft_max, "spec_type": args.spec_type}


def check_flags(args) -> None:
    """Every flag whose range does not depend on the model, checked before anything loads (a
    load takes seconds); --ctx-size against the model's context is load()'s, right after the
    config is read."""
    from inferno.engine import check_ctx_size
    from inferno.sequence import check_max_tokens
    given = {f: getattr(args, f) for f in SAMPLING_FIELDS if getattr(args, f) is not None}
    SamplingParams(**given, seed=args.seed)
    if args.max_tokens is not None:
        check_max_tokens(args.max_tokens)
    check_ctx_size(args.ctx_size)
    if args.stop and not all(args.stop):
        raise InfernoError("--stop takes non-empty text", params=("stop",))
    if hasattr(args, "spec_type"):
        speculative(args)


def load_engine(args, trace: bool = False):
    """Load, then print the load line and the sampling defaults in force (and their source)."""
    from inferno.engine import load
    engine = load(args.model, backend=args.backend, flash=args.flash == "on", trace=trace,
                  cache_type=args.cache_type, ctx_size=args.ctx_size, weights=args.weights,
                  draft=getattr(args, "model_draft", None), **backend_options(args))
    print(f"load: {engine.load_s:.2f} s ({engine.source}, {engine.backend} backend{engine.size_note})",
          file=sys.stderr)
    if engine.draft is not None:
        print(f"draft: {engine.draft.load_s:.2f} s ({engine.draft.source}{engine.draft.size_note})", file=sys.stderr)
    if hasattr(args, "temperature"):  # a command that samples
        given = {f: getattr(args, f) for f in SAMPLING_FIELDS}
        print(f"sampling: {as_flags(engine.sampling.describe(given), SAMPLING_FIELDS)}", file=sys.stderr)
    return engine



def backend_options(args) -> dict:
    """The backend flags as create_backend options (None: not given)."""
    return dict(threads=args.threads, device=args.device, dtype=args.dtype, decode=args.decode,
                prefill=args.prefill, graphs=args.graphs)


def sampling_options(args) -> dict:
    """The generation flags as Engine.stream options (None: the model's default)."""
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                seed=args.seed, stop=tuple(args.stop or ()))


def constraint_options(args) -> dict:
    """--json-schema (a file, or JSON text) and --grammar-file as Engine.stream options; read
    before the model loads, so a missing file is one line at once."""
    out = {}
    if args.json_schema is not None and args.grammar_file is not None:
        raise InfernoError("give --json-schema or --grammar-file, not both", params=("json_schema",))
    if args.json_schema is not None:
        text = args.json_schema
        if not text.lstrip().startswith(("{", "[", "true", "false")):
            text = _read_file(text, "--json-schema")
        try:
            out["json_schema"] = json.loads(text)
        except json.JSONDecodeError as e:
            raise InfernoError(f"--json-schema is not valid JSON ({e}): give a schema file or the "
                               f"schema as JSON text") from None
    if args.grammar_file is not None:
        out["grammar"] = _read_file(args.grammar_file, "--grammar-file")
    return out


def _read_file(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise InfernoError(f"{flag}: cannot read {path!r} ({e.strerror})") from None


def format_stats(r) -> str:
    cut = {"max_tokens": " (stopped at --max-tokens)", "stop": " (stopped at a --stop string)",
           "context": " (stopped at the end of the context: raise --ctx-size for more)"}.get(r.cut_by, "")
    return "\n".join([
        f"prefill: {r.prompt_tokens} prompt tokens, time to first token {r.ttft_s * 1e3:.1f} ms, "
        f"{r.prefill_tokens_per_s:.1f} tokens/s",
        f"decode: {r.generated_tokens} tokens, {r.decode_tokens_per_s:.1f} tokens/s{cut}"
        + (f", {r.accepted_tokens} of {r.drafted_tokens} drafted tokens accepted" if r.drafted_tokens else ""),
        f"memory: peak {r.peak_memory_bytes / 2**20:.0f} MiB",
    ])


def read_prompt(text: str) -> str:
    """The --prompt value; `-` reads stdin, dropping one trailing newline as a shell's $(...)
    does (`echo hi | inferno generate -p -` is the prompt "hi")."""
    if text != "-":
        return text
    text = sys.stdin.read()
    return text[:-1] if text.endswith("\n") else text


def cmd_generate(args) -> int:
    from inferno.chat import Shown, answer
    from inferno.engine import EMPTY_PROMPT
    check_flags(args)
    prompt = read_prompt(args.prompt)
    if not prompt.strip():  # the same rule with or without --raw, and before the load
        raise InfernoError(EMPTY_PROMPT)
    if args.raw and args.reasoning_effort is not None:
        raise InfernoError("--reasoning-effort needs the chat template: leave out --raw")
    constraint_options(args)  # a missing file or bad JSON, before the load
    engine = load_engine(args, trace=args.trace)
    try:
        if not args.raw and not engine.tokenizer.chat_template:
            # A base model: there is no chat to format, so the text is continued as it is.
            print("note: this model has no chat template (a base model?): the prompt is continued "
                  "as raw text, as --raw does", file=sys.stderr)
        try:
            stream = engine.stream(prompt, system=args.system, think=not args.no_think, raw=args.raw,
                                   reasoning_effort=args.reasoning_effort, **speculative(args),
                                   **constraint_options(args), **sampling_options(args))
        except InfernoError as e:  # a schema or grammar the library refused: name the flag
            flag = {("grammar",): "--grammar-file", ("json_schema",): "--json-schema"}.get(e.params)
            if flag is None:
                raise
            raise InfernoError(f"{flag}: {str(e).split(': ', 1)[-1]}") from None
        constrained = args.json_schema is not None or args.grammar_file is not None
        if args.json:
            for _ in stream:
                pass
            # What produced it, so that a saved result says so: model, backend, weights, sampling.
            settings = {"model": str(engine.source), "backend": engine.backend,
                        "weight_type": engine.weight_type, "cache_type": engine.cache_type,
                        "sampling": {**_sampling_in_force(engine, args), "seed": args.seed,
                                     "max_tokens": args.max_tokens}}
            text, reasoning = answer(stream)
            reasoning = {"reasoning": reasoning} if reasoning is not None else {}
            print(json.dumps({"text": text, **reasoning, **settings, **_stats_dict(stream.result)},
                             ensure_ascii=False))
        elif constrained and not sys.stdout.isatty():
            # A program reads this: the reply goes out whole, or not at all when it is cut.
            for _ in stream:
                pass
            if stream.result.cut_by is None:
                print(answer(stream)[0], flush=True)
        else:  # a reasoning model's reasoning (gpt-oss's, a think block) goes to stderr, its answer to stdout
            shown = Shown(sys.stdout, stream.harmony, think=stream.think, thoughts=sys.stderr,
                          hide_reasoning=args.hide_reasoning)
            try:
                for piece in stream:
                    shown.feed(piece)
                shown.finish()
            finally:
                shown.stop()
            sys.stdout.write("\n")
            sys.stdout.flush()
        print(format_stats(stream.result), file=sys.stderr)
        if args.trace:
            print(engine.ops.format_histogram(), file=sys.stderr)
        if constrained and stream.result.cut_by is not None:
            what = "JSON" if args.json_schema is not None else "reply the grammar asks for"
            print(f"error: the {what} is incomplete: the reply was cut at {stream.result.generated_tokens} "
                  f"tokens ({CUT[stream.result.cut_by]}) before it ended", file=sys.stderr)
            return 1
    finally:
        engine.close()
    return 0


CUT = {"max_tokens": "by --max-tokens: raise it and ask again",
       "context": "by the end of the context: raise --ctx-size", "stop": "by a --stop string"}


def cmd_chat(args) -> int:
    from inferno.chat import run_chat
    check_flags(args)
    engine = load_engine(args)
    try:
        return run_chat(engine, system=args.system, think=not args.no_think, verbose=args.verbose,
                        format_stats=format_stats, hide_reasoning=args.hide_reasoning,
                        reasoning_effort=args.reasoning_effort, **speculative(args), **sampling_options(args))
    finally:
        engine.close()


def cmd_serve(args) -> int:
    import os

    from inferno.engine import check_ctx_size
    from inferno.loading.resolve import resolve
    try:
        from inferno.serve.app import ServerConfig
    except ImportError as e:
        raise InfernoError(f"inferno serve needs FastAPI and uvicorn: pip install -e '.[serve]' in "
                           f"inferno's folder ({e})") from None
    check_ctx_size(args.ctx_size)
    if args.pooling == "none":
        raise InfernoError("--pooling none gives a vector per token, which /v1/embeddings has no shape for: "
                           "serve with last, mean or cls (`inferno embed --pooling none` prints them)")
    resolve(args.model)  # a bad name fails here, in one line, before a port is bound
    if args.model_draft is not None:
        resolve(args.model_draft)
    config = ServerConfig(model=args.model, backend=args.backend,
                          backend_options=tuple(backend_options(args).items()),
                          flash=args.flash == "on", cache_type=args.cache_type, weights=args.weights,
                          parallel=args.parallel, ctx_size=args.ctx_size,
                          queue_limit=args.queue_limit, chunk=args.prefill_chunk,
                          api_key=args.api_key or os.environ.get("INFERNO_API_KEY") or None,
                          model_id=args.alias, model_draft=args.model_draft, embeddings=args.embeddings,
                          pooling=args.pooling, reasoning_format=args.reasoning_format, **speculative(args))
    if args.ray:
        from inferno.serve.ray_app import run
        return run(config, host=args.host, port=args.port, replicas=args.replicas, address=args.ray_address,
                   router=args.router)
    from inferno.serve.server import run
    return run(config, host=args.host, port=args.port, drain_timeout=args.drain_timeout,
               log_level=args.log_level)


def cmd_embed(args) -> int:
    import time
    texts = [line for t in args.text for line in (sys.stdin.read().splitlines() if t == "-" else [t])]
    if not texts:
        raise InfernoError("embed: no text given (stdin was empty)")
    engine = load_engine(args)
    try:
        if engine.embedding_note:
            print(f"note: {engine.embedding_note}", file=sys.stderr)
        t0 = time.perf_counter()
        prompts = engine.embed_ids(texts)  # (tokenized once: embed takes the ids as they are)
        vectors = engine.embed(prompts, pooling=args.pooling, normalize=not args.no_normalize,
                               dimensions=args.dimensions, ctx_size=args.ctx_size)
        seconds = time.perf_counter() - t0
        for v in vectors:
            print(json.dumps(v.tolist()))
        tokens = sum(map(len, prompts))
        print(f"embed: {len(texts)} texts, {tokens} tokens in {seconds * 1e3:.1f} ms, "
              f"{tokens / seconds:.1f} tokens/s ({engine.embedder(args.pooling).pooling} pooling, "
              f"{vectors[0].shape[-1]} values each)", file=sys.stderr)
    finally:
        engine.close()
    return 0


def cmd_warmup(args) -> int:
    """A load, which compiles (or finds cached) every kernel a generation, a long context, a
    batched step or a chat's next turn takes on this backend, then nothing else."""
    import time

    from inferno.engine import load
    os.environ["INFERNO_COMPILE_AHEAD"] = "0"  # every path compiled here, not left to a helper
    t0 = time.perf_counter()
    engine = load(args.model, backend=args.backend, flash=args.flash == "on", cache_type=args.cache_type,
                  weights=args.weights, **backend_options(args))
    try:
        print(f"warmup: {engine.source} on {engine.backend}: ready in {time.perf_counter() - t0:.1f} s; "
              f"its kernels are cached for every later load", file=sys.stderr)
    finally:
        engine.close()
    return 0


def cmd_pull(args) -> int:
    from inferno.loading.resolve import pull
    print(pull(args.name))
    return 0


def cmd_list(args) -> int:
    from inferno.loading.resolve import cache_dir, list_models
    rows = [("NAME", "SOURCE", "SIZE", "WHERE")]
    for m in list_models():
        rows.append((m["name"] + (" *" if m["default"] else ""), m["origin"],
                     f"{m['size'] / 2**20:.0f} MiB" if m["path"] else "-",
                     str(m["path"]) if m["path"] else f"not fetched: inferno pull {m['name']}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for name, origin, size, where in rows:
        print(f"{name:<{widths[0]}}  {origin:<{widths[1]}}  {size:>{widths[2]}}  {where}")
    print(f"(* the default model; inferno's cache: {cache_dir()}, set INFERNO_CACHE to move it)")
    return 0


def cmd_bench(args) -> int:
    from inferno import bench
    rows = bench.run(args.model, bench.parse_names(getattr(args, "backend", ["cpu,simd,pool"])),
                     flash=bench.parse_flash(args.flash), n_prompts=bench.parse_sizes(args.n_prompt, "-p"),
                     n_gens=bench.parse_sizes(args.n_gen, "-n"), reps=args.repetitions, seed=args.seed,
                     backend_options=backend_options(args),
                     load_options=dict(cache_type=args.cache_type, weights=args.weights),
                     depth=args.depth)
    print(bench.to_json(rows) if args.json else bench.format_table(rows))
    return 0


def _sampling_in_force(engine, args) -> dict:
    """Each sampling setting's value in force: the flag's, else the model's default."""
    given = {f: getattr(args, f) for f in SAMPLING_FIELDS if getattr(args, f) is not None}
    return {**engine.sampling.values, **given}


def _stats_dict(r) -> dict:
    d = r.to_dict()
    d.pop("text")
    return d


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `inferno`: what it can do
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except InfernoError as e:
        print(f"inferno: error: {e.for_cli()}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
