"""A new user's bad input, kind by kind, through the CLI's ``main(argv)`` in-process:
each is refused before anything is rented, with one sentence naming what was wrong and
what to do, exit status 2, no traceback, and no pod created (none on this machine's
local-pod registry, no request to the emulated RunPod API but reads of its GPU catalog).

Cases that look up saved blocks need the Prefect API (marked slow); the two cases at
the end run the real ``prefect-runpod`` in a subprocess to show that nothing, not even
Prefect's temporary server, starts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from prefect_runpod.blocks.keys import generate_keypair
from prefect_runpod.blocks.local_pod.provider import LocalPodProvider
from prefect_runpod.blocks.provider import PodRequest
from prefect_runpod.flows.cli import EXIT_USAGE, main
from tests.emulators.runpod_api import RunPodEmulator
from tests.fixtures.demo_bundle import copy_demo_bundle
from tests.fixtures.leaks import sentinel_pieces, shaped_sentinels

TOKEN = "hf_" + "Sentinel" * 4 + "x1"
SHAPED = shaped_sentinels("rpa_")
KEY_TEXT = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


@dataclass(frozen=True)
class Case:
    """One kind of bad input.

    Attributes:
        id: the kind, as the test id.
        argv: the command line; ``{tmp}`` is the test's temp dir, ``{bundle}`` a copy of
            the demo bundle (made only when used), ``{free_plus}`` a size in bytes larger
            than the free space under the pod home.
        match: a fragment of the one-sentence message (a plain substring).
        runpod: run with RunPod's API emulated (and an API key and SSH key in the env).
        files: files to create first (path under ``{tmp}`` or ``{bundle}`` -> text).
        env: environment changes (value None unsets).
        api: a case whose checks reach the Prefect API (a saved block named next to the
            bad input): it runs against the session's test server, so the CLI does not
            start (and stop) a temporary one of its own.
    """

    id: str
    argv: list[str]
    match: str
    runpod: bool = False
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str | None] = field(default_factory=dict)
    api: bool = False


def ft(*args: str) -> list[str]:
    return ["finetune", *args]


def rp(*args: str) -> list[str]:
    return ["finetune", "--provider", "runpod", *args]


TOML = '[job]\ntrain = "{python} train.py"\n'
NUMBER = "must be a finite number"

CASES = [
    # --- the bundle ---
    Case("bundle-missing", ft("--bundle", "{tmp}/nope"), "does not exist: pass --bundle DIR"),
    Case("bundle-is-a-file", ft("--bundle", "{tmp}/f"), "is a file, not a directory", files={"{tmp}/f": "x"}),
    Case("bundle-without-toml", ft("--bundle", "{tmp}/b"), "bundle.toml is missing", files={"{tmp}/b/train.py": ""}),
    Case("bundle-toml-unreadable", ft("--bundle", "{tmp}/b"), "bundle.toml cannot be read", files={"{tmp}/b/bundle.toml": "[job\n"}),
    Case("bundle-without-train", ft("--bundle", "{tmp}/b"), "needs a [job] table with a 'train' command", files={"{tmp}/b/bundle.toml": '[job]\neval = "x"\n'}),
    Case("bundle-outputs-absolute", ft("--bundle", "{tmp}/b"), "must be a relative path inside the bundle", files={"{tmp}/b/bundle.toml": TOML + 'outputs = "/srv/out"\n'}),
    Case("bundle-outputs-escape", ft("--bundle", "{tmp}/b"), "must be a relative path inside the bundle", files={"{tmp}/b/bundle.toml": TOML + 'outputs = "../out"\n'}),
    Case("bundle-format-no-group", ft("--bundle", "{tmp}/b"), "must have exactly one capture group", files={"{tmp}/b/bundle.toml": TOML + 'output_format = "x"\n'}),
    Case("bundle-format-bad-regex", ft("--bundle", "{tmp}/b"), "is not a valid regex", files={"{tmp}/b/bundle.toml": TOML + 'output_format = "("\n'}),
    Case("bundle-everything-ignored", ft("--bundle", "{tmp}/b"), "has no file to upload", files={"{tmp}/b/bundle.toml": TOML, "{tmp}/b/.prefectrunpodignore": "*\n"}),
    Case("bundle-ignore-file-broken", ft("--bundle", "{bundle}"), "has a line gitignore cannot read", files={"{bundle}/.prefectrunpodignore": "!\n"}),
    Case("bundle-dotenv", ft("--bundle", "{bundle}"), ".env (a dotenv file)", files={"{bundle}/.env": "WANDB_API_KEY=abc\n"}),
    Case("bundle-private-key", ft("--bundle", "{bundle}"), "deploy_key (a private key)", files={"{bundle}/deploy_key": KEY_TEXT}),
    Case("bundle-aws-credentials", ft("--bundle", "{bundle}"), ".aws/credentials (AWS credentials)", files={"{bundle}/.aws/credentials": "[default]\n"}),
    Case("bundle-token-in-a-file", ft("--bundle", "{bundle}"), "notes.txt (a Hugging Face token)", files={"{bundle}/notes.txt": f"token {TOKEN}\n"}),
    Case("bundle-larger-than-disk", ft("--bundle", "{bundle}"), "more than the free space under", files={"{bundle}/data/huge.bin": "{free_plus}"}),
    # --- names ---
    Case("prefix-uppercase", ft("--name-prefix", "Prft"), "must be 1-23 lowercase letters"),
    Case("prefix-24-chars", ft("--name-prefix", "p" * 24), "must be 1-23 lowercase letters"),
    Case("prefix-digit-first", ft("--name-prefix", "9lives"), "starting with a letter"),
    Case("prefix-empty", ft("--name-prefix", ""), "must be 1-23 lowercase letters"),
    Case("prefix-underscore", ft("--name-prefix", "my_runs"), "must be 1-23 lowercase letters"),
    Case("model-id-bad-chars", ft("--model-id", "not a repo!"), "is not a Hugging Face repo id"),
    Case("model-id-three-parts", ft("--model-id", "a/b/c"), "is not a Hugging Face repo id"),
    Case("concurrency-limit-bad", ft("--concurrency-limit", "gpu pool"), "is not a concurrency limit name"),
    Case("block-name-malformed", rp("--runpod-spec", "My_Spec"), "runpod_spec_block (--runpod-spec) 'My_Spec' is not a block name", runpod=True),
    # --- numbers ---
    Case("cost-nan", ft("--max-cost-usd", "nan"), f"max_cost_usd (--max-cost-usd) {NUMBER} of USD"),
    Case("cost-inf", ft("--max-cost-usd", "inf"), "got inf"),
    Case("cost-zero", ft("--max-cost-usd", "0"), "above 0"),
    Case("cost-negative", ft("--max-cost-usd", "-1"), "above 0"),
    Case("cost-huge", ft("--max-cost-usd", "1e9"), "at most 100000"),
    Case("runtime-nan", ft("--max-runtime-seconds", "nan"), f"max_runtime_seconds (--max-runtime-seconds) {NUMBER} of seconds"),
    Case("runtime-zero", ft("--max-runtime-seconds", "0"), "max_runtime_seconds (--max-runtime-seconds)"),
    Case("runtime-negative", ft("--max-runtime-seconds", "-5"), "got -5"),
    Case("runtime-inf", ft("--max-runtime-seconds", "inf"), "got inf"),
    Case("runtime-over-lifetime", ft("--max-runtime-seconds", "7200", "--pod-lifetime-seconds", "3600"), "the pod would remove itself before training could finish"),
    Case("tolerance-one", ft("--parity-tolerance", "1"), "parity_tolerance (--parity-tolerance)"),
    Case("tolerance-negative", ft("--parity-tolerance", "-0.1"), "at least 0"),
    Case("tolerance-nan", ft("--parity-tolerance", "nan"), "got nan"),
    Case("local-cost-negative", ft("--local-cost-per-hr", "-0.22"), "local_cost_per_hr (--local-cost-per-hr)"),
    Case("local-cost-nan", ft("--local-cost-per-hr", "nan"), "of USD per hour"),
    Case("heartbeat-zero", ft("--heartbeat-stale-seconds", "0"), "heartbeat_stale_seconds (--heartbeat-stale-seconds)"),
    Case("heartbeat-nan", ft("--heartbeat-stale-seconds", "nan"), "e.g. --heartbeat-stale-seconds 900"),
    Case("lifetime-negative", ft("--pod-lifetime-seconds", "-5"), "pod_lifetime_seconds (--pod-lifetime-seconds)"),
    Case("lifetime-inf", ft("--pod-lifetime-seconds", "inf"), "the hard cap on the pod's life"),
    Case("recovery-usd-negative", ft("--max-recovery-usd", "-0.5"), "max_recovery_usd (--max-recovery-usd) must be a finite number of USD above 0"),
    Case("recovery-usd-nan", ft("--max-recovery-usd", "nan"), "got nan: give the recovery spend cap"),
    # --- options of the other provider ---
    Case("gpu-type-on-local", ft("--gpu-type", "NVIDIA GeForce RTX 3090"), "gpu_type_ids (--gpu-type) applies only to --provider runpod"),
    Case("runpod-spec-on-local", ft("--runpod-spec", "spec"), "applies only to --provider runpod"),
    Case("runpod-credentials-on-local", ft("--runpod-credentials", "creds"), "applies only to --provider runpod"),
    Case("ssh-key-on-local", ft("--ssh-key", "key"), "ssh_key_block (--ssh-key) applies only"),
    Case("local-mode-on-runpod", rp("--local-mode", "direct"), "local_mode (--local-mode) applies only to --provider local", runpod=True),
    Case("local-cost-on-runpod", rp("--local-cost-per-hr", "0.22"), "local_cost_per_hr (--local-cost-per-hr) applies only", runpod=True),
    # --- the transfer ---
    Case("transfer-sftp-on-gateway", ft("--transfer", "sftp"), "'sftp' cannot work with a local pod in gateway mode"),
    Case("transfer-runpodctl-missing", ft("--transfer", "runpodctl"), "runpodctl is not installed on this machine", env={"PATH": "/nonexistent"}),
    Case("transfer-s3-without-target", ft("--transfer", "s3"), "needs a saved S3Target block"),
    Case("s3-target-with-pty", ft("--transfer", "pty", "--s3-target", "vol"), "is only used by --transfer s3", api=True),
    # --- Hugging Face ---
    Case("hf-endpoint-not-a-url", ft("--hf-endpoint", "not-a-url"), "hf_endpoint (--hf-endpoint) 'not-a-url' must start with http"),
    Case("hf-endpoint-ftp", ft("--hf-endpoint", "ftp://hub.example"), "must start with http:// or https://"),
    Case("hf-endpoint-with-password", ft("--hf-endpoint", "https://me:pw@hub.example"), "carries credentials"),
    Case("hf-endpoint-bad-port", ft("--hf-endpoint", "https://hub.example:0x1"), "has an invalid port"),
    Case("hf-token-env-bad-name", ft("--hf-token-env", "1TOKEN"), "is not an environment variable name"),
    Case("hf-token-env-is-a-token", ft("--hf-token-env", TOKEN), "looks like a token itself"),
    Case("hf-two-token-sources", ft("--hf-credentials", "a", "--hf-token-secret", "b"), "give one of them"),
    Case("token-in-a-parameter", ft("--model-id", "org/m", "--concurrency-limit", TOKEN), "looks like a Hugging Face token"),
    # --- the output dir ---
    Case("output-dir-is-a-file", ft("--output-dir", "{tmp}/f"), "is a file, not a directory", files={"{tmp}/f": "x"}),
    Case("output-dir-under-a-file", ft("--output-dir", "{tmp}/f/out"), "which is a file", files={"{tmp}/f": "x"}),
    Case("output-dir-unwritable", ft("--output-dir", "/proc/prefect-runpod-out"), "is not writable"),
    Case("output-dir-not-empty", ft("--output-dir", "{tmp}/out"), "/out is not empty (model.json, stale.txt): give a new or empty folder, or pass overwrite (--overwrite)", files={"{tmp}/out/model.json": "{}", "{tmp}/out/stale.txt": "x"}),
    # --- RunPod ---
    Case("runpod-without-api-key", rp(), "RunPod needs an API key", runpod=True, env={"RUNPOD_API_KEY": None}),
    Case("runpod-without-ssh-key", rp(), "no SSH key for RunPod", runpod=True, env={"RUNPOD_SSH_KEY_PATH": "{tmp}/no-key"}),
    Case("runpod-gpu-type-garbage", rp("--gpu-type", 'RTX" }) { id }'), "invalid GPU type id", runpod=True),
    Case("runpod-gpu-type-near-miss", rp("--gpu-type", "NVIDIA RTX 4090"), "unknown GPU type id 'NVIDIA RTX 4090' (did you mean NVIDIA GeForce RTX 4090?)", runpod=True),
    # --- issue 21: a key or token of the wrong shape, named, never shown ---
    Case("runpod-key-with-a-space", rp(), "RUNPOD_API_KEY has a space inside it: remove it", runpod=True, env={"RUNPOD_API_KEY": SHAPED["space"]}),
    Case("runpod-key-two-newlines", rp(), "RUNPOD_API_KEY ends with a newline: remove it", runpod=True, env={"RUNPOD_API_KEY": SHAPED["trailing_newline"] + "\n"}),
    Case("hf-token-newline-inside", ft(), "HF_TOKEN has a newline inside it: remove it", env={"HF_TOKEN": SHAPED["inner_newline"]}),
    Case("hf-token-env-with-a-tab", ft("--hf-token-env", "MY_HF_TOKEN"), "MY_HF_TOKEN has a tab inside it: remove it", env={"MY_HF_TOKEN": SHAPED["tab"]}),
    # --- publishing from the pod ---
    Case("download-none-without-publish", ft("--download", "none"), "--download none leaves the model only on the pod"),
    Case("publish-without-namespace", ft("--publish", "hf:tiny-classifier"), "must name the namespace and the repo"),
    Case("publish-bad-repo-name", ft("--publish", "hf:demo/bad--name"), "Cannot have -- or .. in repo_id"),
    Case("publish-bad-branch", ft("--publish", "hf:demo/x@a..b"), "is not a branch name git accepts"),
    Case("publish-unknown-target", ft("--publish", "gs:bucket"), "is not one of: hf:ORG/REPO[@BRANCH] or s3[:PREFIX]"),
    Case("publish-s3-without-target", ft("--publish", "s3"), "writes into the saved S3Target named by --s3-target"),
    Case("publish-public-without-hub", ft("--publish-public"), "--publish-public makes a Hub repo public"),
    # --- argparse: unknown choices and non-numbers ---
    Case("transfer-unknown", ft("--transfer", "scp"), "invalid choice: 'scp'"),
    Case("provider-unknown", ft("--provider", "aws"), "invalid choice: 'aws'"),
    Case("local-mode-unknown", ft("--local-mode", "ssh"), "invalid choice: 'ssh'"),
    Case("cost-not-a-number", ft("--max-cost-usd", "two"), "invalid float value: 'two'"),
    Case("download-unknown", ft("--download", "half"), "invalid choice: 'half'"),
    Case("pty-framing-unknown", ft("--pty-framing", "binary"), "invalid choice: 'binary'"),
    Case("pty-streams-zero", ft("--pty-streams", "0"), "pty_streams (--pty-streams) must be a whole number"),
    Case("pty-streams-too-many", ft("--pty-streams", "64"), "at most 16"),
    # --- the other commands ---
    Case("terminate-without-id", ["terminate"], "give a POD_ID or --name NAME"),
    Case("pods-bad-prefix", ["pods", "--name-prefix", "BAD"], "must be 1-23 lowercase letters"),
    Case("reaper-ttl-nan", ["reaper", "--ttl-seconds", "nan"], "ttl_seconds (--ttl-seconds)"),
    Case("reaper-ttl-zero", ["reaper", "--ttl-seconds", "0"], "above 0"),
    Case("reaper-bad-prefix", ["reaper", "--name-prefix", "X"], "must be 1-23 lowercase letters"),
    Case("reaper-ttl-negative", ["reaper", "--ttl-seconds", "-1"], "above 0"),
    # --- issue 14: liveness, terminate deadline, ids, the cost command ---
    Case("pod-poll-zero", ft("--pod-poll-seconds", "0"), "pod_poll_seconds (--pod-poll-seconds)"),
    Case("pod-poll-inf", ft("--pod-poll-seconds", "inf"), "pod_poll_seconds (--pod-poll-seconds)"),
    Case("terminate-timeout-negative", ft("--terminate-timeout-seconds", "-5"), "terminate_timeout_seconds (--terminate-timeout-seconds)"),
    Case("terminate-id-newline", ["terminate", "abcdefgh\n"], "is not a pod id"),
    Case("terminate-id-hyphen", ["terminate", "lp-abc"], "is not a pod id"),
    Case("terminate-id-quote", ["terminate", '"abc'], "is not a pod id"),
    Case("cost-run-id-garbage", ["cost", "not-a-run"], "is not a flow run id"),
    Case("cost-run-id-newline", ["cost", "3f1b2c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d\n"], "is not a flow run id"),
    # --- issue 24: argument errors, all refused before Prefect is imported ---
    Case("bundle-empty-path", ft("--bundle", ""), "bundle (--bundle) is an empty path"),
    Case("bundle-blank-path", ft("--bundle", "  "), "bundle (--bundle) is an empty path"),
    Case("output-dir-empty-path", ft("--output-dir", ""), "output_dir (--output-dir) is an empty path"),
    Case("allow-secret-file-empty", ft("--allow-secret-file", ""), "allow_secret_files (--allow-secret-file) is an empty path"),
    Case("allow-secret-file-absolute", ft("--allow-secret-file", "/etc/passwd"), "'/etc/passwd' is outside the bundle"),
    Case("allow-secret-file-escapes", ft("--allow-secret-file", "../keys/id_rsa"), "'../keys/id_rsa' is outside the bundle"),
    Case("job-key-misspelt", ft("--bundle", "{tmp}/b"), "unknown key 'requirments' in [job]: did you mean 'requirements'?", files={"{tmp}/b/bundle.toml": TOML + "requirments = []\n"}),
    Case("job-key-unknown", ft("--bundle", "{tmp}/b"), "unknown key 'gpus' in [job]", files={"{tmp}/b/bundle.toml": TOML + "gpus = 2\n"}),
    Case("train-command-nul", ft("--bundle", "{tmp}/b"), "the train command holds a control character (NUL", files={"{tmp}/b/bundle.toml": '[job]\ntrain = "{python} train.py\\u0000; echo hidden"\n'}),
    Case("eval-command-escape", ft("--bundle", "{tmp}/b"), "the eval command holds a control character (ESC", files={"{tmp}/b/bundle.toml": TOML + 'eval = "{python} eval.py\\u001b[2J"\n'}),
    Case("requirement-not-pip", ft("--bundle", "{tmp}/b"), "requirement 'torch>>2' is not a pip requirement specifier", files={"{tmp}/b/bundle.toml": TOML + 'requirements = ["torch>>2"]\n'}),
    Case("requirement-a-command", ft("--bundle", "{tmp}/b"), "requirement 'pip install x' is not a pip requirement specifier", files={"{tmp}/b/bundle.toml": TOML + 'requirements = ["pip install x"]\n'}),
    Case("bundle-fifo", ft("--bundle", "{bundle}"), "data/queue (a FIFO)", files={"{bundle}/data/queue": "{fifo}"}),
    Case("bundle-socket", ft("--bundle", "{bundle}"), "agent.sock (a socket)", files={"{bundle}/agent.sock": "{socket}"}),
    Case("file-name-not-utf8", ft("--bundle", "{bundle}"), "'data/caf\\xe9.txt' (its name is not valid UTF-8)", files={"{bundle}/data/caf\udce9.txt": "x"}),
    Case("file-name-newline", ft("--bundle", "{bundle}"), "'a\\nb.txt' (its name holds a newline)", files={"{bundle}/a\nb.txt": "x"}),
    Case("file-name-control", ft("--bundle", "{bundle}"), "'x\\x1by.txt' (its name holds ESC, U+001B)", files={"{bundle}/x\x1by.txt": "x"}),
    Case("runtime-minus-inf", ft("--max-runtime-seconds", "-inf"), "max_runtime_seconds (--max-runtime-seconds) must be a finite number of seconds above 0 and at most 2592000, got -inf"),
    Case("cost-minus-exponent", ft("--max-cost-usd", "-1e3"), "max_cost_usd (--max-cost-usd) must be a finite number of USD above 0"),
    Case("cost-limit-negative", ["cost", "--limit", "-1"], "limit (--limit) must be a whole number at least 1"),
    Case("cost-limit-zero", ["cost", "--limit", "0"], "limit (--limit) must be a whole number at least 1"),
    Case("cost-limit-huge", ["cost", "--limit", "100000"], "at most 1000"),
    Case("status-limit-negative", ["status", "--limit", "-3"], "limit (--limit) must be a whole number at least 1"),
    Case("logs-max-seconds-negative", ["logs", "3f1b2c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", "--follow", "--max-seconds", "-5"], "max_seconds (--max-seconds) must be"),
    Case("cost-since-huge", ["cost", "--since", "99999999999d"], "--since '99999999999d' reaches back more than"),
    Case("cost-since-negative", ["cost", "--since", "-5d"], "--since '-5d' is not a duration"),
    Case("cost-since-future", ["cost", "--since", "2999-01-01T00:00:00Z"], "is in the future"),
    Case("reaper-ttl-minus-inf", ["reaper", "--ttl-seconds", "-inf"], "ttl_seconds (--ttl-seconds) must be"),
    Case("resume-from-empty-path", ft("--resume-from", ""), "resume_from (--resume-from) is an empty path"),
    Case("job-table-misspelt", ft("--bundle", "{tmp}/b"), "unknown key 'jobs' in the top level: did you mean 'job'?", files={"{tmp}/b/bundle.toml": TOML + "[jobs]\neval = 'x'\n"}),
    Case("job-table-capitalised", ft("--bundle", "{tmp}/b"), "unknown key 'Job' in the top level: did you mean 'job'?", files={"{tmp}/b/bundle.toml": TOML.replace("[job]", "[Job]")}),
    Case("outputs-nul", ft("--bundle", "{tmp}/b"), "outputs: 'out\\x00' holds a control character (NUL, U+0000)", files={"{tmp}/b/bundle.toml": TOML + 'outputs = "out\\u0000"\n'}),
    Case("checkpoint-marker-escape", ft("--bundle", "{tmp}/b"), "checkpoint_marker: 'do\\x1bne' holds a control character (ESC, U+001B)", files={"{tmp}/b/bundle.toml": TOML + 'checkpoints = "ck"\ncheckpoint_marker = "do\\u001bne"\nresume_from_env = true\n'}),
    # --- issue 24: a boolean or numeric [job] key written as another TOML type ---
    Case("job-bool-a-string", ft("--bundle", "{tmp}/b"), '[job] resume_from_env = "yes" is a string, but resume_from_env must be a boolean (true or false, unquoted)', files={"{tmp}/b/bundle.toml": TOML + 'resume_from_env = "yes"\n'}),
    Case("job-bool-a-number", ft("--bundle", "{tmp}/b"), "[job] resume_from_env = 1 is a whole number, but resume_from_env must be a boolean", files={"{tmp}/b/bundle.toml": TOML + "resume_from_env = 1\n"}),
    Case("job-count-a-string", ft("--bundle", "{tmp}/b"), '[job] keep_checkpoints = "2" is a string, but keep_checkpoints must be a whole number (unquoted, e.g. 2)', files={"{tmp}/b/bundle.toml": TOML + 'keep_checkpoints = "2"\n'}),
    Case("job-count-a-decimal", ft("--bundle", "{tmp}/b"), "[job] keep_checkpoints = 2.0 is a decimal number, but keep_checkpoints must be a whole number", files={"{tmp}/b/bundle.toml": TOML + "keep_checkpoints = 2.0\n"}),
    Case("job-seconds-a-string", ft("--bundle", "{tmp}/b"), '[job] expected_runtime_seconds = "600" is a string, but expected_runtime_seconds must be a number (unquoted, e.g. 600)', files={"{tmp}/b/bundle.toml": TOML + 'expected_runtime_seconds = "600"\n'}),
    Case("job-seconds-a-boolean", ft("--bundle", "{tmp}/b"), "[job] expected_runtime_seconds = true is a boolean, but expected_runtime_seconds must be a number", files={"{tmp}/b/bundle.toml": TOML + "expected_runtime_seconds = true\n"}),
    Case("pods-block-name-malformed", ["pods", "--provider", "runpod", "--runpod-credentials", "Team_Key"], "runpod_credentials_block (--runpod-credentials) 'Team_Key' is not a block name"),
    Case("ssh-key-name-malformed", ["ssh", "abc", "--provider", "runpod", "--ssh-key", "My Key"], "ssh_key_block (--ssh-key) 'My Key' is not a block name"),
    Case("reaper-block-name-malformed", ["reaper", "--dry-run", "--provider", "runpod", "--runpod-credentials", "X"], "runpod_credentials_block (--runpod-credentials) 'X' is not a block name"),
    Case("check-hf-token-env-bad", ["check", "--hf-token-env", "1TOKEN"], "hf_token_env (--hf-token-env) '1TOKEN' is not an environment variable name"),
    Case("output-dir-escape", ft("--output-dir", "out\x1b[31m"), "output_dir (--output-dir) 'out\\x1b[31m' holds a control character (ESC, U+001B)"),
    Case("bundle-path-newline", ft("--bundle", "b\n"), "bundle (--bundle) 'b\\n' holds a control character (a newline, U+000A)"),
    Case("allow-secret-file-newline", ft("--allow-secret-file", "x\ny"), "allow_secret_files (--allow-secret-file) 'x\\ny' holds a control character (a newline"),
    Case("resume-from-newline", ft("--resume-from", "x\ny"), "resume_from (--resume-from) 'x\\ny' holds a control character"),
    Case("hf-endpoint-unclosed-bracket", ft("--hf-endpoint", "http://[::1"), "hf_endpoint (--hf-endpoint) 'http://[::1' is not a URL"),
    Case("api-url-unclosed-bracket", ["status"], "PREFECT_API_URL 'http://[::1' is not a URL", env={"PREFECT_API_URL": "http://[::1"}),
    Case("pod-home-read-only", ft(), "the local pods' home /proc/prefect-runpod-pods cannot be created", env={"PREFECT_RUNPOD_HOME": "/proc/prefect-runpod-pods"}),
]  # fmt: skip

# Argument errors: decidable from the arguments and files alone, so refused before
# Prefect is imported (held in a subprocess by test_argument_errors_never_import_prefect).
ARGUMENT_CASES = [c for c in CASES if c.id in {
    "bundle-empty-path", "output-dir-empty-path", "allow-secret-file-absolute",
    "job-key-misspelt", "train-command-nul", "requirement-not-pip", "bundle-fifo",
    "file-name-newline", "runtime-minus-inf", "cost-limit-negative", "cost-since-huge",
    "cost-since-negative", "status-limit-negative", "reaper-ttl-minus-inf", "cost-nan",
    "prefix-uppercase", "bundle-missing", "terminate-id-hyphen", "cost-run-id-garbage",
    "api-url-unclosed-bracket", "resume-from-empty-path", "job-table-misspelt", "outputs-nul",
    "pods-block-name-malformed", "reaper-block-name-malformed", "bundle-path-newline",
    "allow-secret-file-newline",
}]  # fmt: skip

# Saved blocks are looked up on the Prefect API: these need a server (slow).
BLOCK_CASES = [
    Case("runpod-spec-missing", rp("--runpod-spec", "capped-3090s"), "no RunPodPodSpec block is named 'capped-3090s'", runpod=True),
    Case("runpod-credentials-missing", rp("--runpod-credentials", "team-key"), "no RunPodCredentials block is named 'team-key'", runpod=True),
    Case("ssh-key-missing", rp("--ssh-key", "laptop"), "no RunPodSSHKey block is named 'laptop'", runpod=True),
    Case("s3-target-missing", ft("--transfer", "s3", "--s3-target", "vol-eu"), "no S3Target block is named 'vol-eu'"),
    Case("hf-credentials-missing", ft("--hf-credentials", "hf-reader"), "no HuggingFaceCredentials block is named 'hf-reader'"),
    Case("hf-token-secret-missing", ft("--hf-token-secret", "hf-tok"), "no Secret block is named 'hf-tok'"),
    Case("concurrency-limit-missing", ft("--concurrency-limit", "no-such-pool"), "global concurrency limit 'no-such-pool' does not exist"),
]  # fmt: skip


READS = {"listGpuTypes"}
"""The one call preflight makes to RunPod: its GPU catalog, read (the GPU ids, their
hosts' CUDA versions)."""

ARGPARSE_CASES = {
    "pty-framing-unknown",
    "transfer-unknown",
    "provider-unknown",
    "local-mode-unknown",
    "cost-not-a-number",
    "download-unknown",
}


def test_the_table_covers_at_least_sixty_kinds():
    ids = [c.id for c in CASES + BLOCK_CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 60, len(ids)


@pytest.fixture(scope="module")
def runpod_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunPodEmulator]:
    emu = RunPodEmulator(
        api_key=f"rpa_{secrets.token_hex(16)}", home=tmp_path_factory.mktemp("rp") / "pods"
    )
    emu.start()
    try:
        yield emu
    finally:
        assert emu.stop() == []


def _fill(text: str, tmp: Path, bundle: Callable[[], Path]) -> str:
    if "{bundle}" in text:
        text = text.replace("{bundle}", str(bundle()))
    return text.replace("{tmp}", str(tmp))


def _pod_home_free_plus() -> int:
    home = LocalPodProvider().home
    while not home.exists():
        home = home.parent
    return shutil.disk_usage(home).free + 2**30


def _make_files(case: Case, tmp_path: Path, bundle: Callable[[], Path]) -> None:
    for rel, content in case.files.items():
        path = Path(_fill(rel, tmp_path, bundle))
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "{free_plus}":
            with open(path, "wb") as fh:
                fh.truncate(_pod_home_free_plus())  # sparse: costs no disk
        elif content == "{fifo}":
            os.mkfifo(path)
        elif content == "{socket}":  # bound by a relative name: AF_UNIX paths are short
            here = Path.cwd()
            os.chdir(path.parent)
            try:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.bind(path.name)
            finally:
                os.chdir(here)
        else:
            path.write_text(content)


def _run_case(case: Case, tmp_path: Path, monkeypatch, capfd, emu: RunPodEmulator | None):
    made: list[Path] = []

    def bundle() -> Path:
        if not made:
            made.append(copy_demo_bundle(tmp_path / "bundle"))
        return made[0]

    _make_files(case, tmp_path, bundle)
    if emu is not None:
        key = tmp_path / "id_ed25519_runpod"
        key.write_text(generate_keypair("table").private_key.get_secret_value())
        monkeypatch.setenv("RUNPOD_API_BASE_URL", emu.base_url)
        monkeypatch.setenv("RUNPOD_API_KEY", emu.api_key)
        monkeypatch.setenv("RUNPOD_SSH_KEY_PATH", str(key))
    for name, value in case.env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, _fill(value, tmp_path, bundle))
    monkeypatch.chdir(tmp_path)
    argv = [_fill(a, tmp_path, bundle) for a in case.argv]
    pods_before = {h.pod_id for h in LocalPodProvider().list("")}
    requests_before = len(emu.requests) if emu is not None else 0
    capfd.readouterr()
    status = main(argv)
    out, err = capfd.readouterr()
    assert status == EXIT_USAGE, out + err
    assert case.match in err, err
    assert "Traceback" not in out + err
    assert TOKEN not in out + err, "a token is never repeated"
    for value in SHAPED.values():
        assert not [p for p in sentinel_pieces(value) if p in out + err], "a key is never shown"
    assert {h.pod_id for h in LocalPodProvider().list("")} == pods_before, "a pod was created"
    if emu is not None:
        calls = [r for r in emu.requests[requests_before:] if r.get("operation") not in READS]
        assert calls == [], "RunPod's API was called"
        assert emu.pods == {}
    return err


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_before_renting(case, tmp_path, monkeypatch, capfd, request):
    if case.api:
        request.getfixturevalue("prefect_server")
    emu = request.getfixturevalue("runpod_api") if case.runpod else None
    err = _run_case(case, tmp_path, monkeypatch, capfd, emu)
    if case.id in ARGPARSE_CASES:  # argparse's own usage line, then its one error line
        assert err.startswith("usage: prefect-runpod") and err.count(": error: ") == 1
    else:
        assert err.startswith("error: ") and err.count("\n") == 1, "one sentence, one line"


