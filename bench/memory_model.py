"""The memory model against real start-ups: error per family on the held-out third, next to a naive
weights + KV calculator, and a refit of the coefficients on the calibration two thirds.

    python3 bench/memory_model.py            # the error tables (held-out third; --all for every case)
    python3 bench/memory_model.py --fit      # refit Calibration on the calibration cases, print it
    python3 bench/memory_model.py --markdown > docs/memory-model.md

Cases: tests/data/memory_cases/*.toml, one real start-up each (source URL, the launch, the model's
config.json, vLLM's printed figures). The split is fixed by the file name (sha1 % 3 == 0: held out), so
adding a case never moves an old one between the sets.
"""
from __future__ import annotations

import argparse
import re
import hashlib
import statistics
import sys
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from vllm_doctor.facts import Facts  # noqa: E402
from vllm_doctor.facts.model_config import normalise  # noqa: E402
from vllm_doctor.vllm_math import budget  # noqa: E402
from vllm_doctor.vllm_math.sizing import LoadArgs, Sizing  # noqa: E402
from vllm_doctor.facts.shape import ModelShape  # noqa: E402

CASES = ROOT / "tests" / "data" / "memory_cases"
FAMILIES = ("dense", "gqa", "mla", "moe", "hybrid", "quantized")
# GPU names -> total memory in GiB as torch reports it (mem_get_info total), for cases that give only the name
GPU_TOTAL_GIB = {"H100 80GB": 79.19, "H100-SXM": 79.19, "H100 PCIe": 79.19, "H100 NVL": 93.1, "H200": 139.8,
                 "A100-SXM4-80GB": 79.15, "A100 80GB": 79.15, "A100-PCIE-80GB": 79.15, "A100-SXM4-40GB": 39.39,
                 "A100-PCIE-40GB": 39.39, "L40S": 44.39, "L40": 44.39, "A6000": 47.43, "RTX 6000 Ada": 47.5,
                 "RTX 4090": 23.64, "RTX 3090": 23.69, "A10G": 22.09, "A10": 22.09, "L4": 22.05, "T4": 14.58,
                 "V100-SXM2-32GB": 31.74, "V100-SXM2-16GB": 15.77, "V100-PCIE-32GB": 31.74, "RTX 5090": 31.36,
                 "B200": 178.35, "GH200": 94.5, "MI300X": 191.98, "A40": 44.35, "RTX A5000": 23.68, "A800": 79.15}


@dataclass
class Case:
    name: str
    family: str
    sizing: Sizing
    launch: budget.Launch
    observed_kv_gib: float | None
    observed_tokens: int | None
    observed_weights_gib: float | None
    observed_activation_gib: float | None
    observed_non_torch_gib: float | None
    observed_graph_gib: float | None
    source: str

    @property
    def held_out(self) -> bool:
        return int(hashlib.sha1(self.name.encode()).hexdigest(), 16) % 3 == 0


def _total_gib(doc: dict) -> float | None:
    obs = doc.get("observed", {})
    if obs.get("total_gpu_gib"):
        return float(obs["total_gpu_gib"])
    plain = lambda t: " ".join(t.lower().replace("-", " ").replace("_", " ").split())  # noqa: E731
    name = plain(str(doc.get("gpu", "")))
    for key in sorted(GPU_TOTAL_GIB, key=len, reverse=True):
        if re.search(rf"\b{re.escape(plain(key))}\b", name):       # "A10" is not "A100"
            return GPU_TOTAL_GIB[key]
    return None


def _version(text) -> str | None:
    """"0.6.4-era v0", "dev build (~v0.2.4)", "0.13.0+nv26.01" -> the release number; None when absent."""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", str(text or ""))
    return m.group(1) if m else None


def _num(value) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(str(value).replace(",", ""))
    except ValueError:
        return None


