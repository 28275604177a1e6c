"""LogIndex: lazy line offsets, reads by seeking, search, the warnings/errors filter, growth."""
import re

from vllm_doctor.tui.logindex import CACHE_LINES, FIRST_BLOCK, LogIndex, _Literal, clean


def write(path, lines, end="\n"):
    path.write_bytes(end.join(lines).encode() + (end.encode() if lines else b""))


def test_lines_by_offset(tmp_path):
    p = tmp_path / "a.log"
    write(p, [f"line {i}" for i in range(1000)])
    index = LogIndex(str(p))
    index.build(chunk=97)                  # blocks that cut lines in the middle
    assert index.line_count == 1000
    assert index.starts.typecode == "Q"
    assert index.line(0) == "line 0" and index.line(999) == "line 999" and index.line(1000) == ""
    assert index.lines(500, 2) == ["line 500", "line 501"]
    assert index.line_at(index.starts[42] + 3) == 41 + 1


def test_unterminated_last_line_ansi_and_crlf(tmp_path):
    p = tmp_path / "b.log"
    p.write_bytes(b"\x1b[32mINFO\x1b[0m ok\r\nsecond\tx\r\nlast without newline")
    index = LogIndex(str(p))
    index.build()
    assert index.line_count == 3
    assert index.line(0) == "INFO ok"
    assert index.line(1) == "second  x"
    assert index.line(2) == "last without newline"
    assert clean(b"progress 10%\rprogress 100%") == "progress 100%"


def test_the_view_shows_the_text_the_diagnosis_reads(tmp_path):
    """One cleaner (sources.lines.clean_text) for the log view and the rules. A terminal leaves the text
    after the last carriage return that something visible follows: progress frames show as the last
    one, a CRLF ending is only an ending, the blank frame tqdm writes to clear its bar hides nothing."""
    from vllm_doctor.sources.lines import parse_line

    cases = {
        b"progress 10%\rprogress 100%": "progress 100%",
        b"INFO ok\r": "INFO ok",
        b"Loading 50%\rLoading 100%\r\r": "Loading 100%",          # the view used to show both frames
        b"Loading 100%\r          \r": "Loading 100%",           # the view used to show blanks
        b"\x1b[32mINFO\x1b[0m ok\r\x1b[K": "INFO ok",
        b"   \r": "",
        b"tab\there": "tab\there",
    }
    p = tmp_path / "cr.log"
    p.write_bytes(b"\n".join(cases) + b"\r\n")
    index = LogIndex(str(p))
    index.build()
    for i, (data, text) in enumerate(cases.items()):
        assert parse_line(data).raw == text
        assert clean(data) == index.line(i) == text.expandtabs(4)


def test_growth_is_picked_up(tmp_path):
    p = tmp_path / "c.log"
    write(p, ["one", "two"])
    index = LogIndex(str(p))
    index.build()
    assert index.line_count == 2
    with open(p, "ab") as out:
        out.write(b"thr")
    index.build()
    assert index.line_count == 3 and index.line(2) == "thr"
    with open(p, "ab") as out:
        out.write(b"ee\nfour\n")
    index.build()
    assert index.line_count == 4 and index.line(2) == "three" and index.line(3) == "four"


def test_search_forward_backward_wraps(tmp_path):
    p = tmp_path / "d.log"
    lines = ["x"] * 50
    lines[10] = "an NCCL error here"
    lines[40] = "another nccl ERROR"
    write(p, lines)
    index = LogIndex(str(p))
    index.build(chunk=64)
    assert index.search("nccl", -1) == 10
    assert index.search("nccl", 10) == 40
    assert index.search("nccl", 40) == 10                    # wraps to the top
    assert index.search("NCCL", 40, backwards=True) == 10
    assert index.search("nccl", 10, backwards=True) == 40    # wraps to the bottom
    assert index.search("absent", 0) is None


def test_problem_filter(tmp_path):
    p = tmp_path / "e.log"
    write(p, [
        "INFO 12-01 00:31:17 [api_utils.py:347] fine",
        "WARNING 12-01 00:31:17 [system_utils.py:255] careful",
        "Traceback (most recent call last):",
        "  File \"x.py\", line 1, in <module>",
        "ValueError: boom",
        "[W1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] warn",
        "all good",
    ])
    index = LogIndex(str(p))
    index.build()
    assert list(index.problems()) == [1, 2, 4, 5]


def test_text_is_not_kept(tmp_path):
    p = tmp_path / "f.log"
    write(p, [f"{i:08d} " + "y" * 40 for i in range(CACHE_LINES * 2)])
    index = LogIndex(str(p))
    index.build()
    for i in range(0, index.line_count):
        index.line(i)
    assert len(index._cache) <= CACHE_LINES        # a bounded window, not the whole log
    assert index.line(5).startswith("00000005")


def test_missing_file_never_raises(tmp_path):
    index = LogIndex(str(tmp_path / "missing.log"))
    assert index.error
    index.build()
    assert index.line_count == 0 and index.line(0) == "" and index.search("x", 0) is None
    assert list(index.scan(re.compile(b"x"))) == []


def test_literal_finds_what_lower_and_find_find():
    """The Aho-Corasick prefilter over case variants of a window finds exactly the case-insensitive
    occurrences, whichever window the sample picks (overlapping and self-overlapping needles too)."""
    import random

    rnd = random.Random(7)
    alphabet = b"aAbB \n.:(x"
    for _ in range(3000):
        block = bytes(rnd.choice(alphabet) for _ in range(rnd.randint(0, 60)))
        needle = bytes(rnd.choice(alphabet[:-1].replace(b"\n", b"")) for _ in range(rnd.randint(1, 7)))
        sample = bytes(rnd.choice(alphabet) for _ in range(rnd.randint(0, 30)))
        low, want, pos = block.lower(), [], 0
        while (i := low.find(needle.lower(), pos)) >= 0:
            want.append(i)
            pos = i + 1
        assert [h.start() for h in _Literal(needle, sample).finditer(block)] == want, (block, needle)


def test_search_past_a_line_longer_than_the_first_block(tmp_path):
    p = tmp_path / "g.log"
    long = "z" * (FIRST_BLOCK + 100) + "Needle"
    write(p, ["first", long, "after"])
    index = LogIndex(str(p))
    index.build()
    assert index.search("needle", 0) == 1
    assert index.search("AFTER", 0) == 2


def test_merged_line_numbers():
    from vllm_doctor.tui.logindex import merged

    assert list(merged(iter([1, 5, 9]), [0, 5, 6, 12])) == [0, 1, 5, 6, 9, 12]
    assert list(merged(iter([]), [3])) == [3] and list(merged(iter([2, 4]), [])) == [2, 4]