@pytest.mark.slow
@pytest.mark.parametrize("case", BLOCK_CASES, ids=[c.id for c in BLOCK_CASES])
def test_a_block_name_that_is_not_saved_stops_the_run(
    case, prefect_server, tmp_path, monkeypatch, capfd, request
):
    """The name is refused with the saved blocks of that type listed, never replaced by
    a default spec or the environment's key (here RUNPOD_API_KEY is set)."""
    from prefect_runpod.blocks.runpod.blocks import RunPodPodSpec

    RunPodPodSpec(max_usd_per_hour=0.25).save("capped-3090", overwrite=True)
    emu = request.getfixturevalue("runpod_api") if case.runpod else None
    err = _run_case(case, tmp_path, monkeypatch, capfd, emu)
    assert "check the name, or save one first" in err or case.id == "concurrency-limit-missing"
    if case.id == "runpod-spec-missing":
        assert "saved RunPodPodSpec blocks: capped-3090" in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "args", [["--transfer", "s3"], ["--max-cost-usd", "nan"]], ids=["s3-no-target", "cost-nan"]
)
def test_nothing_starts_for_bad_input(args, tmp_path):
    """The real command: no Prefect server starts and no pod appears."""
    before = {h.pod_id for h in LocalPodProvider().list("")}
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_runpod.flows.cli", "finetune", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ),
    )
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert "Traceback" not in proc.stderr
    assert "Starting temporary server" not in proc.stderr + proc.stdout
    assert {h.pod_id for h in LocalPodProvider().list("")} == before


