"""Rule pages, the README rule list, markdown and anonymized reports."""
import json

from conftest import CORPUS_DEV, ROOT, run_cli
from vllm_doctor.reports.rule_pages import README_END, README_START, rule_page, rules_markdown
from vllm_doctor.reports.anonymize import Anonymizer


def test_every_rule_has_a_page(catalog):
    for rule in catalog.rules.values():
        page = rule_page(rule)
        assert rule.id in page and "\nExample\n" in page and "\nHow the fix is chosen\n" in page
        assert rule.examples[0]["text"].strip() in page


def test_readme_rule_list_is_generated_from_the_rules(catalog):
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(README_START), readme.index(README_END) + len(README_END)
    assert readme[start:end] + "\n" == rules_markdown(catalog), \
        "README rule list drifted: paste `vllm-doctor rules --format markdown` into README.md"


def test_explain_unknown_rule_suggests():
    proc = run_cli("explain", "tp-heads")
    assert proc.returncode == 2 and "did you mean 'tp-heads-indivisible'" in proc.stderr.decode()


def test_anonymizer_masks_everything_sensitive():
    text = ("gpu-node-7:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.1.2.3<0>\n"
            "(RayWorkerWrapper pid=1, ip=192.168.7.9) loading /home/alice/models/llama/config.json\n"
            "$ HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123 vllm serve m --api-key sk-secretsecretsecret123\n"
            "fe80:0:0:0:202:b3ff:fe1e:8329 connect failed\n")
    out = Anonymizer().apply(text)
    for secret in ("gpu-node-7", "10.1.2.3", "192.168.7.9", "alice", "hf_abcdefghijklmnopqrstuvwxyz123",
                   "sk-secretsecretsecret123", "/home/alice/models/llama", "fe80:0:0:0:202:b3ff:fe1e:8329"):
        assert secret not in out, secret
    assert "config.json" in out and "NCCL INFO" in out and "<ip-1>" in out


def test_anonymized_json_still_parses_and_hides_paths():
    proc = run_cli("--no-live", "--format", "json", "--anonymize", str(CORPUS_DEV / "25-remote-code.log"))
    text = proc.stdout.decode()
    report = json.loads(text)
    assert report["findings"][0]["rule"] == "trust-remote-code"
    assert "/opt/venv/lib" not in text and "/home/user" not in text


def test_markdown_report_folds_evidence():
    proc = run_cli("--no-live", "--format", "markdown", str(CORPUS_DEV / "07-tp3-40heads.log"))
    out = proc.stdout.decode()
    assert out.startswith("# vllm-doctor report") and "## Root cause" in out
    assert "<details><summary>Evidence</summary>" in out and "| fact | value | source |" in out


def test_facts_every_rank_prints_are_shown_once():
    proc = run_cli("--no-live", "--format", "json", str(ROOT / "logs_corpus/nccl/n08-ray-multinode-nic.log"))
    lines = json.loads(proc.stdout)["findings"][0]["explanation"].splitlines()
    uses = [ln for ln in lines if ": NCCL uses " in ln]
    assert len(uses) >= 2 and len(uses) == len(set(uses))


def test_explanation_numbers_come_from_the_log_or_the_aside_is_left_out():
    from vllm_doctor.facts import Facts
    from vllm_doctor.remedies.apply import explain

    facts = Facts()
    facts.set("log.max_model_len", 4096, "log")
    text = "one request of max_model_len ({max_model_len}) tokens; util x total ({util} x {total_gib} GiB) is free."
    assert explain(text, {}, facts) == "one request of max_model_len (4096) tokens; util x total is free."
    assert explain(text, {"util": 0.9, "total_gib": 80}, facts).endswith("util x total (0.9 x 80 GiB) is free.")
    proc = run_cli("--no-live", "--format", "json", str(CORPUS_DEV / "27-kv-bytes-too-small.log"))
    assert "max_model_len (4096) tokens" in json.loads(proc.stdout)["findings"][0]["explanation"]
