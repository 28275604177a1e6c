"""--anonymize against hostile input: secrets planted in a real log reach no output of any mode, and the
diagnosis is the same with and without it.

The planted log is logs_corpus/real/nccl/rn04 (NCCL shm failure, real) with a launch line in front: a
variant of the real `docker run --runtime nvidia --gpus all …` line of rn27 carrying every kind of
secret a launch line carries (env vars, --add-host, --label, -v mounts, --api-key, a JSON flag value).
The report echoes that line in full (was:/run:), quotes the NCCL `host:pid:tid` line indented, and
lists the host names it saw, so every planted value is shown when nothing masks it (checked first).
"""
import io
import json
import os
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from test_pipe_support import Collector
from vllm_doctor.reports.anonymize import Anonymizer

BASE_LOG = ROOT / "logs_corpus/real/nccl/rn04-ray-two-gpus-shm-segment.log"
# a real failure no rule explains (a corrupt safetensors upload): its report quotes the traceback
UNRECOGNIZED_LOG = ROOT / "logs_corpus/real/other/ro12-other-corrupt-safetensors-upload.log"

PLANTED = {
    "hf token (env prefix)": "hf_QmXkzTvYwPLRnAbCdEfGh12345",
    "hf token (-e)": "hf_ZZtopSecretValue9876543",
    "openai key (--api-key)": "sk-proj-AbCdEf0123456789GhIjKl",
    "anthropic key": "sk-ant-api03-Xy7Zq9Wv2Ut4Sr6Qp8On0Ml",
    "bearer token": "7f3k9QzL2mW8pR4tY6uV1xN5",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ2bGxtLWJvdCJ9.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "github fine-grained pat": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV",
    "github classic pat": "ghp_R2d2C3poBb8Yoda0Luke1Leia2Han3Solo4X",
    "aws access key id": "AKIA2E0A8F3B244C9986",
    "aws secret key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq8Lm3Np2Q",
    "google api key": "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW",
    "password= (env)": "hunter2xyz",
    "secret= (label)": "Tr0ub4dor-and-3",
    "token=\"…\" (quoted)": "tok_9f8e7d6c5b4a",
    "\"api_key\": (json)": "k-live-9a8b7c6d",
    "\"password\": (json)": "s3cr3tValue",
    "url user": "deploybot",
    "url password": "Zx9pQ2mW",
    "url password (redis)": "r3d1sPa55",
    "email": "jane.doe@acme-corp.com",
    "ipv4": "10.42.7.13",
    "ipv6 full": "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
    "ipv6 compressed": "2001:db8::8a2e:370:7334",
    "ipv6 with zone": "fe80::1ff:fe23:4567:890a",
    "ipv6 v4-mapped": "::ffff:10.0.0.1",
    "fqdn": "gpu-node-17.prod.example.com",
    "k8s service": "vllm-0.vllm.default.svc.cluster.local",
    "proxy host": "proxy.corp.example.com",
    "MASTER_ADDR host": "trainer-head-2",
    "nccl prefix host": "a46f6c76528f",             # rn04's own container host name
    "/home user": "mkowalski",
    "/Users user": "jsmith",
    "C:\\Users\\ user": "rgarcia",
}
P = PLANTED
KV_CONFIG = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_connector_extra_config": {
    "remote_url": f"redis://cacheuser:{P['url password (redis)']}@[{P['ipv6 full']}]:6379",
    "api_key": P['"api_key": (json)'], "password": P['"password": (json)']}}, separators=(",", ":"))