FLOW_CASES = [
    ("heartbeat-zero", {"heartbeat_stale_seconds": 0}, "heartbeat_stale_seconds (--heartbeat-stale-seconds) must be a finite number of seconds above 0"),
    ("lifetime-negative", {"pod_lifetime_seconds": -5}, "pod_lifetime_seconds (--pod-lifetime-seconds) must be"),
    ("cost-infinite", {"max_cost_usd": 1e400}, "max_cost_usd (--max-cost-usd) must be a finite number"),
    ("gpu-type-on-local", {"gpu_type_ids": ["NVIDIA GeForce RTX 3090"]}, "applies only to --provider runpod"),
    ("token-as-model-id", {"model_id": TOKEN}, "holds what looks like a Hugging Face token"),
    ("spec-block-missing", {"provider": "runpod", "runpod_spec_block": "nope"}, "no RunPodPodSpec block is named 'nope'"),
    ("pty-streams-zero", {"pty_streams": 0}, "pty_streams (--pty-streams) must be a whole number"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("params", "match"), [c[1:] for c in FLOW_CASES], ids=[c[0] for c in FLOW_CASES]
)
def test_flow_parameters_are_checked_by_the_same_layer(
    params, match, prefect_server, tmp_path, monkeypatch, runpod_api
):
    """A deployment's caller (or Python) reaches the flow without the CLI: its preflight
    refuses the same inputs with the same sentence, before any pod exists."""
    from prefect_runpod.flows.finetune import finetune

    key = tmp_path / "id_ed25519_runpod"
    key.write_text(generate_keypair("flow").private_key.get_secret_value())
    monkeypatch.setenv("RUNPOD_API_BASE_URL", runpod_api.base_url)
    monkeypatch.setenv("RUNPOD_API_KEY", runpod_api.api_key)
    monkeypatch.setenv("RUNPOD_SSH_KEY_PATH", str(key))
    requests_before = len(runpod_api.requests)
    pods_before = {h.pod_id for h in LocalPodProvider().list("")}
    state = finetune(**params, output_dir=str(tmp_path / "out"), return_state=True)
    assert state.is_failed()
    message = state.message or ""
    assert match in message and "ValidationError" not in message
    report = json.loads((tmp_path / "out" / "run-report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["preflight"]["state"] == "Failed" and match in stages["preflight"]["reason"]
    assert stages["terminate"]["reason"] == "no pod was created" and report["pod_id"] is None
    assert {h.pod_id for h in LocalPodProvider().list("")} == pods_before
    assert runpod_api.requests[requests_before:] == []
    assert TOKEN not in message + json.dumps(report)


def test_argument_errors_never_import_prefect(tmp_path):
    """Argument errors are decided from the arguments and files alone: the command
    refuses them before Prefect is even imported (one process runs every case)."""
    runs = []
    for case in ARGUMENT_CASES:
        where = tmp_path / case.id
        where.mkdir()
        made: list[Path] = []

        def bundle(where: Path = where, made: list[Path] = made) -> Path:
            if not made:
                made.append(copy_demo_bundle(where / "bundle"))
            return made[0]

        _make_files(case, where, bundle)
        argv = [_fill(a, where, bundle) for a in case.argv]
        runs.append({"cwd": str(where), "argv": argv, "env": case.env})
    script = (
        "import json, os, sys\n"
        "from prefect_runpod.flows.cli import main\n"
        "out = []\n"
        "for run in json.loads(sys.argv[1]):\n"
        "    os.chdir(run['cwd'])\n"
        "    saved = dict(os.environ)\n"
        "    os.environ.update(run['env'])\n"
        "    out.append([main(run['argv']), 'prefect' in sys.modules])\n"
        "    os.environ.clear()\n"
        "    os.environ.update(saved)\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(runs)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    lines = proc.stderr.splitlines()
    assert len(lines) == len(ARGUMENT_CASES) and "Traceback" not in proc.stderr, proc.stderr
    for case, (status, imported), line in zip(ARGUMENT_CASES, results, lines, strict=True):
        assert status == EXIT_USAGE, (case.id, line)
        assert case.match in line, (case.id, line)
        assert not imported, f"{case.id}: Prefect was imported before the refusal"


DEAD_API = "http://127.0.0.1:9/api"
ENVIRONMENT_CASES = [
    ("api-url-dead-cost", ["cost"], {"PREFECT_API_URL": DEAD_API}, EXIT_USAGE, f"the Prefect API at {DEAD_API} cannot be reached"),
    ("api-url-dead-finetune", ["finetune"], {"PREFECT_API_URL": DEAD_API}, EXIT_USAGE, f"the Prefect API at {DEAD_API} cannot be reached"),
    ("api-url-not-a-url", ["status"], {"PREFECT_API_URL": "not-a-url"}, EXIT_USAGE, "PREFECT_API_URL 'not-a-url' must start with http:// or https://"),
    ("prefect-setting-unreadable", ["status"], {"PREFECT_API_REQUEST_TIMEOUT": "abc"}, EXIT_USAGE, "Prefect cannot read its settings (PREFECT_API_REQUEST_TIMEOUT 'abc': Input should be a valid number"),
    ("server-home-read-only", ["status"], {"HOME": "/proc/prefect-runpod-home", "PREFECT_RUNPOD_HOME": None, "PREFECT_API_URL": None}, EXIT_USAGE, "the Prefect server's home /proc/prefect-runpod-home/.prefect-runpod/server cannot be created"),
    ("server-start-home-read-only", ["server", "start"], {"HOME": "/proc/prefect-runpod-home", "PREFECT_RUNPOD_HOME": None, "PREFECT_API_URL": None}, EXIT_USAGE, "set PREFECT_RUNPOD_HOME to a folder this user can write"),
    ("home-read-only", ["cost"], {"HOME": "/proc/prefect-runpod-home", "PREFECT_HOME": None}, EXIT_USAGE, "cannot be created"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "env", "status", "match"),
    [c[1:] for c in ENVIRONMENT_CASES],
    ids=[c[0] for c in ENVIRONMENT_CASES],
)
def test_a_broken_environment_gets_one_line(argv, env, status, match, tmp_path):
    """A dead or malformed PREFECT_API_URL and a HOME where Prefect cannot make its
    folder: one sentence, the documented exit status, no traceback, no pod."""
    before = {h.pod_id for h in LocalPodProvider().list("")}
    environ = {k: v for k, v in os.environ.items() if env.get(k, "") is not None}
    environ.update({k: v for k, v in env.items() if v is not None})
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_runpod.flows.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=environ,
    )
    assert proc.returncode == status, proc.stderr
    assert match in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert {h.pod_id for h in LocalPodProvider().list("")} == before


@pytest.mark.slow
def test_terminate_ends_the_pod_when_the_prefect_api_is_dead(tmp_path):
    """A dead PREFECT_API_URL never keeps a pod billing: `terminate` ends the pod, confirmed,
    and says that the run's cost could not be recorded and how to record it."""
    provider = LocalPodProvider()
    keypair = generate_keypair("terminate-dead-api")
    run_id = "6b1f2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    handle = provider.create(PodRequest(public_key=keypair.public_key), f"prefect-runpod-{run_id}")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "prefect_runpod.flows.cli", "terminate", handle.pod_id],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={**os.environ, "PREFECT_API_URL": DEAD_API},
        )
    finally:
        provider.terminate(handle.pod_id)
    assert proc.returncode == 0, proc.stderr
    assert f"{handle.pod_id} terminated (confirmed" in proc.stdout, proc.stdout
    assert handle.pod_id not in {h.pod_id for h in provider.list("")}
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"run {run_id}: cost not recorded" in proc.stderr
    assert f"prefect-runpod cost {run_id} --reconcile" in proc.stderr


@pytest.mark.slow
def test_register_setup_without_a_server_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_runpod.deployments.register", "setup"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PREFECT_API_URL": DEAD_API},
    )
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert f"the Prefect API at {DEAD_API} cannot be reached" in proc.stderr