def config_for(doc: dict) -> dict:
    """The case's [config], else a real config.json copy in configs/ named after the model id (or the
    case's `config_file`)."""
    cfg = {k: v for k, v in (doc.get("config") or {}).items() if k not in ("config_source", "log")}
    if normalise(cfg).get("model.num_layers"):
        return cfg
    model = str(doc.get("model", "")).strip().rstrip("/")
    names = [doc.get("config_file"), model.lower().replace("/", "--"), model.split("/")[-1].lower()]
    for name in filter(None, names):
        for path in (CASES / "configs").glob(f"*{name}.json" if "--" not in name else f"{name}.json"):
            import json
            loaded = json.loads(path.read_text(encoding="utf-8"))
            return {k: v for k, v in loaded.items() if not k.startswith("_")}
    return cfg


def load_case(path: Path) -> Case | None:
    """A case, or None when it lacks what a prediction needs (a config, the GPU's size, a figure)."""
    doc = tomllib.loads(path.read_text(encoding="utf-8"))
    cfg = config_for(doc)
    if not normalise(cfg).get("model.num_layers"):          # text_config of a multimodal model counts
        return None
    total = _total_gib(doc)
    obs = doc.get("observed", {})
    tokens = _num(obs.get("kv_tokens"))
    blocks = _num(obs.get("gpu_blocks"))
    block = int(doc.get("block_size") or 16)
    if tokens is None and blocks is not None:
        tokens = blocks * block
    kv = _num(obs.get("available_kv_gib")) or _num(obs.get("kv_cache_gib"))
    if total is None or (tokens is None and kv is None):
        return None
    facts = Facts()
    for key, value in normalise(cfg).items():
        facts.set(key, value, "case")
    args = LoadArgs(doc.get("dtype"), doc.get("kv_cache_dtype"), doc.get("quantization"))
    sizing = Sizing(ModelShape.from_facts(facts), args)
    loading = _num(obs.get("model_loading_gib")) or _num(obs.get("weights_gib"))
    launch = budget.Launch(
        total_gib=total, tp=int(doc.get("tp") or 1), pp=int(doc.get("pp") or 1),
        utilization=_num(doc.get("gpu_memory_utilization")) or _num(obs.get("gpu_memory_utilization")),
        version=_version(doc.get("vllm_version")),
        max_model_len=int(doc["max_model_len"]) if doc.get("max_model_len") else None,
        max_num_seqs=int(doc["max_num_seqs"]) if doc.get("max_num_seqs") else None,
        max_num_batched_tokens=int(doc["max_num_batched_tokens"]) if doc.get("max_num_batched_tokens") else None,
        enforce_eager=bool(doc.get("enforce_eager", False)), block_size=block)
    return Case(path.stem, str(doc.get("family", "dense")), sizing, launch, kv, int(tokens) if tokens else None,
                loading, _num(obs.get("activation_peak_gib")), _num(obs.get("non_torch_gib")),
                _num(obs.get("cuda_graph_gib")), str(doc.get("source", "")))


def load_cases(folder: Path = CASES) -> tuple[list[Case], list[str]]:
    cases, skipped = [], []
    for path in sorted(folder.glob("*.toml")):
        case = load_case(path)
        (cases.append(case) if case else skipped.append(path.stem))
    return cases, skipped


def errors(case: Case, cal: budget.Calibration = budget.CALIBRATION, *, naive: bool = False,
           weights_known: bool = False) -> tuple[float | None, float | None]:
    """(relative error of KV tokens, of KV GiB): (predicted - observed) / observed."""
    launch = replace(case.launch, weights_gib=case.observed_weights_gib) if weights_known else case.launch
    p = budget.naive(case.sizing, launch) if naive else budget.predict(case.sizing, launch, cal)
    if p is None:
        return None, None
    tok = (p.kv_tokens - case.observed_tokens) / case.observed_tokens if case.observed_tokens else None
    gib = (p.kv_gib - case.observed_kv_gib) / case.observed_kv_gib if case.observed_kv_gib else None
    return tok, gib


