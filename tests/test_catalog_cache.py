"""The compiled catalog cache (rules/catalog.py): used on the second load, rebuilt when anything it was
validated from changes, never an error of its own (corrupt, unreadable or unwritable cache)."""
from __future__ import annotations

import pickle
import shutil
import tomllib

import pytest

from conftest import CORPUS_DEV, ROOT, run_cli
from vllm_doctor.rules import catalog as C
from vllm_doctor.rules import hooks


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory of the test's own."""
    path = tmp_path / "cache"
    monkeypatch.setenv("VLLM_DOCTOR_CACHE_DIR", str(path))
    return path


@pytest.fixture
def rules(tmp_path):
    """A copy of the shipped rules the test may change."""
    return shutil.copytree(ROOT / "rules", tmp_path / "rules")


def load(rules_dir) -> C.Catalog:
    return C.cached_catalog.__wrapped__(str(rules_dir))       # past the in-process lru_cache


def no_parsing(monkeypatch) -> None:
    """Any TOML parse or catalog load from here on fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("the rule files were parsed again")

    monkeypatch.setattr(tomllib, "loads", refuse)
    monkeypatch.setattr(C, "load_catalog", refuse)


def summary(catalog: C.Catalog) -> dict:
    return {rid: (r.title, r.path, r.remedy, [(p.name, p.literal, p.source, p.kind) for p in r.patterns])
            for rid, r in catalog.rules.items()} | {"": (catalog.wrapper_sources, catalog.structural)}


def test_second_load_comes_from_the_cache(cache, rules, monkeypatch):
    first = load(rules)
    assert [p.name for p in cache.iterdir()] == [C._cache_file(rules).name]
    no_parsing(monkeypatch)
    second = load(rules)
    assert summary(second) == summary(first)
    assert all(p._compiled is None for p in second.patterns), "the cache holds pattern text, not regexes"
    assert second.rules["tp-heads-indivisible"].patterns[0].regex.search is not None
    assert second.is_wrapper("RuntimeError: Engine core initialization failed. See root cause above.") \
        == first.is_wrapper("RuntimeError: Engine core initialization failed. See root cause above.")


def test_a_changed_rule_file_is_parsed_again(cache, rules):
    load(rules)
    path = rules / "nccl-shm.toml"
    text = path.read_text(encoding="utf-8")
    old_title = tomllib.loads(text)["title"]
    path.write_text(text.replace(f'title = "{old_title}"', 'title = "A new title"', 1), encoding="utf-8")
    assert load(rules).rules["nccl-shm"].title == "A new title"
    assert load(rules).rules["nccl-shm"].title == "A new title"        # and the cache now holds that


def test_a_new_rule_file_is_seen(cache, rules):
    load(rules)
    body = ('id = "x-new"\ntitle = "t"\nseverity = "error"\nfamily = "f"\nsummary = "s"\nexplanation = "e"\n'
            '[[patterns]]\nliteral = "boom"\nregex = "boom"\n')
    (rules / "x-new.toml").write_text(body, encoding="utf-8")
    assert "x-new" in load(rules).rules


def test_a_changed_hook_module_is_checked_again(cache, rules, tmp_path, monkeypatch):
    """The specs were checked against remedies/*.py: a cached catalog is only good while those are unchanged."""
    load(rules)
    fake = tmp_path / "pkg"
    shutil.copytree(hooks.package_dir("remedies"), fake / "remedies")
    shutil.copytree(hooks.package_dir("refine"), fake / "refine")
    monkeypatch.setattr(hooks, "package_dir", lambda package: fake / package)
    assert summary(load(rules)) == summary(C.load_catalog(rules))      # same bytes: still good
    nccl = fake / "remedies" / "nccl.py"
    nccl.write_text(nccl.read_text(encoding="utf-8").replace("def fix_shm(", "def fix_shm_gone("),
                    encoding="utf-8")
    with pytest.raises(C.CatalogError, match=r"no function fix_shm in remedies/nccl\.py"):
        load(rules)


def test_another_package_version_rebuilds(cache, rules, monkeypatch):
    load(rules)
    calls = []
    real = C.load_catalog
    monkeypatch.setattr(C, "load_catalog", lambda d: calls.append(d) or real(d))
    monkeypatch.setattr(C, "__version__", "0.0.0-other")
    load(rules)
    assert calls, "a cache written by another version was used"


@pytest.mark.parametrize("damage", [
    lambda data: b"",                                          # empty
    lambda data: data[:len(data) // 2],                        # truncated
    lambda data: data.partition(b"\n")[0] + b"\n" + b"\x80\x05garbage",     # right key, broken pickle
    lambda data: data.partition(b"\n")[0] + b"\n" + pickle.dumps(("x", {"not": "a catalog"})),
    lambda data: b"\xff\xfe" * 100,                            # not even a key line
])
def test_a_corrupt_cache_file_is_rebuilt(cache, rules, damage):
    want = summary(load(rules))
    file = C._cache_file(rules)
    file.write_bytes(damage(file.read_bytes()))
    assert summary(load(rules)) == want
    _, catalog = pickle.loads(file.read_bytes().partition(b"\n")[2])   # written again, whole
    assert summary(catalog) == want


def test_another_users_cache_file_is_not_unpickled(cache, rules, monkeypatch):
    """Unpickling runs code: a cache file someone else owns is rebuilt, never loaded."""
    import os

    load(rules)
    calls = []
    real = C.load_catalog
    monkeypatch.setattr(C, "load_catalog", lambda d: calls.append(d) or real(d))
    monkeypatch.setattr(os, "getuid", lambda: os.stat(C._cache_file(rules)).st_uid + 1)
    assert load(rules).rules and calls, "another user's cache file was loaded"


def test_an_unreadable_cache_file_is_rebuilt(cache, rules):
    want = summary(load(rules))
    file = C._cache_file(rules)
    file.unlink()
    file.mkdir()                          # reading it fails (IsADirectoryError), so does replacing it
    assert summary(load(rules)) == want


def test_a_cache_dir_that_cannot_be_made_is_not_used(tmp_path, rules, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("VLLM_DOCTOR_CACHE_DIR", str(blocker / "cache"))   # under a file: mkdir fails
    assert load(rules).rules
    assert load(rules).rules
    assert capsys.readouterr() == ("", "")


def test_a_read_only_cache_dir_is_not_used(cache, rules, monkeypatch, capsys):
    cache.mkdir()
    cache.chmod(0o500)
    try:
        import tempfile

        def read_only(*args, **kwargs):    # what mkstemp meets in a read-only directory (root ignores modes)
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(tempfile, "mkstemp", read_only)
        assert load(rules).rules
        assert list(cache.iterdir()) == []
        assert capsys.readouterr() == ("", "")
    finally:
        cache.chmod(0o700)


def test_a_failed_write_leaves_no_temporary_file(cache, rules, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pickle, "dumps", broken)
    assert load(rules).rules
    assert list(cache.iterdir()) == []


def test_the_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_DOCTOR_CACHE_DIR", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert C.cache_dir() == tmp_path / "own"
    monkeypatch.delenv("VLLM_DOCTOR_CACHE_DIR")
    assert C.cache_dir() == tmp_path / "xdg" / "vllm-doctor"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")          # the XDG spec: ignore a relative one
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert C.cache_dir() == tmp_path / "home" / ".cache" / "vllm-doctor"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert C.cache_dir() == tmp_path / "home" / ".cache" / "vllm-doctor"


def test_each_rules_dir_has_its_own_cache_file(cache, rules, tmp_path):
    other = shutil.copytree(ROOT / "rules", tmp_path / "other")
    assert C._cache_file(rules) != C._cache_file(other)
    load(rules)
    load(other)
    assert len(list(cache.iterdir())) == 2


BROKEN = ('id = "x-broken"\ntitle = "t"\nseverity = "error"\nfamily = "f"\nsummary = "s"\nexplanation = "e"\n'
          '[[patterns]]\nliteral = "never in any log"\nregex = "(never"\n')


def test_a_broken_regex_is_reported_at_load(cache, rules):
    """Patterns compile on first use, but the load that builds the cache compiles them all."""
    (rules / "x-broken.toml").write_text(BROKEN, encoding="utf-8")
    with pytest.raises(C.CatalogError, match="x-broken.toml: pattern 'p1' does not compile"):
        load(rules)
    assert not cache.exists() or list(cache.iterdir()) == [], "a catalog that failed its check is cached"


def _one_line_exit_2(proc, needle: str) -> None:
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and needle in err, err


def test_cli_malformed_rule_after_a_good_cached_run_is_one_line_exit_2(tmp_path, rules):
    env = {"VLLM_DOCTOR_CACHE_DIR": str(tmp_path / "cache")}
    log = str(CORPUS_DEV / "07-tp3-40heads.log")
    assert run_cli("--no-live", "--rules-dir", str(rules), log, env=env).returncode == 1
    assert list((tmp_path / "cache").iterdir()), "the good run left a cache"
    (rules / "nccl-shm.toml").write_text("id = [\n", encoding="utf-8")
    _one_line_exit_2(run_cli("--no-live", "--rules-dir", str(rules), log, env=env), "nccl-shm.toml: not valid TOML")
    _one_line_exit_2(run_cli("rules", "--rules-dir", str(rules), env=env), "nccl-shm.toml: not valid TOML")


def test_cli_broken_regex_is_one_line_exit_2(tmp_path, rules):
    (rules / "x-broken.toml").write_text(BROKEN, encoding="utf-8")
    proc = run_cli("--no-live", "--rules-dir", str(rules), str(CORPUS_DEV / "07-tp3-40heads.log"),
                   env={"VLLM_DOCTOR_CACHE_DIR": str(tmp_path / "cache")})
    _one_line_exit_2(proc, "x-broken.toml: pattern 'p1' does not compile")
