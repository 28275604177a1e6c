"""Every rule's own examples: positives must match (with their captures), near misses must not."""
import tomllib

import pytest

from conftest import REFERENCE, ROOT
from vllm_doctor.rules.catalog import CatalogError, check_catalog, load_catalog, match_text


def published_rule_ids() -> set[str]:
    """The ids listed in docs/reference/rule-ids.md (one "- `id` — ..." line each)."""
    text = (REFERENCE / "rule-ids.md").read_text()   # a missing file fails the test, it is not skipped
    return {line.split("`")[1] for line in text.splitlines() if line.startswith("- `")}


def test_catalog_is_clean(catalog):
    assert check_catalog(catalog) == []


def test_rule_ids_are_the_published_ones(catalog):
    published = published_rule_ids()
    assert published, "docs/reference/rule-ids.md lists no rule ids"
    assert set(catalog.rules) <= published, sorted(set(catalog.rules) - published)


@pytest.mark.parametrize("path", sorted((ROOT / "rules").glob("[!_]*.toml")), ids=lambda p: p.stem)
def test_rule_examples(path, catalog):
    data = tomllib.loads(path.read_text())
    rule = catalog.rules[data["id"]]
    assert rule.id == path.stem, "one file per rule, named after its id"
    assert data.get("examples"), "a rule without examples"
    for example in data["examples"]:
        got = match_text(rule, example["text"])
        assert got is not None, example["text"]
        for key, value in (example.get("captures") or {}).items():
            assert got[1].get(key) == str(value), (key, example["text"])
    for near_miss in data.get("counterexamples", []):
        assert match_text(rule, near_miss["text"]) is None, near_miss["text"]


def _write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path


def test_duplicate_ids_rejected(tmp_path):
    body = ('id = "x"\ntitle = "t"\nseverity = "error"\nfamily = "f"\nsummary = "s"\nexplanation = "e"\n'
            '[[patterns]]\nliteral = "a"\nregex = "a"\n')
    _write(tmp_path, "x.toml", body)
    _write(tmp_path, "y.toml", body)
    with pytest.raises(CatalogError, match="duplicate rule id 'x'"):
        load_catalog(tmp_path)


def test_rule_without_examples_is_reported(tmp_path):
    _write(tmp_path, "x.toml", 'id = "x"\ntitle = "t"\nseverity = "error"\nfamily = "f"\nsummary = "s"\n'
           'explanation = "e"\n[[patterns]]\nliteral = "boom"\nregex = "boom"\n')
    problems = check_catalog(load_catalog(tmp_path))
    assert any("no [[examples]]" in p for p in problems)


def test_misbehaving_example_is_reported(tmp_path):
    _write(tmp_path, "x.toml", 'id = "x"\ntitle = "t"\nseverity = "error"\nfamily = "f"\nsummary = "s"\n'
           'explanation = "e"\n[[patterns]]\nliteral = "boom"\nregex = "boom (?P<n>\\\\d+)"\n'
           '[[examples]]\ntext = "boom 3"\ncaptures = { n = "4" }\n'
           '[[counterexamples]]\ntext = "boom 5"\n')
    problems = check_catalog(load_catalog(tmp_path))
    assert any("capture n='3', expected '4'" in p for p in problems)
    assert any("counterexample matches" in p for p in problems)


@pytest.mark.parametrize("body, message", [
    ("id = [", "not valid TOML"),
    ('id = "x"\n', "missing title"),
    ('id = "x"\ntitle = "t"\nseverity = "fatal"\nfamily = "f"\nsummary = "s"\nexplanation = "e"\n', "severity"),
])
def test_malformed_rule_files(tmp_path, body, message):
    _write(tmp_path, "x.toml", body)
    with pytest.raises(CatalogError, match=message):
        load_catalog(tmp_path)


def test_broken_regex_is_reported_by_the_check_and_at_first_use(tmp_path):
    _write(tmp_path, "x.toml", 'id = "x"\ntitle = "t"\nseverity = "error"\nfamily = "f"\nsummary = "s"\n'
           'explanation = "e"\n[[patterns]]\nliteral = "a"\nregex = "(a"\n')
    catalog = load_catalog(tmp_path)
    assert any("does not compile" in p for p in check_catalog(catalog))
    with pytest.raises(CatalogError, match="does not compile"):
        catalog.patterns[0].regex
