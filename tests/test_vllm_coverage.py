"""docs/coverage/: every message vLLM's start-up path can raise or log (harvested from its source, release by
release, by tools/harvest_vllm.py) maps to the rule that reads it or to `other:` with a reason, and the table
stays true as the rules change."""
from __future__ import annotations

import sys
from collections import Counter

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
from vllm_sites import OTHER_REASONS, TABLE_FILE, load_sites, mapping, table_markdown  # noqa: E402

RELEASES, SITES = load_sites()
# The backlog may only shrink: a harvest of a new release adds its new messages as not-reviewed, and this
# bound makes someone look at them (map them to a rule, or give them a reason) before it lands.
MAX_NOT_REVIEWED = 1817


def test_the_pinned_releases_are_harvested():
    for release in ("0.4.3", "0.5.5", "0.6.6", "0.7.3", "0.8.5", "0.9.2", "0.10.2", "0.11.2", "0.32.0"):
        assert release in RELEASES
    assert all(s.releases and set(s.releases) <= set(RELEASES) for s in SITES)
    per_release = Counter(r for s in SITES for r in s.releases)
    assert all(per_release[r] > 100 for r in RELEASES), per_release


def test_every_site_is_mapped_to_a_rule_or_a_reason(catalog):
    for s in SITES:
        if s.maps.startswith("other:"):
            assert s.maps[len("other:"):] in OTHER_REASONS, (s.template, s.maps)
        else:
            assert s.maps in catalog.rules, (s.template, s.maps)
    assert sum(s.maps == "other:not-reviewed" for s in SITES) <= MAX_NOT_REVIEWED


@pytest.mark.parametrize("area", sorted({s.area for s in SITES}))
def test_the_engine_still_reads_each_message_as_mapped(catalog, area):
    """A rule-mapped message rendered with plausible values is still named by its rule through the real engine;
    an `other:` one is named by none (a new pattern that starts reading it must be looked at and the table
    regenerated: python3 tools/harvest_vllm.py --remap)."""
    wrong = [(s.template, s.maps, got) for s in SITES if s.area == area
             and (got := mapping(s, catalog)) != s.maps]
    assert not wrong, wrong[:10]


def test_the_table_is_generated_from_the_data():
    assert TABLE_FILE.read_text("utf-8") == table_markdown(RELEASES, SITES), \
        "docs/coverage/vllm.md drifted: python3 tools/harvest_vllm.py --remap"