def table(cases: list[Case], cal: budget.Calibration = budget.CALIBRATION, weights_known: bool = False) -> list[tuple]:
    """Rows (family, n, model median |err|, model worst, naive median, naive worst) of the token error."""
    rows = []
    groups = [(f, [c for c in cases if c.family == f]) for f in FAMILIES] + [("all", cases)]
    for family, group in groups:
        if weights_known:
            group = [c for c in group if c.observed_weights_gib is not None]
        ours = [abs(e) for c in group if (e := errors(c, cal, weights_known=weights_known)[0]) is not None]
        base = [abs(e) for c in group if (e := errors(c, naive=True, weights_known=weights_known)[0]) is not None]
        if ours:
            rows.append((family, len(ours), statistics.median(ours), max(ours),
                         statistics.median(base) if base else None, max(base) if base else None))
    return rows


def print_table(title: str, rows: list[tuple]) -> None:
    print(title)
    print(f"  {'family':<10} {'n':>3}  {'model median':>12} {'worst':>8}   {'naive median':>12} {'worst':>8}")
    for family, n, med, worst, bmed, bworst in rows:
        b = f"{bmed:>12.1%} {bworst:>8.1%}" if bmed is not None else f"{'-':>12} {'-':>8}"
        print(f"  {family:<10} {n:>3}  {med:>12.1%} {worst:>8.1%}   {b}")


def markdown(cases: list[Case], cal: budget.Calibration = budget.CALIBRATION) -> str:
    """docs/memory-model.md: the held-out tables, as tests/test_memory_model.py keeps them."""
    held = [c for c in cases if c.held_out]
    out = ["# The memory model's error", "",
           "Generated by `python3 bench/memory_model.py --markdown` (tests/test_memory_model.py keeps it so). "
           "KV-cache tokens as vLLM reports them (\"GPU KV cache size\"), predicted before launch, against "
           f"{len(held)} real start-ups held out of calibration (of {len(cases)}; the split is fixed by each case's "
           "file name). *naive* is the public calculators' arithmetic: weights = parameters x bytes / TP, "
           "KV = utilization x total - weights, every layer's KV per token.", ""]
    for title, known in (("Weights from config.json (what `check` and `plan` know before a download)", False),
                         ("Weights known (vLLM's 'Model loading took', as the safetensors headers give them)", True)):
        out += [f"## {title}", "", "| family | cases | median | worst | naive median | naive worst |",
                "|---|---:|---:|---:|---:|---:|"]
        for family, n, med, worst, bmed, bworst in table(held, cal, weights_known=known):
            naive = f"{bmed:.1%} | {bworst:.1%}" if bmed is not None else "- | -"
            out.append(f"| {family} | {n} | {med:.1%} | {worst:.1%} | {naive} |")
        out.append("")
    out += ["Cases: `tests/data/memory_cases/*.toml`, each with its source; `python3 bench/memory_model.py --cases` "
            "prints one line per case.", ""]
    return "\n".join(out)


def _features(c: Case) -> tuple[float, float, float]:
    """(1, T x hidden x dtype, min(S, T) x vocab x 4) in GiB: the activation terms of budget.predict."""
    s = c.sizing.shape
    tokens = c.launch.max_num_batched_tokens or budget.default_batched_tokens(c.launch.version, c.launch.max_model_len)
    seqs = c.launch.max_num_seqs or budget.default_max_num_seqs(c.launch.version)
    dtype_b = budget.mm.dtype_bytes(c.sizing.load_dtype())
    return 1.0, tokens * s.hidden * dtype_b / budget.GIB, min(seqs, tokens) * (s.vocab or 32000) * 4 / budget.GIB