LAUNCH = [
    "docker", "run", "--runtime", "nvidia", "--gpus", "all",
    "-e", f"HUGGING_FACE_HUB_TOKEN={P['hf token (-e)']}", "-e", f"AWS_ACCESS_KEY_ID={P['aws access key id']}",
    "-e", f"aws_secret_access_key={P['aws secret key']}", "-e", f"GOOGLE_CLOUD_KEY={P['google api key']}",
    "-e", f"GITHUB_PAT={P['github fine-grained pat']}", "-e", f"GH_CLONE={P['github classic pat']}",
    "-e", f"CLAUDE={P['anthropic key']}", "-e", f"EXTRA_HEADERS=Authorization: Bearer {P['bearer token']}",
    "-e", f"SESSION_COOKIE={P['jwt']}",
    "-e", f"HTTPS_PROXY=http://{P['url user']}:{P['url password']}@{P['proxy host']}:3128",
    "-e", f"DB_PASSWORD={P['password= (env)']}", "-e", f"MASTER_ADDR={P['MASTER_ADDR host']}",
    "-e", f"VLLM_HOST_IP={P['ipv6 with zone']}%eth0",
    "--add-host", f"{P['fqdn']}:{P['ipv4']}", "--add-host", f"{P['k8s service']}:{P['ipv6 compressed']}",
    "--add-host", f"nccl-peer:{P['ipv6 v4-mapped']}",
    "--label", f"maintainer={P['email']}", "--label", f"secret={P['secret= (label)']}",
    "--label", 'token="%s"' % P['token="…" (quoted)'],
    "-v", f"/home/{P['/home user']}/models:/models",
    "-v", f"/Users/{P['/Users user']}/.cache/huggingface:/root/.cache/huggingface",
    "-v", "C:\\Users\\%s\\adapters:/adapters" % P["C:\\Users\\ user"],
    "-p", "8000:8000", "vllm/vllm-openai:v0.8.3", "--model", "meta-llama/Llama-3.1-8B-Instruct",
    "--api-key", P["openai key (--api-key)"], "--kv-transfer-config", KV_CONFIG, "--tensor-parallel-size", "2"]
COMMAND = f"HF_TOKEN={P['hf token (env prefix)']} " + shlex.join(LAUNCH)
RULE = "nccl-shm"


def planted_log(base=BASE_LOG) -> str:
    lines = ["$ " + COMMAND]
    for line in base.read_text().splitlines():   # the Traceback's frames now under a user's home
        lines.append(line.replace("/usr/local/lib/python3.10/dist-packages",
                                  f"/home/{P['/home user']}/venv/lib/python3.10/site-packages"))
    return "\n".join(lines) + "\n"


def leaks(text: str) -> list[str]:
    return [name for name, value in PLANTED.items() if value in text]


def _sh(command: str, tmp) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, capture_output=True, cwd=ROOT, timeout=60,
                          env=dict(os.environ, NO_COLOR="1"))


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    path = tmp_path_factory.mktemp("planted") / "planted.log"
    path.write_text(planted_log())
    return path


@pytest.fixture(scope="module")
def unrecognized_log(tmp_path_factory):
    path = tmp_path_factory.mktemp("planted-unrecognized") / "planted.log"
    path.write_text(planted_log(UNRECOGNIZED_LOG))
    return path


@pytest.fixture(scope="module")
def outputs(log):
    return every_output(log)


@pytest.fixture(scope="module")
def unrecognized_outputs(unrecognized_log):
    return every_output(unrecognized_log, notice=False)    # no rule: no early notice, the report at the end


def every_output(log, notice: bool = True):
    """Every output of every mode, with --anonymize: {mode: (text, exit code)}."""
    tmp, py, q = log.parent, shlex.quote(sys.executable), shlex.quote(str(log))
    out = {}

    def cli(mode, *args, report=None, stdin=None, streams=True):
        proc = run_cli(*args, input=stdin)
        text = proc.stdout.decode() + proc.stderr.decode() if streams else ""
        if report:
            text += (tmp / report).read_text()
        out[mode] = (text, proc.returncode)

    cli("text", "--no-live", "-vv", "--anonymize", str(log))
    cli("json", "--no-live", "--format", "json", "--anonymize", str(log))
    cli("markdown", "--no-live", "--format", "markdown", "-vv", "--anonymize", str(log))
    cli("--report", "--no-live", "-vv", "--anonymize", "--report", str(tmp / "r.txt"), str(log), report="r.txt")
    cli("stdin -", "--no-live", "-vv", "--anonymize", "-", stdin=log.read_bytes())
    # the pipe's stdout is the server's own output passed through unchanged: only stderr is ours. The
    # input stays open after the log (as a server's would) until the early notice is written.
    out["pipe"] = _pipe_with_notice(log, notice)
    proc = _sh(f"cat {q} | {py} -m vllm_doctor --no-live --format json --anonymize", tmp)
    out["pipe json"] = (proc.stderr.decode(), proc.returncode)
    cli("follow", "--no-live", "-vv", "--anonymize", "--follow", str(log), "--idle-exit", "0.2")
    # run: stdout is the command's own output; its notices on stderr are test_run_mode_notices_are_masked's
    cli("run report", "run", "--no-live", "-vv", "--anonymize", "--report", str(tmp / "run.txt"),
        "--cmd", COMMAND, "--", "cat", str(log), report="run.txt", streams=False)
    cli("check", "check", "--no-live", "-vv", "--anonymize", "--", *LAUNCH)
    cli("check json", "check", "--no-live", "--format", "json", "--anonymize", "--", *LAUNCH)
    return out


