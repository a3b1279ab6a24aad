#!/usr/bin/env python3
"""Probe the pod's environment and print one JSON line (an ``EnvReport``).

Runs ON the pod: Python 3.8+, standard library only, every subprocess bounded by a
timeout so a wedged driver or a broken interpreter cannot hang the stage.

What it reports:

* each Python candidate (``--python`` paths first, then ``python``, ``python3`` and
  ``/usr/local/bin/python3.X`` / ``/usr/bin/python3.X``; duplicates by real path
  dropped): its version, whether it is a virtualenv's and its site-packages folders,
  whether each ``--require`` distribution imports, torch version, torch's CUDA build
  (``torch.version.cuda``),
  ``torch.cuda.is_available()``, the versions of transformers / peft / trl /
  accelerate (and of huggingface_hub / boto3, which the publish stage uses), and
  whether transformers disabled torch (its ``is_torch_available()`` is False, or it
  logged ``Disabling PyTorch because …``);
* ``nvidia-smi``: driver version, the ``CUDA Version: X.Y`` of its header (the highest
  CUDA the driver supports), the first GPU's name and memory in MiB — all None when
  there is no ``nvidia-smi``;
* the free bytes of ``--disk-path``.

Output: ``{"kind": "env_probe", "pythons": [...], "driver_version": …, ...}``.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

_SNIPPET = r"""
import json, sys
out = {"version": "%d.%d.%d" % sys.version_info[:3]}
out["in_venv"] = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
try:
    import site
    out["site_packages"] = [p for p in site.getsitepackages()]
except Exception:
    out["site_packages"] = []
