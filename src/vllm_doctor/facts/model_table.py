"""The shipped table of popular models' architectures (data/models/architectures.toml): what `check` and
`plan` read when the model's own config.json is nowhere on this machine. Offline, never a guess from the
name: only an id listed in the table (case-insensitive) is answered, with the row's source."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent.parent / "data" / "models" / "architectures.toml"
BYTES_16BIT = 2
NOTICE_MARK = "the shipped table's"   # in the notice that says the numbers came from here (always shown)


@dataclass(frozen=True)
class TableModel:
    ids: tuple[str, ...]
    config: dict[str, Any]             # config.json's fields, as published
    source: str                        # the config.json the numbers were taken from
    parameters: float
    weight_bytes: int                  # the checkpoint's size where quantized, else 2 bytes a parameter
    remote_code: bool = False          # its config.json has an auto_map transformers has no native class for


@lru_cache(maxsize=1)
def _rows() -> dict[str, TableModel]:
    import tomllib

    rows: dict[str, TableModel] = {}
    for entry in tomllib.loads(TABLE.read_text(encoding="utf-8"))["model"]:
        parameters = float(entry["parameters"])
        model = TableModel(tuple(entry["ids"]), dict(entry["config"]), entry["source"], parameters,
                           int(entry.get("weight_bytes") or parameters * BYTES_16BIT), bool(entry.get("remote_code")))
        for model_id in model.ids:
            rows[model_id.lower()] = model
    return rows


def lookup(model: str) -> TableModel | None:
    """The table's row for a hub id (`org/name`, any case), or None (a path, an unlisted model)."""
    return _rows().get(model.strip().rstrip("/").lower())


def all_models() -> list[TableModel]:
    return list({id(m): m for m in _rows().values()}.values())
