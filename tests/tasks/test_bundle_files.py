"""What of a bundle is uploaded (tasks/bundle_files.py): the built-in excludes, the
``.prefectrunpodignore`` file, and one test per secret rule, each refused by name before
anything is rented."""

from __future__ import annotations

import os

import pytest

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.tasks.bundle_files import (
    BUILTIN_EXCLUDES,
    IGNORE_FILE,
    SCAN_BYTES,
    SECRET_RULES,
    select_bundle_files,
)


def _bundle(root, files: dict[str, str | bytes]):
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def test_builtin_excludes_leave_caches_and_history_behind(tmp_path):
    assert BUILTIN_EXCLUDES == ("__pycache__/", ".git/", "*.pyc")
    root = _bundle(
        tmp_path,
        {
            "train.py": "print(1)\n",
            "__pycache__/train.cpython-311.pyc": b"\x00pyc",
            "pkg/__pycache__/m.cpython-311.pyc": b"\x00pyc",
            "pkg/old.pyc": b"\x00pyc",
            "pkg/m.py": "x = 1\n",
            ".git/HEAD": "ref: refs/heads/main\n",
            ".git/objects/ab/cdef": b"blob",
        },
    )
    chosen = select_bundle_files(root)
    assert chosen.files == ["pkg/m.py", "train.py"]
    assert chosen.ignored_files == 5
    assert chosen.total_bytes == len("print(1)\n") + len("x = 1\n")


def test_the_ignore_file_uses_gitignore_syntax(tmp_path):
    root = _bundle(
        tmp_path,
        {
            IGNORE_FILE: "# big things stay home\ndata/raw/\n*.ckpt\n!keep.ckpt\n/notes.txt\n",
            "train.py": "",
            "data/raw/a.jsonl": "{}\n",
            "data/small.jsonl": "{}\n",
            "old.ckpt": b"w",
            "keep.ckpt": b"w",
            "notes.txt": "n",
            "sub/notes.txt": "n",
        },
    )
    chosen = select_bundle_files(root)
    assert chosen.files == [
        IGNORE_FILE,
        "data/small.jsonl",
        "keep.ckpt",
        "sub/notes.txt",
        "train.py",
    ]


def test_the_ignore_file_can_take_a_builtin_exclude_back(tmp_path):
    root = _bundle(tmp_path, {IGNORE_FILE: "!*.pyc\n", "native.pyc": b"\x00", "t.py": ""})
    assert "native.pyc" in select_bundle_files(root).files


def test_an_output_dir_inside_the_bundle_is_never_uploaded(tmp_path):
    root = _bundle(tmp_path, {"t.py": "", "prefect-runpod-runs/r1/pod-ssh-key": "k"})
    chosen = select_bundle_files(root, skip_dirs=[root / "prefect-runpod-runs"])
    assert chosen.files == ["t.py"]


_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"

# One bundle file per rule of SECRET_RULES: (path, content, what the message calls it).
SECRET_CASES = [
    (".env", "HF_TOKEN=abc\n", "a dotenv file"),
    ("config/prod.env", "DB=x\n", "a dotenv file"),
    ("keys/deploy", _KEY, "a private key"),
    ("certs/server.pem", "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n", "a private key"),
    ("home/.aws/credentials", "[default]\nx=1\n", "AWS credentials"),
    ("aws.ini", "[default]\naws_secret_access_key = abc\n", "AWS credentials"),
    (
        "sa.json",
        '{"type": "service_account", "project_id": "p"}',
        "a Google Cloud credentials file",
    ),
    ("application_default_credentials.json", "{}", "a Google Cloud credentials file"),
    ("u/.azure/accessTokens.json", "[]", "Azure CLI credentials"),
    (
        ".netrc",
        "machine h login u password p\n",
        "a password file (netrc, pgpass, git credentials)",
    ),
    ("x/.docker/config.json", '{"auths": {}}', "a registry login (docker, npm, PyPI)"),
    ("h/.kube/config", "apiVersion: v1\n", "a Kubernetes config"),
    ("kc.yaml", "users:\n- user:\n    client-key-data: AAAA\n", "a Kubernetes config"),
    ("cache/huggingface/token", "x\n", "a saved Hugging Face login"),
    ("notes.md", "my token hf_" + "a1B2" * 9 + "\n", "a Hugging Face token"),
    ("org.txt", "api_org_" + "q" * 30, "a Hugging Face org API token"),
    ("run.sh", "export RUNPOD_API_KEY=rpa_" + "X7" * 16, "a RunPod API key"),
    ("s3.txt", "rps_" + "k3" * 16, "a RunPod S3 secret key"),
    ("aws.txt", "id AKIAIOSFODNN7EXAMPLE\n", "an AWS access key id"),
    ("gh.txt", "ghp_" + "r" * 36, "a GitHub token"),
    ("openai.py", "KEY = 'sk-" + "p" * 40 + "'\n", "an OpenAI-style API key"),
    ("slack.txt", "xoxb-123456789012-abcdef", "a Slack token"),
    ("g.txt", "AIza" + "Sy" * 17 + "A", "a Google API key"),
]