try:
    import torch
    out["torch"] = str(torch.__version__)
    out["torch_cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
    except Exception as exc:
        out["cuda_available"] = False
        out["cuda_error"] = repr(exc)[:300]
except Exception as exc:
    out["torch_error"] = repr(exc)[:300]
try:
    from importlib import metadata
except ImportError:
    metadata = None
for name in ("transformers", "peft", "trl", "accelerate", "pip", "huggingface_hub", "boto3"):
    version = None
    if metadata is not None:
        try:
            version = metadata.version(name)
        except Exception:
            version = None
    out[name] = version
if out.get("transformers") and out.get("torch"):
    try:
        import transformers.utils as tu
        out["transformers_torch_ok"] = bool(tu.is_torch_available())
    except Exception as exc:
        out["transformers_error"] = repr(exc)[:300]
imports, errors = {}, {}
for name in sys.argv[1:]:
    modules = [name.replace("-", "_")]
    version = None
    try:
        if metadata is not None:
            dist = metadata.distribution(name)
            version = dist.version
            modules = (dist.read_text("top_level.txt") or "").split() or modules
        import importlib
        for module in modules:
            importlib.import_module(module)
        imports[name] = version or "?"
    except Exception as exc:
        imports[name] = None
        errors[name] = repr(exc)[:200]
out["imports"], out["import_errors"] = imports, errors
sys.stdout.write("\nPROBE_JSON " + json.dumps(out) + "\n")
"""

_DISABLED = "Disabling PyTorch because"


def _run(argv, timeout_seconds):
    """(exit code, stdout, stderr); (None, "", reason) when it cannot run or times out."""
    try:
        proc = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=timeout_seconds,
            universal_newlines=True,
        )
    except (OSError, ValueError) as exc:
        return None, "", str(exc)
    except subprocess.TimeoutExpired:
        return None, "", "timed out after %ss" % timeout_seconds
    return proc.returncode, proc.stdout, proc.stderr


def candidates(extra):
    """Python paths to probe, in preference order, deduplicated by real path."""
    names = list(extra) + ["python", "python3"]
    for pattern in ("/usr/local/bin/python3.*", "/usr/bin/python3.*"):
        names += sorted(p for p in glob.glob(pattern) if re.search(r"python3\.\d+$", p))
    seen = set()
    found = []
    for name in names:
        path = name if os.sep in name else shutil.which(name)
        if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        key = _identity(path)
        if key in seen:
            continue
        seen.add(key)
        found.append(path)
    return found


def _identity(path):
    """What makes two paths the same interpreter: a venv's python links to its base
    interpreter but has its own packages, so a venv is keyed by its folder."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        return ("venv", venv)
    return ("real", os.path.realpath(path))


def probe_python(path, timeout_seconds, require=()):
    """One interpreter's PythonProbe dict; each distribution in ``require`` is imported
    (its top-level modules) and reported in ``imports``."""
    code, out, err = _run([path, "-c", _SNIPPET] + list(require), timeout_seconds)
    result = {"path": path}
    marker = "PROBE_JSON "
    line = None
    for candidate in (out or "").splitlines():
        if candidate.startswith(marker):
            line = candidate[len(marker) :]
    if line is None:
        result["error"] = ("exit %s: %s" % (code, (err or "").strip()[-300:])).strip()
        return result
    try:
        result.update(json.loads(line))
    except ValueError:
        result["error"] = "unreadable probe output"
        return result
    if _DISABLED in (err or ""):
        result["transformers_torch_ok"] = False
        for message in (err or "").splitlines():
            if _DISABLED in message:
                result["transformers_warning"] = message.strip()[:300]
                break
    return result


def probe_gpu(timeout_seconds):
    """Driver version, driver CUDA, GPU name and VRAM (MiB) from nvidia-smi."""
    info = {"driver_version": None, "driver_cuda": None, "gpu_name": None, "vram_mib": None}
    smi = shutil.which("nvidia-smi")
    if not smi:
        return info
    code, out, _ = _run([smi], timeout_seconds)
    if code == 0:
        match = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", out)
        if match:
            info["driver_cuda"] = match.group(1)
    code, out, _ = _run(
        [
            smi,
            "--query-gpu=driver_version,name,memory.total",
            "--format=csv,noheader,nounits",
        ],
        timeout_seconds,
    )
    if code == 0 and out.strip():
        fields = [f.strip() for f in out.strip().splitlines()[0].split(",")]
        if len(fields) >= 3:
            info["driver_version"] = fields[0] or None
            info["gpu_name"] = fields[1] or None
            try:
                info["vram_mib"] = int(float(fields[2]))
            except ValueError:
                info["vram_mib"] = None
    return info


def probe(extra_pythons, disk_path, timeout_seconds, gpu_timeout_seconds=30.0, require=()):
    """The whole EnvReport dict (``require``: distributions each Python must import)."""
    report = {"kind": "env_probe"}
    report["pythons"] = [
        probe_python(p, timeout_seconds, require) for p in candidates(extra_pythons)
    ]
    report.update(probe_gpu(gpu_timeout_seconds))
    try:
        report["free_disk_bytes"] = shutil.disk_usage(disk_path).free
    except OSError:
        report["free_disk_bytes"] = None
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description="Probe Python/torch/CUDA on this machine.")
    parser.add_argument("--python", action="append", default=[], help="probe this first")
    parser.add_argument("--venv", default=None, help="a venv whose python to probe first")
    parser.add_argument("--disk-path", default=os.getcwd())
    parser.add_argument("--timeout-seconds", type=float, default=120.0, help="per Python")
    parser.add_argument("--gpu-timeout-seconds", type=float, default=30.0, help="per nvidia-smi")
    parser.add_argument(
        "--require", action="append", default=[], help="a distribution each Python must import"
    )
    args = parser.parse_args(argv)
    extra = list(args.python)
    if args.venv:
        extra.insert(0, os.path.join(args.venv, "bin", "python"))
    report = probe(
        extra, args.disk_path, args.timeout_seconds, args.gpu_timeout_seconds, args.require
    )
    sys.stdout.write(json.dumps(report, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
