"""Properties over generated input (hypothesis, derandomized: the same examples on every run).

* any text or bytes is a Line (sources/lines.py), and the message is what is left of the raw text;
* traceback assembly (events/tracebacks.py) over any sequence of real traceback fragments, other
  processes' lines and noise never raises and ends with nothing open;
* launch commands built from vLLM's real flags (src/vllm_doctor/data/flags) render back unchanged, and an
  edited command parses back to the same text with the edit in place (parse -> render -> parse is stable);
* the whole pipeline (scan, diagnose, report in every format) over real log lines with generated lines
  inserted never raises, and its JSON is strict.
"""
from __future__ import annotations

import io
import json
import shlex
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from vllm_doctor.command import Command
from vllm_doctor.command import flags as F
from vllm_doctor.command.edits import RemoveFlag, SetEnv, SetFlag
from vllm_doctor.events.tracebacks import TracebackAssembler
from vllm_doctor.sources.lines import parse_line

PROFILE = dict(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CORPUS = ROOT / "logs_corpus"


def _corpus_lines(want) -> list[str]:
    """Lines of the real logs (logs_corpus/real, real032) that `want` picks, deduplicated, in file order."""
    out: dict[str, None] = {}
    for path in sorted([*(CORPUS / "real").rglob("*.log"), *(CORPUS / "real032").rglob("*.log")]):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if want(line):
                out.setdefault(line)
    return list(out)


# Real traceback pieces: the header, frames, code lines, chain markers and exception lines as vLLM's
# processes printed them (with their prefixes) in the public threads the corpus was copied from.
TB_LINES = _corpus_lines(lambda s: any(k in s for k in ("Traceback (most recent", 'File "', "Error: ", "Error(",
                                                          "The above exception", "During handling", "    ")))[:600]
REAL_LINES = _corpus_lines(lambda s: bool(s.strip()))[::7][:800]
# Wrappers real vLLM lines carry (sources/lines.py docstring), to glue in front of generated text.
PREFIXES = ["", "(APIServer pid=30416) ", "(EngineCore_DP0 pid=4242) ", "(VllmWorker rank=1 pid=77) ",
            "(RayWorkerWrapper pid=3223, ip=10.0.0.2) ", "[rank0]: ", "[rank1]:", "vllm-1  | ",
            "INFO 12-01 00:31:25 [model.py:733] ", "ERROR 05-12 10:11:12 llm_engine.py:98] ",
            "[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] ", "\x1b[1;36m(APIServer pid=1)\x1b[0;0m "]
DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=6000)     # past int()'s 4300-digit limit too


def _wrapped(text_strategy):
    """`text` with up to three real prefixes before it (some made with a huge number inside)."""
    huge = DIGITS.map(lambda d: f"(EngineCore_DP0 pid={d}) ") | DIGITS.map(lambda d: f"[rank{d}]: ")
    prefix = st.sampled_from(PREFIXES) | huge
    return st.tuples(st.lists(prefix, max_size=3), text_strategy).map(lambda t: "".join(t[0]) + t[1])


# ------------------------------------------------------------------------------------------ lines

@settings(max_examples=300, **PROFILE)
@given(st.one_of(st.text(), st.binary(), _wrapped(st.text()), _wrapped(st.sampled_from(TB_LINES))))
def test_any_text_is_a_line(data):
    line = parse_line(data, "x.log", 7)
    assert isinstance(line.raw, str) and isinstance(line.message, str)
    assert "\n" not in line.raw[-1:]
    assert line.message in line.raw or line.raw.endswith("across cluster]")
    for number in (line.pid, line.rank):
        assert number is None or isinstance(number, int)


# ------------------------------------------------------------------------------------------ tracebacks

@settings(max_examples=120, **PROFILE)
@given(st.lists(_wrapped(st.sampled_from(TB_LINES)) | st.sampled_from(REAL_LINES) | st.text(max_size=80),
                max_size=120))
def test_traceback_assembly_takes_any_sequence(lines):
    assembler = TracebackAssembler()
    parsed = [parse_line(text, "x.log", n + 1) for n, text in enumerate(lines)]
    for line in parsed:
        assembler.feed(line)
    assembler.close()
    assert not assembler.busy
    fed = {id(line) for line in parsed}
    for tb in assembler.finished:
        assert id(tb.start) in fed
        assert len(tb.frames) <= len(parsed)


# ------------------------------------------------------------------------------------------ commands

def _head_flags() -> list[str]:
    """Long options vLLM's parser has at HEAD, without --model (the model is positional in these shapes)
    and without the negations (--no-X / --disable-X of a known switch: a pair would cancel out)."""
    known = F.known_flags(None)
    out = []
    for flag in sorted(known):
        if not flag.startswith("--") or flag in ("--model", "--help"):
            continue
        if F._negation_base(flag) is not None or F.negation(flag) is not None:
            continue
        out.append(flag)
    return out


