"""docs/coverage/nccl*: every WARN and result text NCCL can print (harvested from its source, release by release, by
tools/harvest_nccl.py) maps to the rule that reads it or to `other:` with a reason, and the table stays true as the
rules change."""
from __future__ import annotations

import sys
from collections import Counter

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
from nccl_sites import OTHER_REASONS, REVIEWS_FILE, TABLE_FILE, load, mapping, table_markdown  # noqa: E402
from vllm_sites import misplaced, read_reviews  # noqa: E402

RELEASES, SITES = load()
# Reviewed sites whose review names the rule that should read them, but no pattern does yet: may only shrink.
MAX_WANTED = 6


def test_the_releases_pytorch_pinned_are_harvested():
    """torch 2.1 shipped NCCL 2.18, 2.2 2.19, 2.3-2.4 2.20, 2.5-2.6 2.21, 2.7 2.26, 2.8 2.27; the newest too."""
    for release in ("2.18.6", "2.19.4", "2.20.5", "2.21.5", "2.26.6", "2.27.7", "2.30.7"):
        assert release in RELEASES
    per_release = Counter(r for s in SITES for r in s.releases)
    assert all(per_release[r] > 250 for r in RELEASES), per_release
    assert {s.kind for s in SITES} == {"WARN", "ncclResult"}


def test_every_site_is_mapped_to_a_rule_or_a_reason(catalog):
    assert misplaced(SITES, catalog, OTHER_REASONS) == []
    assert not [s.template for s in SITES if s.maps == "other:not-reviewed"]


@pytest.mark.parametrize("area", sorted({s.area for s in SITES}))
def test_the_engine_still_reads_each_message_as_mapped(catalog, area):
    """A WARN rendered with plausible values, before PyTorch's generic NCCL error, is still named by its rule through
    the real engine; an `other:` one by none more specific than nccl-generic (after a rule changed: python3
    tools/harvest_nccl.py --remap)."""
    wrong = [(s.template, s.maps, got) for s in SITES if s.area == area and (got := mapping(s, catalog)) != s.maps]
    assert not wrong, wrong[:10]


def test_each_review_is_of_a_harvested_site_with_a_reason_and_its_why(catalog):
    """docs/coverage/nccl-reviews.jsonl: each reviewed site has a fixed reason and a one-line why; a review may name
    the rule that should read the message (`rule`), and those no pattern reads yet are a backlog that only shrinks."""
    entries = read_reviews(REVIEWS_FILE)
    by_template = {s.template: s for s in SITES}
    assert len({e["template"] for e in entries}) == len(entries), "one review per message"
    wanted = []
    for e in entries:
        assert e["template"] in by_template, ("stale review", e["template"])
        assert e["reason"] in OTHER_REASONS and e["reason"] not in ("not-reviewed", "built-at-run-time"), e
        assert 0 < len(e["why"]) <= 200 and "\n" not in e["why"], e
        if "rule" in e:
            assert e["rule"] in catalog.rules, e
            if by_template[e["template"]].maps != e["rule"]:
                wanted.append((e["rule"], e["template"]))
    assert len(wanted) <= MAX_WANTED, sorted(wanted)


def test_the_table_is_generated_from_the_data():
    assert TABLE_FILE.read_text("utf-8") == table_markdown(RELEASES, SITES), \
        "docs/coverage/nccl.md drifted: python3 tools/harvest_nccl.py --remap"
