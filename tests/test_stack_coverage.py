"""docs/coverage/stack*: what PyTorch, huggingface_hub, transformers, Ray and the container runtimes say (their
templates by release, from their source and binaries) maps to the rule that reads it or to `other:` with a reason,
and the table stays true as the rules change."""
from __future__ import annotations

import sys
from collections import Counter

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
from stack_sites import KINDS, OTHER_REASONS, SOURCES, TABLE_FILE, load, mapping, table_markdown  # noqa: E402

ENTRIES = load()
# Messages the engine reads as nothing wrong on their own: may only shrink (each is a failure it would miss).
MAX_ALL_CLEAR = 0


def test_every_source_is_harvested_with_its_releases_and_a_public_log():
    per = Counter(e["source"] for e in ENTRIES)
    assert set(per) == set(SOURCES) and all(per[s] >= 10 for s in SOURCES), per
    for e in ENTRIES:
        assert e["kind"] in KINDS and e["template"].strip() and e.get("releases"), e
        assert not e.get("example") or e["example"].startswith("https://github.com/"), e
    assert len({(e["source"], e["template"]) for e in ENTRIES}) == len(ENTRIES), "one line per message"
    # the OOM formats of every torch release from 1.13 (old, 2.1's typo, 2.2's hint, 2.10's renamed variable)
    oom = [e["template"] for e in ENTRIES if e["source"] == "torch" and e["template"].startswith("CUDA out of memory")]
    assert any("total capacity;" in t for t in oom) and any("total capacty" in t for t in oom)
    assert any("PYTORCH_CUDA_ALLOC_CONF=expandable_segments" in t for t in oom)
    assert any("PYTORCH_ALLOC_CONF=expandable_segments" in t for t in oom)


def test_every_message_is_mapped_as_the_engine_reads_it(catalog):
    """A message mapped to a rule is still named by it through the real engine; an exception line no rule reads is
    `unrecognized` with the message cited, never an all-clear (after a rule changed: python3 tools/stack_sites.py)."""
    wrong = [(e["template"][:80], e["maps"], got) for e in ENTRIES if (got := mapping(e, catalog)) != e["maps"]]
    assert not wrong, wrong[:10]
    for e in ENTRIES:
        assert e["maps"] in catalog.rules or e["maps"][len("other:"):] in OTHER_REASONS, e
    clear = [e["template"][:80] for e in ENTRIES if e["maps"] == "other:all-clear"]
    assert len(clear) <= MAX_ALL_CLEAR, clear
    assert not [e for e in clear if e.startswith(("CUDA out of memory", "Cannot access gated repo"))]


def test_the_table_is_generated_from_the_data():
    assert TABLE_FILE.read_text("utf-8") == table_markdown(ENTRIES), \
        "docs/coverage/stack.md drifted: python3 tools/stack_sites.py"