FLAGS = _head_flags()
ALIASES = {long_: short for short, long_ in F._k()["aliases"].items() if long_ in FLAGS and not short.startswith("-O")}
VALUE = st.one_of(st.integers(0, 1 << 20).map(str), st.sampled_from(["0.85", "auto", "bfloat16", "/models/m", "8192"]),
                  st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._/:,={}\"' ", min_size=1, max_size=12)
                  .filter(lambda v: v.strip() and not v.startswith("-")))


@st.composite
def _arguments(draw) -> list[tuple[str, str, str | None]]:
    """(canonical flag, spelling as written, value or None for a switch): distinct options."""
    chosen = draw(st.lists(st.sampled_from(FLAGS), min_size=1, max_size=8, unique=True))
    out = []
    for flag in chosen:
        spelling = draw(st.sampled_from([flag, ALIASES.get(flag, flag), "--" + flag[2:].replace("-", "_")]))
        if not F.takes_value(flag):
            out.append((flag, spelling, None))
            continue
        choices = F.choices(flag)
        value = draw(st.sampled_from(choices) if choices else VALUE)
        out.append((flag, spelling, value))
    return out


def _argv(args, inline: bool) -> list[str]:
    words = []
    for _, spelling, value in args:
        if value is None:
            words.append(spelling)
        elif inline and spelling.startswith("--"):
            words.append(f"{spelling}={value}")
        else:
            words += [spelling, value]
    return words


SHAPES = {
    "serve": lambda words: "vllm serve /models/m " + shlex.join(words),
    "module": lambda words: "python3 -m vllm.entrypoints.openai.api_server --model /models/m " + shlex.join(words),
    "env": lambda words: "CUDA_VISIBLE_DEVICES=0,1 NCCL_P2P_DISABLE=1 vllm serve m " + shlex.join(words),
    "docker": lambda words: ("docker run --runtime nvidia --gpus all -p 8000:8000 --ipc=host "
                             "vllm/vllm-openai:v0.9.2 m " + shlex.join(words)),
    "continued": lambda words: "vllm serve m \\\n  " + " \\\n  ".join(shlex.quote(w) for w in words) + "\n",
    "compose": lambda words: "command: [" + ", ".join(json.dumps(w) for w in ["--model", "m", *words]) + "]",
}


@settings(max_examples=150, **PROFILE)
@given(st.sampled_from(sorted(SHAPES)), _arguments(), st.booleans())
def test_commands_of_real_flags_round_trip(shape, args, inline):
    text = SHAPES[shape](_argv(args, inline))
    cmd = Command.parse(text)
    assert cmd.render() == text
    assert cmd.apply([]).render() == text
    for flag, _, value in args:
        assert cmd.get(flag) == (True if value is None else value), (flag, text)


@settings(max_examples=150, **PROFILE)
@given(st.sampled_from(sorted(SHAPES)), _arguments(), st.sampled_from(FLAGS), VALUE,
       st.sampled_from(["VLLM_USE_V1", "NCCL_P2P_DISABLE", "CUDA_VISIBLE_DEVICES"]))
def test_an_edited_command_parses_back_to_itself(shape, args, flag, value, env):
    cmd = Command.parse(SHAPES[shape](_argv(args, False)))
    removed = args[0][0]
    set_value = value if F.takes_value(flag) else None
    edits = [SetFlag(flag, set_value)] + ([RemoveFlag(removed)] if removed != flag else []) + [SetEnv(env, "1")]
    edited = cmd.apply(edits).render()
    again = Command.parse(edited)
    assert again.render() == edited
    assert again.apply([]).render() == edited
    assert again.get(flag) == (True if set_value is None else set_value), edited
    if removed != flag:
        assert not again.has(removed), edited
    if shape != "compose":                      # compose: the environment is a note, not in the command
        assert again.env.get(env) == "1", edited


# ------------------------------------------------------------------------------------------ pipeline

BASE_LOG = (CORPUS / "real032" / "r02-tp3-tiny32.log").read_text(encoding="utf-8")
INSERTED = st.one_of(_wrapped(st.text(max_size=200)), _wrapped(st.sampled_from(TB_LINES)),
                     st.sampled_from(REAL_LINES), DIGITS.map(lambda d: f"$ vllm serve /models/m -tp {d}"),
                     st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")))


@settings(max_examples=25, **PROFILE)
@given(st.lists(st.tuples(st.integers(0, 10_000), INSERTED), max_size=12), st.sampled_from(["text", "json", "markdown"]))
def test_the_pipeline_takes_real_lines_with_anything_inserted(catalog, insertions, fmt):
    from vllm_doctor.cli.main import _diagnose_parser
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.reports.emit import emit

    lines = BASE_LOG.splitlines(keepends=True)
    for at, text in insertions:
        lines.insert(at % (len(lines) + 1), text + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "server.log"
        path.write_text("".join(lines), encoding="utf-8", errors="surrogateescape")
        diagnosis = diagnose_paths([str(path)], catalog, Options(live=False))
    out = io.StringIO()
    emit(diagnosis, _diagnose_parser().parse_args(["--no-live", "--no-color", "--format", fmt, "x"]), out)
    if fmt == "json":
        json.loads(out.getvalue(), parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