def _pipe_with_notice(log, notice: bool = True) -> tuple[str, int]:
    proc = subprocess.Popen([sys.executable, "-m", "vllm_doctor", "--no-live", "-vv", "--anonymize", "--settle", "0.1"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
                            env=dict(os.environ, NO_COLOR="1"))
    err = Collector(proc.stderr)
    try:
        proc.stdin.write(log.read_bytes())
        proc.stdin.flush()
        # the notice comes while the input is still open (30 s: a hang guard)
        if notice:
            assert err.wait_for("(the full report follows when the input ends)", timeout=30), err.text()[-2000:]
        proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err.join()
    return err.text(), proc.returncode


def test_every_planted_secret_is_shown_without_anonymize(log, unrecognized_log):
    """The control: the report does echo each planted value, so the checks below are not vacuous."""
    proc = run_cli("--no-live", "-vv", str(log))
    assert leaks(proc.stdout.decode()) == list(PLANTED)
    # the unrecognized report crops the launch line in its text; its JSON holds it whole (no NCCL line there)
    proc = run_cli("--no-live", "--format", "json", str(unrecognized_log))
    assert leaks(proc.stdout.decode()) == [k for k in PLANTED if k != "nccl prefix host"]
    assert len(PLANTED) >= 24


@pytest.mark.parametrize("base", ["nccl", "unrecognized"])
@pytest.mark.parametrize("mode", ["text", "json", "markdown", "--report", "stdin -", "pipe", "pipe json",
                                  "follow", "run report", "check", "check json"])
def test_no_planted_secret_in_any_output(request, base, mode):
    fixture = "outputs" if base == "nccl" else "unrecognized_outputs"
    text, rc = request.getfixturevalue(fixture)[mode]
    assert rc == (0 if mode == "run report" else 1), text[-2000:]     # run: the command's own status (cat)
    assert "Traceback" not in text and "vllm-doctor: error" not in text, text[-2000:]
    assert leaks(text) == [], f"{mode} leaks {leaks(text)}"


def test_the_diagnosis_is_the_same_with_anonymize(log, outputs):
    plain = json.loads(run_cli("--no-live", "--format", "json", str(log)).stdout)
    masked = json.loads(outputs["json"][0])            # still valid JSON once masked
    assert [f["rule"] for f in masked["findings"]] == [f["rule"] for f in plain["findings"]] == [RULE]
    assert masked["status"] == plain["status"]
    assert f"error[{RULE}]" in outputs["text"][0] and f"[{RULE}]" in outputs["pipe"][0]
    # what the diagnosis needs still reads
    for kept in ("meta-llama/Llama-3.1-8B-Instruct", "vllm/vllm-openai:v0.8.3", "--tensor-parallel-size 2",
                 "NCCL WARN", "--ipc host", "NCCL_SHM_DISABLE=1"):
        assert kept in outputs["text"][0], kept
    # NCCL's source place stays readable too (the short report's evidence window may leave it out at 80 columns)
    assert "misc/shmutils.cc:113" in masked["findings"][0]["evidence"][0]["text"]


def test_one_value_one_placeholder_across_the_notices_and_the_report(outputs):
    """The pipe's early notice and its final report share one masker: the same `run:` command."""
    text = outputs["pipe"][0]
    notices = [ln for ln in text.splitlines() if ln.startswith("vllm-doctor:   run: ")]
    assert notices, text[:2000]
    notice = notices[0]
    command = notice.removeprefix("vllm-doctor:   run: ")
    assert "<secret-" in command and "<host-" in command
    assert f"  run: {command}" in text.split("(the full report follows when the input ends)", 1)[1]


def test_the_report_reuses_the_placeholders_of_the_notices(log):
    """In-process, in a different order than the report's: what a notice masked first keeps its
    placeholder in the final report (emit uses the run's masker, not a fresh one)."""
    from types import SimpleNamespace

    from vllm_doctor.cli.common import load_rules
    from vllm_doctor.diagnosis.saved import Options, diagnose_paths
    from vllm_doctor.reports.emit import emit
    from vllm_doctor.streams.output import notice_mask

    args = SimpleNamespace(format="text", no_color=True, anonymize=True, verbose=0, all_runs=False)
    assert notice_mask(args)(f"MASTER_ADDR={P['MASTER_ADDR host']}") == "MASTER_ADDR=<host-1>"
    diagnosis = diagnose_paths([str(log)], load_rules(None), Options(live=False))
    buffer = io.StringIO()
    emit(diagnosis, args, buffer)
    assert "-e MASTER_ADDR=<host-1> " in buffer.getvalue()
    assert notice_mask(SimpleNamespace(anonymize=False)) is None


def test_run_mode_notices_are_masked(outputs, log, tmp_path):
    proc = run_cli("run", "--no-live", "--anonymize", "--report", str(tmp_path / "r.txt"),
                   "--cmd", COMMAND, "--", "cat", str(log))
    notices = proc.stderr.decode()
    assert "failure at" in notices and leaks(notices) == []


# --------------------------------------------------------------------------- the replacer, form by form
# Each line is a real one from logs_corpus (file named) or a variant of one, with the secret in it.
FORMS = [
    ("hf_", "$ HF_TOKEN=hf_QmXkzTvYwPLRnAbCdEfGh12345 vllm serve m", "hf_QmXkzTvYwPLRnAbCdEfGh12345", "secret"),
    ("sk-", "vllm serve m --api-key sk-secretsecretsecret123", "sk-secretsecretsecret123", "secret"),
    ("sk-ant-", "ANTHROPIC_API_KEY=sk-ant-api03-Xy7Zq9Wv2Ut4Sr6Qp8On0Ml", "sk-ant-api03-Xy7Zq9Wv2Ut4Sr6Qp8On0Ml",
     "secret"),
    ("Bearer", "-H 'Authorization: Bearer 7f3k9QzL2mW8pR4tY6uV1xN5'", "7f3k9QzL2mW8pR4tY6uV1xN5", "secret"),
    ("jwt bare", "cookie jar: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlF",
     "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlF", "secret"),
    ("github_pat_", "git clone https://github.com/o/r # github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv",
     "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv", "secret"),
    ("ghp_", "GH=ghp_R2d2C3poBb8Yoda0Luke1Leia2Han3Solo4X", "ghp_R2d2C3poBb8Yoda0Luke1Leia2Han3Solo4X", "secret"),
    ("AKIA", "Found credentials AKIA2E0A8F3B244C9986 in env", "AKIA2E0A8F3B244C9986", "secret"),
    ("aws secret", "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq8Lm3Np2Q",
     "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq8Lm3Np2Q", "secret"),
    ("AIza", "key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW rejected", "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW",
     "secret"),
    ("password=", "mysql://db?password=hunter2xyz&x=1", "hunter2xyz", "secret"),
    ("password:", "password: hunter2xyz", "hunter2xyz", "secret"),
    ("secret=", "--label secret=Tr0ub4dor-and-3", "Tr0ub4dor-and-3", "secret"),
    ("token= quoted", "token='tok 9f8e 7d6c'", "tok 9f8e 7d6c", "secret"),
    ("api_key json", '{"api_key": "k-live-9a8b7c6d"}', "k-live-9a8b7c6d", "secret"),
    ("api_key json-escaped", '"command": "--cfg {\\"api_key\\":\\"k-live-9a8b7c6d\\"}"', "k-live-9a8b7c6d", "secret"),
    # rc vLLM arg dumps print Python reprs: `non-default args: {'model': …, 'api_key': …}`
    ("api_key repr", "non-default args: {'model': 'm', 'api_key': 'k-live-9a8b7c6d'}", "k-live-9a8b7c6d", "secret"),
    ("--hf-token X", "vllm serve m --hf-token abc123secret", "abc123secret", "secret"),
    ("cut by …", "  | $ HF_TOKEN=hf_QmXkzTvY… ", "hf_QmXkzTvY", "secret"),
    ("url credentials", "HTTPS_PROXY=http://deploybot:Zx9pQ2mW@proxy.corp.example.com:3128", "Zx9pQ2mW", "secret"),
    ("url user", "HTTPS_PROXY=http://deploybot:Zx9pQ2mW@proxy.corp.example.com:3128", "deploybot", "user"),
    ("email", "maintainer: jane.doe@acme-corp.com", "jane.doe@acme-corp.com", "email"),
    # rm23: `(RayWorkerWrapper pid=1054, ip=10.96.62.52) ERROR …`
    ("ipv4", "(RayWorkerWrapper pid=1054, ip=10.96.62.52) ERROR 01-02 02:39:17 worker_base.py:467]", "10.96.62.52",
     "ip"),
    ("ipv6 full", "connect to 2001:0db8:85a3:0000:0000:8a2e:0370:7334 failed", "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
     "ip"),
    ("ipv6 compressed", "[c10d] connect to [2001:db8::8a2e:370:7334]:29500 failed", "2001:db8::8a2e:370:7334", "ip"),
    ("ipv6 short", "peer fe80::1 unreachable.", "fe80::1", "ip"),
    # n02: `srv-l40:3301:3301 [1] NCCL INFO NET/Socket : Using [0]eth0:10.1.4.21<0>`, with an IPv6 address
    ("ipv6 zone after ifname", "srv-l40:3301:3301 [1] NCCL INFO NET/Socket : Using [0]eth0:fe80::42:acff:fe11:2%eth0<0>",
     "fe80::42:acff:fe11:2", "ip"),
    # n11: `… localGid ::ffff:10.20.1.12 remoteGid ::ffff:10.20.1.11`
    ("ipv6 v4-mapped", "vendor err 129 (Recv) localGid ::ffff:10.20.1.12 remoteGid ::ffff:10.20.1.11",
     "::ffff:10.20.1.12", "ip"),
    ("fqdn", "Connecting to gpu-node-17.prod.example.com", "gpu-node-17.prod.example.com", "host"),
    ("k8s service", "dial vllm-0.vllm.default.svc.cluster.local failed", "vllm-0.vllm.default.svc.cluster.local",
     "host"),
    ("aws host", "Connecting to ip-10-217-30-221.ec2.internal", "ip-10-217-30-221.ec2.internal", "host"),
    # rn04's first line, indented as the text report quotes it
    ("nccl prefix indented", "  | a46f6c76528f:2777:5429 [0] misc/shmutils.cc:113 NCCL WARN Error while creating",
     "a46f6c76528f", "host"),
    ("nccl prefix in json", '"text": "gpu-node-17:4021:4021 [0] NCCL INFO Bootstrap : Using eth0"', "gpu-node-17",
     "host"),
    # rn07: `distributed_init_method=tcp://10.41.0.7:34773`, with a host name
    ("host:port", "distributed_init_method=tcp://trainer-head-2:34773 backend=nccl", "trainer-head-2", "host"),
    ("bare host:port", "TCPStore connect to gpu-node-17:29500 timed out", "gpu-node-17", "host"),
    ("MASTER_ADDR=", "export MASTER_ADDR=trainer-head-2", "trainer-head-2", "host"),
    # rn27: `(base) ubuntu@ip-10-217-30-221:~$ docker run --runtime nvidia --gpus all \`
    ("shell prompt", "(base) mkowalski@dgx-a100:~$ docker run --runtime nvidia --gpus all \\", "dgx-a100", "host"),
    # rc23: `File "/home/dandiago/vllm/vllm/entrypoints/api_server.py", line 163, in <module>`
    ("/home/NAME", 'File "/home/dandiago/vllm/vllm/entrypoints/api_server.py", line 163', "dandiago", "user"),
    ("/Users/NAME", "-v /Users/jsmith/.cache/huggingface:/root/.cache/huggingface", "jsmith", "user"),
    ("C:\\Users\\NAME", r"(.venv) PS C:\Users\rgarcia\fara> vllm serve m", "rgarcia", "user"),
    ("C:\\\\Users json", r'"cwd": "C:\\Users\\rgarcia\\fara"', "rgarcia", "user"),
    # `kubectl logs --prefix` (sources/lines.py KUBE_PREFIX) and the node story's `pod/NAME`
    ("k8s pod prefix", "[pod/vllm-prod-7d9f8c6b5-x2k4q/vllm] ERROR 01-02 02:39:17 core.py:291] x",
     "vllm-prod-7d9f8c6b5-x2k4q", "pod"),
    ("k8s pod story", "the failure was printed first on pod/vllm-worker-1, then", "vllm-worker-1", "pod"),
]


@pytest.mark.parametrize("line, secret, kind", [f[1:] for f in FORMS], ids=[f[0] for f in FORMS])
def test_each_form_is_masked(line, secret, kind):
    out = Anonymizer().apply(line)
    assert secret not in out, out
    assert f"<{kind}-1>" in out, out


def test_a_value_cut_short_by_the_facts_table_leaves_nothing_behind():
    """The text report's facts table crops a long launch.command (no `…`): the part shown is masked with
    the placeholder of the whole value, which the `was:` line shows in full."""
    out = Anonymizer().apply("  was: HF_TOKEN=hf_QmXkzTvYwPLRnAbCdEfGh12345 vllm serve m\n"
                             "launch.command   HF_TOKEN=hf_QmXkzTvY  log \n")
    assert "hf_QmXkz" not in out and out.count("<secret-1>") == 2, out
    out = Anonymizer().apply("  was: docker run --add-host gpu-node-17.prod.example.com:10.42.7.13 img\n"
                             "launch.command   docker run --add-host gpu-node-17.prod.exa  log \n")
    assert "gpu-node-17" not in out and out.count("<host-1>") == 2, out


def test_home_paths_keep_their_shape_and_the_same_value_its_placeholder():
    out = Anonymizer().apply('File "/home/dandiago/vllm/vllm/entrypoints/api_server.py", line 163\n'
                             "  File \"/home/dandiago/vllm/vllm/engine/arg_utils.py\"\n"
                             "export MASTER_ADDR=gpu-node-17; ping gpu-node-17:29500; dandiago@gpu-node-17:~$\n")
    assert "/home/<user-1>/vllm/vllm/entrypoints/api_server.py" in out
    assert "/home/<user-1>/vllm/vllm/engine/arg_utils.py" in out
    assert "MASTER_ADDR=<host-1>; ping <host-1>:29500; <user-1>@<host-1>:~$" in out


# What the diagnosis reads must survive: lines from the corpus (named) and the doctor's own texts.
KEPT = [
    # real032/r02: `Initializing a V1 LLM engine (v0.32.0) with config: model='/models/qwen2-1.5b', …`
    ("(EngineCore pid=7032) INFO 12-02 04:06:16 [core.py:133] Initializing a V1 LLM engine (v0.6.3.post1) "
     "with config: model='meta-llama/Llama-3.1-8B-Instruct', tokenizer_mode=auto, revision=None, dtype=torch.bfloat16",
     ["core.py:133", "v0.6.3.post1", "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_mode=auto", "revision=None",
      "dtype=torch.bfloat16", "12-02 04:06:16"]),
    ("ERROR 04-26 01:59:07 worker_base.py:157]     init_worker_distributed_environment(self.parallel_config",
     ["worker_base.py:157", "init_worker_distributed_environment", "self.parallel_config"]),
    # n05: `torch.distributed.DistBackendError: NCCL error in: …/NCCLUtils.hpp:268, unhandled system error`
    ("torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:268, unhandled system error, "
     "NCCL version 2.21.5", ["torch.distributed.DistBackendError", "NCCLUtils.hpp:268", "2.21.5"]),
    ("vllm.engine.arg_utils threading.local logger.info torch.int vllm.version 0.10.1.1 CUDA 12.1 cuda:0 cuda:10",
     ["vllm.engine.arg_utils", "threading.local", "logger.info", "torch.int", "0.10.1.1", "12.1", "cuda:0",
      "cuda:10"]),
    ("loading config.json model.safetensors tokenizer.model custom_all_reduce.cuh libnccl.so.2",
     ["config.json", "model.safetensors", "tokenizer.model", "custom_all_reduce.cuh", "libnccl.so.2"]),
    ("vllm serve Qwen/Qwen2.5-7B-Instruct --max-num-batched-tokens 8192 --host 0.0.0.0 --port 8000 "
     "--tokenizer-mode auto --kv-cache-dtype fp8",
     ["Qwen/Qwen2.5-7B-Instruct", "--max-num-batched-tokens 8192", "--host 0.0.0.0", "--tokenizer-mode auto"]),
    ("docker run --gpus all -v ~/.cache/huggingface:/root/.cache/huggingface --ipc host nvcr.io/nvidia/pytorch:24.01-py3",
     ["--ipc host", "nvcr.io/nvidia/pytorch:24.01-py3", "~/.cache/huggingface:/root/.cache/huggingface"]),
    # the doctor's own texts: nccl-shm's explanation, kv remedies, n10's note
    ("Between GPUs of one node NCCL passes data; 16 GiB of host RAM; VLLM_HOST_IP must be set per node; "
     "Halve the KV bytes per token: --kv-cache-dtype fp8; HF_TOKEN=<your-hf-token>; HF_TOKEN=<set, redacted>",
     ["node NCCL passes", "host RAM", "VLLM_HOST_IP must be set per node", "token: --kv-cache-dtype fp8",
      "HF_TOKEN=<your-hf-token>", "<set, redacted>"]),
    ("bos_token: <|begin_of_text|> api_key=None x[::2] x[1::2] c10::Error std::runtime_error "
     "failed to bind to [::]:29501 (errno: 98) busId 0000:1a:00.0 https://huggingface.co/meta-llama/Llama-3.1-8B",
     ["bos_token: <|begin_of_text|>", "api_key=None", "x[::2]", "x[1::2]", "c10::Error", "[::]:29501",
      "0000:1a:00.0", "https://huggingface.co/meta-llama/Llama-3.1-8B"]),
    # a pod name masked before does not take a later line's `vllm` with it (a line's end reads as a cut value)
    ("[pod/vllm-prod-7d9f8c6b5-x2k4q/vllm] INFO x\n$ kubectl logs pod/vllm-0 -c vllm", ["-c vllm", "/vllm] INFO"]),
]


@pytest.mark.parametrize("line, kept", KEPT)
def test_what_the_diagnosis_needs_survives(line, kept):
    out = Anonymizer().apply(line)
    for item in kept:
        assert item in out, (item, out)


def test_json_is_masked_string_by_string_never_inside_an_escape():
    """Masking the JSON text reached into `\\n` + a host name (`\\<host-1>`: no parser reads it; the seeded
    fuzzer met it in a real log with a URL after an escaped newline)."""
    from vllm_doctor.reports.anonymize import mask_json

    doc = json.dumps({"text": "line one\nnode7.cluster.example.com:8000", "node7.cluster.example.com": 1})
    masked = mask_json(doc, lambda s: s.replace("node7.cluster.example.com", "<host-1>"))
    assert json.loads(masked) == {"text": "line one\n<host-1>:8000", "<host-1>": 1}
