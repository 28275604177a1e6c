"""docs/coverage/: every message vLLM's start-up path can raise or log (harvested from its source, release by
release, by tools/harvest_vllm.py) maps to the rule that reads it or to `other:` with a reason, and the table
stays true as the rules change."""
from __future__ import annotations

import sys
from collections import Counter

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
from vllm_sites import (OTHER_REASONS, TABLE_FILE, func_name, load_sites, mapping, misplaced,  # noqa: E402
                        table_markdown)

RELEASES, SITES = load_sites()
# The backlog may only shrink: a harvest of a new release adds its new messages as not-reviewed, and this
# bound makes someone look at them (map them to a rule, or give them a reason) before it lands.
MAX_NOT_REVIEWED = 0


def test_the_pinned_releases_are_harvested():
    for release in ("0.4.3", "0.5.5", "0.6.6", "0.7.3", "0.8.5", "0.9.2", "0.10.2", "0.11.2", "0.32.0"):
        assert release in RELEASES
    assert all(s.releases and set(s.releases) <= set(RELEASES) for s in SITES)
    per_release = Counter(r for s in SITES for r in s.releases)
    assert all(per_release[r] > 100 for r in RELEASES), per_release


def test_every_site_is_mapped_to_a_rule_or_a_reason(catalog):
    assert misplaced(SITES, catalog, OTHER_REASONS) == []
    assert sum(s.maps == "other:not-reviewed" for s in SITES) <= MAX_NOT_REVIEWED


@pytest.mark.parametrize("area", sorted({s.area for s in SITES}))
def test_the_engine_still_reads_each_message_as_mapped(catalog, area):
    """A rule-mapped message rendered with plausible values is still named by its rule through the real engine;
    an `other:` one is named by none (a new pattern that starts reading it must be looked at and the table
    regenerated: python3 tools/harvest_vllm.py --remap)."""
    wrong = [(s.template, s.maps, got) for s in SITES if s.area == area
             and (got := mapping(s, catalog)) != s.maps]
    assert not wrong, wrong[:10]


def test_each_review_is_of_a_harvested_site_with_a_reason_and_its_why():
    """docs/coverage/reviews.jsonl: a site someone read gets a fixed reason and says why in one line; an entry
    whose message no release has any more is stale."""
    from vllm_sites import read_reviews

    entries = read_reviews()
    templates = {s.template for s in SITES}
    assert len({e["template"] for e in entries}) == len(entries), "one review per message"
    for e in entries:
        assert e["template"] in templates, ("stale review", e["template"])
        assert e["reason"] in OTHER_REASONS and e["reason"] != "not-reviewed", e
        assert 0 < len(e["why"]) <= 200 and "\n" not in e["why"], e


def test_the_table_is_generated_from_the_data():
    assert TABLE_FILE.read_text("utf-8") == table_markdown(RELEASES, SITES), \
        "docs/coverage/vllm.md drifted: python3 tools/harvest_vllm.py --remap"


def test_each_rule_shows_every_vllm_template_mapped_to_it(catalog):
    """Every rule's examples include a message rendered from each vLLM template mapped to it (python3
    tools/harvest_vllm.py --add-examples appends the missing ones)."""
    from vllm_sites import has_example

    missing = [(s.maps, s.template) for s in SITES if s.maps in catalog.rules
               and not has_example(s, catalog.rules[s.maps])]
    assert not missing, missing[:10]


# Checkers whose raises all map to one rule but whose bare name is not evidence enough on its own: a frame's
# function name is all `raised_in` sees.
NOT_RAISERS = {
    "ensure_divisibility": "vLLM's divide() for heads, KV heads and every sharded dimension alike: the numbers decide",
    "_check_cuda": "a generic name (an executor's method)",
    "request_memory": "a generic name",
    "run_server": "the API server's whole start: its only raises in some releases are the parser-name checks, but a "
                  "fragment cut there can be anything that start does",
    "create_qweight_for_4bit": "a closure inside create_weights",
    "_validate_num_blocks": "a generic name (OpenVINO's worker only)",
    "_validate_num_cpu_blocks": "a generic name (OpenVINO's worker only)",
    "_wait_for_new_engine_ready": "a wait: what it waited for decides",
    "maybe_roundup_sizes": "a generic name (every fused-MoE method has one; one raises)",
    "_init_data_parallel": "a generic name (engine and worker classes define one)",
}


def _checkers() -> dict[str, set[str]]:
    """Function name -> the mappings of the raises and asserts in functions of that name."""
    by: dict[str, set[str]] = {}
    for s in SITES:
        if s.kind in ("raise", "assert"):
            for place in s.where:
                by.setdefault(func_name(place), set()).add(s.maps)
    return by


def test_raised_in_covers_every_checker_of_one_rule(catalog):
    """A fragment that stops at `raise ValueError(` in a checker whose every raise is one rule's failure still
    names that rule; and no `raised_in` function raises anything else."""
    raisers = catalog.raisers
    by = _checkers()
    for func, maps in by.items():
        rules = {m for m in maps if not m.startswith("other:")}
        if len(rules) == 1 and maps == rules and func not in NOT_RAISERS:
            assert raisers.get(func) == next(iter(rules)), (func, rules)
    for func, rule in raisers.items():
        if func in by:
            assert rule in by[func] and by[func] - {rule} <= MIXED_RAISERS.get(func, {"other:internal-check"}), \
                (func, rule, by[func])


# raised_in functions that also raise something else, and why the rule is still the fragment's best reading
MIXED_RAISERS = {
    # the other raises: a malformed rope_scaling dict and sliding-window combinations vLLM does not build
    "_get_and_verify_max_len": {"other:config-check", "other:not-implemented"},
    # the other raise: an attention-free model that got KV blocks (a vLLM bug, not a start-up input)
    "raise_if_cache_size_invalid": {"other:internal-state"},
}
