#!/usr/bin/env python3
"""Check Hugging Face access from the pod and print one JSON line of evidence.

Runs ON the pod: Python 3.8+, standard library only. It asks the Hub three things,
the way huggingface_hub would from this machine:

1. ``GET {endpoint}/api/whoami-v2`` — is the token valid here, and is it a
   fine-grained token without ``canReadGatedRepos``?
2. ``GET {endpoint}/api/{type}s/{repo}/auth-check`` — may this token read the repo?
3. ``HEAD {endpoint}/{repo}/resolve/{revision}/{filename}`` — the request a download
   really makes (redirects are not followed, so the token never goes to a CDN).

The token comes from the ``HF_TOKEN`` environment variable, else the file
``hf auth login`` writes (``$HF_HOME/token`` or ``~/.cache/huggingface/token``) —
never from the command line. It is never printed. The output line is::

    {"kind": "hf_check", "token_present": true, "token_source": "env",
     "whoami": {"status": 200, "error_code": null, "message": null, "user": "…",
                "role": "fineGrained", "can_read_gated": false},
     "auth_check": {"status": 403, "error_code": "GatedRepo", "message": "…"},
     "file": {...} | null, "error": null, ...}

Exit status: 0 when the file is reachable, 3 when access is denied or the Hub could
not be reached, 2 on bad arguments.
"""

import argparse
import contextlib
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request

_DEFAULT_ENDPOINT = "https://huggingface.co"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Stop at a redirect: a 3xx from ``resolve`` already proves access, and following
    it would carry the Authorization header to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D401
        return None


def _read_token():
    """(token, source): HF_TOKEN, else the saved login file, else (None, None)."""
    value = os.environ.get("HF_TOKEN", "").strip()
    if value:
        return value, "env"
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    path = os.environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")
    try:
        with open(path, "r") as fh:
            value = fh.read().strip()
    except (OSError, UnicodeDecodeError):
        value = ""
    if value:
        return value, "file"
    return None, None


def _scrub(text, token):
    if text and token:
        text = text.replace(token, "<redacted>")
    return text


def _request(method, url, token, timeout_seconds):
    """One HTTP call → {"status", "error_code", "message", "body"} (body: parsed JSON
    for 2xx GETs). A network failure gives status None and the reason in message."""
    headers = {"User-Agent": "prefect-runpod-hf-check/1", "Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = "Bearer " + token
    request = urllib.request.Request(url, method=method, headers=headers)
    opener = urllib.request.build_opener(_NoRedirect())
    result = {"status": None, "error_code": None, "message": None}
    try:
        with opener.open(request, timeout=timeout_seconds) as response:
            result["status"] = response.status
            raw = response.read() if method == "GET" else b""
            if raw:
                with contextlib.suppress(ValueError):
                    result["body"] = json.loads(raw.decode("utf-8"))
    except urllib.error.HTTPError as exc:
        result["status"] = exc.code
        result["error_code"] = exc.headers.get("X-Error-Code")
        message = exc.headers.get("X-Error-Message")
        if not message:
            try:
                payload = json.loads(exc.read().decode("utf-8") or "{}")
                message = payload.get("error") if isinstance(payload, dict) else None
            except (ValueError, OSError):
                message = None
        result["message"] = _scrub(message, token)
    except (urllib.error.URLError, socket.timeout, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        result["message"] = _scrub("cannot reach %s: %s" % (url, reason), token)
    return result


def check(endpoint, repo_id, repo_type, revision, filename, timeout_seconds):
    """Run the three requests and return the evidence dict (see module docstring)."""
    token, source = _read_token()
    endpoint = endpoint.rstrip("/")
    quoted = urllib.parse.quote(repo_id, safe="/")
    evidence = {
        "kind": "hf_check",
        "endpoint": endpoint,
        "repo_id": repo_id,
        "repo_type": repo_type,
        "token_present": bool(token),
        "token_source": source,
        "whoami": None,
        "auth_check": None,
        "file": None,
        "python": "%d.%d.%d" % sys.version_info[:3],
    }
    if token:
        who = _request("GET", endpoint + "/api/whoami-v2", token, timeout_seconds)
        body = who.pop("body", None) or {}
        access = (body.get("auth") or {}).get("accessToken") or {}
        fine = access.get("fineGrained")
        who["user"] = body.get("name")
        who["role"] = access.get("role")
        who["can_read_gated"] = fine.get("canReadGatedRepos") if isinstance(fine, dict) else None
        evidence["whoami"] = who
    check_url = "%s/api/%ss/%s/auth-check" % (endpoint, repo_type, quoted)
    auth = _request("GET", check_url, token, timeout_seconds)
    auth.pop("body", None)
    evidence["auth_check"] = auth
    if auth["status"] is not None and auth["status"] < 400 and filename:
        prefix = "" if repo_type == "model" else repo_type + "s/"
        file_url = "%s/%s%s/resolve/%s/%s" % (
            endpoint,
            prefix,
            quoted,
            urllib.parse.quote(revision, safe=""),
            urllib.parse.quote(filename, safe="/"),
        )
        answer = _request("HEAD", file_url, token, timeout_seconds)
        answer.pop("body", None)
        evidence["file"] = answer
    return evidence


def _access_ok(evidence):
    final = evidence["file"] or evidence["auth_check"] or {}
    status = final.get("status")
    return status is not None and (status < 400 or final.get("error_code") == "EntryNotFound")


def main(argv=None):
    parser = argparse.ArgumentParser(description="Check Hugging Face access from this machine.")
    parser.add_argument("--repo-id", required=True)
    parser.add_argument("--repo-type", default="model", choices=["model", "dataset", "space"])
    parser.add_argument("--revision", default="main")
    parser.add_argument("--filename", default="config.json")
    parser.add_argument("--endpoint", default=None)
    parser.add_argument("--timeout-seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    endpoint = args.endpoint or os.environ.get("HF_ENDPOINT") or _DEFAULT_ENDPOINT
    evidence = check(
        endpoint, args.repo_id, args.repo_type, args.revision, args.filename, args.timeout_seconds
    )
    sys.stdout.write(json.dumps(evidence, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0 if _access_ok(evidence) else 3


if __name__ == "__main__":
    sys.exit(main())
