"""`vllm-doctor check [--] CMD`: parse, predict (checks/preflight.py), report."""
from __future__ import annotations

import argparse
import shlex
import sys

from vllm_doctor.checks.preflight import PreflightError, exit_code, predict
from vllm_doctor.cli.common import add_common, check_ignore, command_parser, fail, internal_error, load_rules
from vllm_doctor.diagnosis.ignore import drop_ignored
from vllm_doctor.numbers import finite_float
from vllm_doctor.reports.emit import emit


_VALUED = {"--format", "--cmd", "--model", "--facts", "--vllm-version", "--rules-dir", "--report", "--ignore"}


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our options, the launch command): everything after `--`, else from the first non-option token."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in _VALUED:
            i += 2
            continue
        if tok.startswith("-"):
            i += 1
            continue
        return argv[:i], argv[i:]
    return argv, []


def _parser() -> argparse.ArgumentParser:
    p = command_parser(
        "check", "Predict the start-up failures of a vLLM launch command on this machine (or on a --facts "
                 "snapshot) without starting vLLM, with the corrected command. Exit 0: none predicted, 1: "
                 "failures predicted, 2: usage error, 3: could not check (the model's config or the GPUs "
                 "unknown: the checks that matter did not run).",
        ["vllm-doctor check -- vllm serve lmsys/vicuna-13b-v1.5 -tp 3",
         "vllm-doctor check --vllm-version 0.8.5 -- vllm serve MODEL -tp 2 --max-model-len 32768",
         "vllm-doctor check --facts gpus.json --cmd \"docker run --gpus all vllm/vllm-openai --model m -tp 2\"",
         "vllm-doctor check --gpus 4 --gpu-memory 24 -- vllm serve meta-llama/Llama-3.1-70B-Instruct -tp 4"],
        usage="vllm-doctor check [options] [--] vllm serve MODEL [flags…]")
    add_common(p, "check")
    p.add_argument("--vllm-version", metavar="X.Y.Z", help="check flags against this vLLM release "
                                                          "(default: the installed one, else the latest)")
    p.add_argument("--gpus", type=int, metavar="N", help="check for N GPUs of --gpu-memory GiB each (the target "
                                                         "machine, when it is not this one and no snapshot is at hand)")
    p.add_argument("--gpu-memory", type=finite_float, metavar="GiB", help="memory per GPU in GiB, with --gpus")
    return p


def cmd_check(argv: list[str]) -> int:
    from vllm_doctor.rules.catalog import CatalogError

    ours, tokens = split_argv(list(argv))
    args = _parser().parse_args(ours)
    if tokens and args.cmd:
        return fail("give the command either after `--` or with --cmd, not both")
    text = args.cmd or (tokens[0] if len(tokens) == 1 else shlex.join(tokens))
    try:
        catalog = load_rules(args.rules_dir)
        if (error := check_ignore(args, catalog)) is not None:
            return fail(error)
        diagnosis = predict(text, catalog, model=args.model, snapshot=args.facts, live=not args.no_live,
                            online=args.online, vllm_version=args.vllm_version,
                            given_gpus=(args.gpus, args.gpu_memory))
    except (PreflightError, CatalogError) as exc:
        return fail(str(exc))
    except Exception as exc:  # snapshot errors and the like: one line, never a traceback
        return internal_error(exc)
    emit(drop_ignored(diagnosis, args.ignored_rules), args)
    return exit_code(diagnosis)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cmd_check(sys.argv[1:]))