def fit(cases: list[Case]) -> budget.Calibration:
    """The coefficients from the calibration cases' own breakdowns: the activation terms by least squares on
    vLLM's "torch peak memory increase" / "activation peak", non-torch memory as the median for one GPU and
    the median extra with tensor parallel."""
    import numpy as np

    # V0 (< 0.8) profiles whole sequences, a peak this model does not describe (predict says so, low
    # confidence): its rows would only drag the V1 terms
    rows = [(c, _features(c)) for c in cases if c.observed_activation_gib is not None and c.launch.pp == 1
            and not (c.launch.version and not budget.at_least(c.launch.version, "0.8.0"))]
    cal = budget.CALIBRATION
    if len(rows) >= 4:
        x = np.array([f for _, f in rows])
        y = np.array([c.observed_activation_gib for c, _ in rows])
        (a0, a_tok, a_logit), *_ = np.linalg.lstsq(x, y, rcond=None)
        cal = replace(cal, a0_gib=round(max(0.0, float(a0)), 3), a_tok=round(max(0.0, float(a_tok)), 3),
                      a_logit=round(max(0.0, float(a_logit)), 3))
    one = [c.observed_non_torch_gib for c in cases if c.observed_non_torch_gib is not None and c.launch.tp == 1
           and c.launch.pp == 1]
    many = [c.observed_non_torch_gib for c in cases if c.observed_non_torch_gib is not None and c.launch.tp > 1]
    if one:
        cal = replace(cal, non_torch_gib=round(statistics.median(one), 3))
    if many:
        cal = replace(cal, non_torch_tp_gib=round(statistics.median(many) - cal.non_torch_gib, 3))
    graphs = [(budget.mm.layers_per_stage(c.sizing.shape.layers, c.launch.pp), c.observed_graph_gib) for c in cases
              if c.observed_graph_gib is not None and not c.launch.enforce_eager]
    if len(graphs) >= 4:        # "Graph capturing finished in N secs, took X GiB": base + per layer of the stage
        x = np.array([(1.0, layers) for layers, _ in graphs])
        (base, per_layer), *_ = np.linalg.lstsq(x, np.array([g for _, g in graphs]), rcond=None)
        cal = replace(cal, graph_gib=round(max(0.0, float(base)), 3), graph_gib_per_layer=round(max(0.0, float(per_layer)), 4))
    return cal


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the coefficients on the calibration cases")
    ap.add_argument("--all", action="store_true", help="also the table over every case")
    ap.add_argument("--cases", action="store_true", help="one line per case")
    ap.add_argument("--markdown", action="store_true", help="print docs/memory-model.md")
    args = ap.parse_args()
    cases, skipped = load_cases()
    if args.markdown:
        print(markdown(cases), end="")
        return 0
    calib = [c for c in cases if not c.held_out]
    held = [c for c in cases if c.held_out]
    print(f"{len(cases)} usable cases ({len(calib)} calibration, {len(held)} held out); "
          f"{len(skipped)} without a config or a figure: {', '.join(skipped) or '-'}")
    cal = budget.CALIBRATION
    if args.fit:
        cal = fit(calib)
        print(f"fitted: {cal}")
    print_table("KV-cache tokens, |predicted - vLLM's| / vLLM's, held-out third, weights from config.json:",
                table(held, cal))
    print_table("the same, weights known (vLLM's 'Model loading took', as safetensors headers give them):",
                table(held, cal, weights_known=True))
    graphs = [abs(p.cuda_graph_gib - c.observed_graph_gib) for c in held if c.observed_graph_gib is not None
              and (p := budget.predict(c.sizing, replace(c.launch, version="0.20.0"), cal)) is not None]
    if graphs:
        print(f"CUDA-graph memory (counted from 0.20.0), held out: median |error| {statistics.median(graphs):.2f} GiB, "
              f"worst {max(graphs):.2f} GiB over {len(graphs)} cases")
    if args.all:
        print_table("calibration two thirds:", table(calib, cal))
    if args.cases:
        pct = lambda x: "-" if x is None else f"{x:+.1%}"  # noqa: E731
        for c in cases:
            tok, gib = errors(c, cal)
            ntok, _ = errors(c, naive=True)
            p = budget.predict(c.sizing, c.launch, cal)
            print(f"  {'H' if c.held_out else 'C'} {c.name:<44} {c.family:<9} tokens {pct(tok):>7}  GiB {pct(gib):>7}"
                  f"  naive {pct(ntok):>7}  predicted {p.kv_tokens if p else '-'} vLLM {c.observed_tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
