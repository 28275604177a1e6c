"""A traceback cut before its message (`raise ValueError(` is its last line), or whose exception no pattern knows:
the innermost frame's function says which of vLLM's checks raised it (a rule's `raised_in`). Not where a statement
of that function failed with one of Python's own errors (events/tracebacks.py statement_failed): that is the input's
fault, not the check's."""
from __future__ import annotations

from vllm_doctor.events.tracebacks import Traceback, failing, statement_failed
from vllm_doctor.findings import Match
from vllm_doctor.rules.catalog import Catalog


def raised_in_matches(catalog: Catalog, finished: list[Traceback], explained: set[int]) -> list[Match]:
    """One match per finished, failing traceback that no pattern explained (`explained`: their ids) and whose
    innermost frame is a function a rule names."""
    raisers = catalog.raisers
    out: list[Match] = []
    for tb in finished if raisers else ():
        if id(tb) in explained or not tb.frames or not failing(tb):
            continue
        frame = tb.frames[-1]
        rule_id = raisers.get(frame.func)
        if rule_id is None or statement_failed(tb):
            continue
        out.append(Match(rule_id, catalog.raised_in_pattern(rule_id), {"raised_in": frame.func}, frame.line or tb.start,
                         tb, frozenset(), tb.end_seq or tb.start_seq))
    return out