def test_every_rule_has_a_case():
    assert {what for _, _, what in SECRET_CASES} == {rule.what for rule in SECRET_RULES}


@pytest.mark.parametrize(("rel", "content", "what"), SECRET_CASES, ids=[c[0] for c in SECRET_CASES])
def test_each_secret_rule_refuses_the_file_by_name(tmp_path, rel, content, what):
    root = _bundle(tmp_path, {"train.py": "print('ok')\n", rel: content})
    with pytest.raises(SpecError) as info:
        select_bundle_files(root)
    text = str(info.value)
    assert f"{rel} ({what})" in text
    assert IGNORE_FILE in text and "--allow-secret-file" in text
    assert "train.py" not in text


def test_all_secret_files_are_named_at_once_and_none_is_repeated(tmp_path):
    token = "hf_" + "Z" * 34
    root = _bundle(tmp_path, {".env": f"HF_TOKEN={token}\n", "id_ed25519": _KEY, "t.py": ""})
    with pytest.raises(SpecError) as info:
        select_bundle_files(root)
    text = str(info.value)
    assert "2 file(s)" in text and ".env (a dotenv file)" in text
    assert "id_ed25519 (a private key)" in text
    assert token not in text and "OPENSSH" not in text


def test_examples_and_templates_of_dotenv_pass_unless_they_hold_a_token(tmp_path):
    root = _bundle(tmp_path, {".env.example": "HF_TOKEN=\n", "t.py": ""})
    assert ".env.example" in select_bundle_files(root).files
    (root / ".env.example").write_text("HF_TOKEN=hf_" + "R" * 34 + "\n")
    with pytest.raises(SpecError, match=r"\.env\.example \(a Hugging Face token\)"):
        select_bundle_files(root)


def test_a_secret_can_be_sent_on_purpose(tmp_path):
    root = _bundle(tmp_path, {".env": "A=1\n", "keys/k": _KEY, "t.py": ""})
    chosen = select_bundle_files(root, allow_secret_files=[".env", "keys/"])
    assert chosen.files == [".env", "keys/k", "t.py"]
    assert chosen.allowed_secrets == [".env", "keys/k"]
    with pytest.raises(SpecError, match=r"keys/k \(a private key\)"):
        select_bundle_files(root, allow_secret_files=[".env"])


def test_an_ignored_secret_is_neither_sent_nor_refused(tmp_path):
    root = _bundle(tmp_path, {IGNORE_FILE: ".env\n", ".env": "A=1\n", "t.py": ""})
    assert select_bundle_files(root).files == [IGNORE_FILE, "t.py"]


def test_the_scan_reads_the_first_64_kib_only(tmp_path):
    assert SCAN_BYTES == 64 * 1024
    token = b"\nhf_" + b"L" * 34
    near = b"a" * (SCAN_BYTES - len(token)) + token
    far = b"a" * SCAN_BYTES + token
    root = _bundle(tmp_path, {"near.bin": near, "far.bin": far})
    with pytest.raises(SpecError) as info:
        select_bundle_files(root)
    assert "near.bin" in str(info.value) and "far.bin" not in str(info.value)


def test_the_scan_never_follows_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "credentials").write_text(_KEY)
    root = _bundle(tmp_path / "bundle", {"t.py": ""})
    os.symlink(outside / "credentials", root / "linked-key")
    chosen = select_bundle_files(root)
    # Listed as the transfer sees it; its target is not read (where links may point
    # is the manifest's rule).
    assert chosen.files == ["linked-key", "t.py"]


def test_the_demo_bundle_and_the_lora_example_upload_cleanly():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples"
    for bundle in ("demo", "lora-sft"):
        chosen = select_bundle_files(root / bundle)
        assert "bundle.toml" in chosen.files
        assert not any(p.endswith(".pyc") or "__pycache__" in p for p in chosen.files)
