"""Build src/vllm_doctor/data/models/transformers_releases.json: the first transformers release whose AutoConfig
knows each model type (`CONFIG_MAPPING_NAMES` in transformers/models/auto/configuration_auto.py), and the
transformers range each vLLM release requires (its wheel's `Requires-Dist: transformers…`). Read by the
transformers-too-old remedy: "model type X needs transformers >= V; this vLLM allows only …".

usage: python3 tools/build_model_types.py WHEELDIR [VLLM_REPORT.json...]
  WHEELDIR: transformers wheels (transformers-V-py3-none-any.whl), at least the first and last release of each
            minor; a type first seen in a minor's last patch but not its first is dated from the patches present.
  VLLM_REPORT.json: `pip install --dry-run --no-deps --report F vllm==V` outputs (the metadata only).
"""
from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src/vllm_doctor/data/models/transformers_releases.json"
MAPPING = re.compile(r"^CONFIG_MAPPING_NAMES\s*=.*?^\)", re.M | re.S)
PAIR = re.compile(r"""\(\s*["']([a-z0-9_\-]+)["']\s*,\s*["'][A-Za-z0-9_]+Config["']\s*\)""")


def version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.+]|post|rc", v))


def model_types(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        text = z.read("transformers/models/auto/configuration_auto.py").decode()
    block = MAPPING.search(text)
    if not block:
        raise SystemExit(f"{wheel.name}: no CONFIG_MAPPING_NAMES block")
    return set(PAIR.findall(block.group(0)))


def main(wheel_dir: str, reports: list[str]) -> int:
    wheels = {w.name.split("-")[1]: w for w in Path(wheel_dir).glob("transformers-*-py3-none-any.whl")}
    versions = sorted(wheels, key=version_key)
    first: dict[str, str] = {}
    for v in versions:
        for t in model_types(wheels[v]):
            first.setdefault(t, v)
    vllm: dict[str, str] = {}
    for r in reports:
        try:
            meta = json.loads(Path(r).read_text())["install"][0]["metadata"]
        except (OSError, ValueError, KeyError, IndexError):
            continue
        spec = [d for d in meta.get("requires_dist", []) if re.match(r"transformers\b", d)]
        if spec:
            vllm[meta["version"]] = re.sub(r"^transformers\s*", "", spec[0].split(";")[0]).strip()
    # a type in the oldest release read is dated "at most" that release (older ones were not read)
    OUT.write_text(json.dumps({
        "_source": (f"CONFIG_MAPPING_NAMES of {len(versions)} transformers releases, {versions[0]} to {versions[-1]}; "
                    f"Requires-Dist of {len(vllm)} vLLM releases"),
        "oldest_read": versions[0], "newest_read": versions[-1], "releases_read": versions,
        "model_types": dict(sorted(first.items())),
        "vllm_requires": dict(sorted(vllm.items(), key=lambda kv: version_key(kv[0]))),
    }, indent=0) + "\n")
    print(f"{len(first)} model types from {len(versions)} releases, {len(vllm)} vLLM pins -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
