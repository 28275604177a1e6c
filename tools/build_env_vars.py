"""Build src/vllm_doctor/data/flags/env_vars.json: every environment variable vLLM's own `vllm/envs.py`
registers (its `environment_variables` dict), with the releases whose envs.py has it (`first..last` of the
releases read). Used where a user passes one of them as a command-line flag (`--cpu-kvcache-space 8`).

usage: python3 tools/build_env_vars.py DIR...   (each DIR a vLLM source tree or wheel, named by its version)
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

NAME = re.compile(r"""^\s{4}["'](VLLM_[A-Z0-9_]+)["']:""", re.M)     # a key of the dict (yapf: ' before 0.9)
OUT = Path(__file__).resolve().parents[1] / "src/vllm_doctor/data/flags/env_vars.json"


def version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.+]|post", v))


def main(dirs: list[str]) -> int:
    seen: dict[str, list[str]] = {}
    versions = sorted((Path(d).name for d in dirs), key=version_key)
    for d in sorted(dirs, key=lambda d: version_key(Path(d).name)):
        text = (Path(d) / "vllm" / "envs.py").read_text()
        for name in set(NAME.findall(text)):
            seen.setdefault(name, []).append(Path(d).name)
    # no lower bound where the oldest release read has it (older ones were not read); HEAD where the newest has it
    table = {name: f"{'' if vs[0] == versions[0] else vs[0]}..{'HEAD' if vs[-1] == versions[-1] else vs[-1]}"
             for name, vs in sorted(seen.items())}
    OUT.write_text(json.dumps({"_source": f"vllm/envs.py of {len(versions)} releases, {versions[0]} to {versions[-1]}",
                               "variables": table}, indent=1) + "\n")
    print(f"{len(table)} variables from {len(versions)} releases -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