def test_register_with_a_malformed_api_url_is_one_line_before_prefect_loads(tmp_path):
    """``python -m prefect_runpod.deployments.register`` used to import Prefect at module
    load, so a ``PREFECT_API_URL`` Prefect cannot parse ended in its settings traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "prefect_runpod.deployments.register", "setup"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PREFECT_API_URL": "http://[::1"},
    )
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stderr.startswith("error: PREFECT_API_URL") and proc.stderr.count("\n") == 1, (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""


REGISTER_CASES = [
    ("gpu-limit-negative", ["setup", "--gpu-limit", "-5"], "gpu_limit (--gpu-limit) must be a whole number at least 1 and at most 1000, got -5"),
    ("gpu-limit-zero", ["setup", "--gpu-limit", "0"], "gpu_limit (--gpu-limit) must be a whole number at least 1"),
    ("heartbeat-minus-inf", ["setup", "--heartbeat-seconds", "-inf"], "heartbeat_seconds (--heartbeat-seconds) must be a finite number of seconds above 0"),
    ("serve-limit-zero", ["serve", "--limit", "0"], "run_limit (--limit) must be a whole number at least 1"),
    ("serve-query-negative", ["serve", "--query-seconds", "-1"], "query_seconds (--query-seconds) must be a finite number of seconds above 0"),
    ("api-url-unclosed-bracket", ["setup"], "PREFECT_API_URL 'http://[::1' is not a URL"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "match"), [c[1:] for c in REGISTER_CASES], ids=[c[0] for c in REGISTER_CASES]
)
def test_register_refuses_bad_arguments_before_the_api(argv, match, monkeypatch, capfd):
    """``register setup`` / ``serve`` hold their numbers to the validation layer's rules
    (a value with a minus sign reaches its option) and the environment's PREFECT_API_URL
    to the URL rule, before any API is opened: one line, exit 2, no pod."""
    from prefect_runpod.deployments import register

    monkeypatch.setenv("PREFECT_API_URL", "http://[::1" if "PREFECT_API_URL" in match else DEAD_API)
    pods_before = {h.pod_id for h in LocalPodProvider().list("")}
    capfd.readouterr()
    assert register.main(argv) == EXIT_USAGE
    out, err = capfd.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and match in err, err
    assert "cannot be reached" not in err and out == ""  # refused before the API check
    assert {h.pod_id for h in LocalPodProvider().list("")} == pods_before


@pytest.mark.slow
def test_an_ssh_key_block_with_only_a_path_derives_its_public_key(
    prefect_server, tmp_path, monkeypatch
):
    """The block's public_key says it is derived from the private key when empty: a
    block saved with private_key_path alone builds the RunPod provider and its key pair."""
    from prefect_runpod.blocks.keys import public_key_line
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey
    from prefect_runpod.flows.run.providers import build_provider

    private = generate_keypair("path-only").private_key
    key_file = tmp_path / "id_ed25519"
    key_file.write_text(private.get_secret_value())
    RunPodSSHKey(private_key_path=str(key_file)).save("path-only", overwrite=True)
    monkeypatch.setenv("RUNPOD_API_KEY", "rpa_" + "0" * 32)
    _, keypair = build_provider({"provider": "runpod", "ssh_key_block": "path-only"})
    assert keypair.public_key == public_key_line(private)


def test_a_value_with_a_minus_sign_reaches_its_option():
    """argparse reads ``-5d`` or ``-inf`` as an option; joined to the option before
    parsing, the value reaches the rule that refuses it. Nothing after ``--`` changes."""
    from prefect_runpod.flows.cli.arguments import spell_negative_values

    argv = ["cost", "--since", "-5d", "--limit", "-1", "--json", "--", "--x", "-2"]
    assert spell_negative_values(argv) == [
        "cost", "--since=-5d", "--limit=-1", "--json", "--", "--x", "-2",
    ]  # fmt: skip
    assert spell_negative_values(["finetune", "--max-cost-usd", "-INF", "--bundle", "b"]) == [
        "finetune", "--max-cost-usd=-INF", "--bundle", "b",
    ]  # fmt: skip


@pytest.mark.slow
def test_cost_lists_more_runs_than_one_api_page(prefect_server, capfd):
    """``cost --limit 30`` asks for more artifacts than the API's page of 200: read page
    by page instead of a 422 traceback."""
    capfd.readouterr()
    assert main(["cost", "--limit", "30", "--json"]) in (0, 1)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "422" not in err, err
    assert "totals" in json.loads(out)
