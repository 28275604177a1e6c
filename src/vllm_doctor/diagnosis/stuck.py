"""Requests that stopped producing tokens while the server kept answering. vLLM's periodic stats line (V0
engine/metrics.py, V1 v1/metrics/loggers.py: `Avg prompt throughput: X tokens/s, Avg generation throughput: Y
tokens/s, Running: N reqs, …`) printed with requests running and nothing read or generated is a pause (a long
prefill, a grammar compiling); STUCK_LINES of them in a row (30 s at the default 10 s interval) with no progress after,
to the end of the log, is a hang while serving (vllm#17972: one request at 0 tokens/s while /health answers 200)."""
from __future__ import annotations

import regex

from vllm_doctor.sources.lines import Line

STATS = regex.compile(r"Avg prompt throughput: (?P<prompt>\d{1,12}(?:\.\d{1,6})?) tokens/s, Avg generation throughput: "
                      r"(?P<gen>\d{1,12}(?:\.\d{1,6})?) tokens/s, Running: (?P<running>\d{1,9}) reqs")
STUCK_LINES = 3


class StuckRequests:
    def __init__(self) -> None:
        self.first: Line | None = None      # the first stats line of the run of stuck ones that is still going
        self.last: Line | None = None
        self.last_seq = 0
        self.count = 0

    def feed(self, line: Line, seq: int) -> None:
        m = STATS.search(line.message)
        if m is None:
            return
        if float(m["prompt"]) == 0 and float(m["gen"]) == 0 and int(m["running"]) > 0:
            self.first = self.first or line
            self.last, self.last_seq, self.count = line, seq, self.count + 1
        else:
            self.first, self.last, self.count = None, None, 0

    def hung(self) -> list[Line]:
        """The first and last stats line of a run of STUCK_LINES or more that the log ends in, else []."""
        if self.count < STUCK_LINES or self.first is None or self.last is None:
            return []
        return [self.first, self.last]
