"""Tiny stand-in wheels for torch, transformers and friends (docs/local-pod-images.md).

Real torch wheels are gigabytes; a rehearsal on the local pod needs only what the env
stage looks at: a ``torch`` that imports and reports ``__version__`` (``2.1.0+cu118``),
``torch.version.cuda`` and ``torch.cuda.is_available()`` (False: there is no GPU), and a
``transformers`` that behaves like the real one's import gate
(``utils/import_utils.py``): when torch is older than its floor it logs
``Disabling PyTorch because PyTorch >= X is required but found Y`` and
``transformers.utils.is_torch_available()`` returns False.

The local pod's image profiles install these into their image Python
(:mod:`prefect_runpod.blocks.local_pod.images`), and the tests' loopback package index
serves the same wheels laid out like PyTorch's indexes. Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile

__all__ = [
    "TRANSFORMERS_TORCH_FLOOR",
    "build_wheel",
    "plain_files",
    "stand_in_wheel",
    "torch_files",
    "transformers_files",
]

TRANSFORMERS_TORCH_FLOOR: dict[str, str | None] = {
    "4.46.3": None,
    "4.57.1": "2.1",
    "5.0.0": "2.2",
    "5.2.0": "2.4",
    "5.20.0": "2.6",
}
"""The fake transformers' torch floors (the real ones' ``is_torch_available`` gates)."""


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(name: str, version: str, files: dict[str, str]) -> tuple[str, bytes]:
    """Build a ``py3-none-any`` wheel in memory.

    Args:
        name: distribution (and import) name.
        version: PEP 440 version, local labels allowed (``2.5.1+cu118``).
        files: archive path → source text.

    Returns:
        (file name, wheel bytes).
    """
    dist = f"{name}-{version}.dist-info"
    members = dict(files)
    members[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        f"Summary: tiny stand-in for {name}\n"
    )
    members[f"{dist}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: prefect-runpod-tiny-wheels\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    )
    members[f"{dist}/top_level.txt"] = f"{name}\n"
    buf = io.BytesIO()
    records = []
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, text in members.items():
            data = text.encode()
            zf.writestr(path, data)
            records.append(_record_line(path, data))
        records.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(records) + "\n")
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


def torch_files(version: str, tag: str) -> dict[str, str]:
    """The source files of a stand-in ``torch`` (archive path → text).

    Args:
        version: the release, e.g. ``2.1.0``.
        tag: the index label, ``cu118`` … or ``cpu`` (then ``torch.version.cuda`` is None).
    """
    cuda = None if tag == "cpu" else f"{tag[2:-1]}.{tag[-1]}"
    return {
        "torch/__init__.py": (
            f'__version__ = "{version}+{tag}"\nfrom torch import cuda, version  # noqa: E402,F401\n'
        ),
        "torch/version.py": f'__version__ = "{version}+{tag}"\ncuda = {cuda!r}\n',
        "torch/cuda.py": "def is_available():\n    return False\n\n\ndef device_count():\n    return 0\n",
    }


def transformers_files(version: str) -> dict[str, str]:
    """The source files of a stand-in ``transformers`` whose import gate uses the torch
    floor ``TRANSFORMERS_TORCH_FLOOR[version]`` (None: no gate)."""
    floor = TRANSFORMERS_TORCH_FLOOR.get(version)
    return {
        "transformers/__init__.py": f'__version__ = "{version}"\nfrom transformers import utils  # noqa: E402,F401\n',
        "transformers/utils.py": (
            "import logging\n"
            "import re\n\n"
            f"_FLOOR = {floor!r}\n\n\n"
            "def _parse(v):\n"
            "    return tuple(int(x) for x in re.findall(r'\\d+', v.split('+')[0])[:2])\n\n\n"
            "def _check():\n"
            "    try:\n"
            "        import torch\n"
            "    except ImportError:\n"
            "        return False\n"
            "    if _FLOOR and _parse(torch.__version__) < _parse(_FLOOR):\n"
            "        logging.getLogger('transformers').warning(\n"
            "            'Disabling PyTorch because PyTorch >= %s is required but found %s',\n"
            "            _FLOOR, torch.__version__)\n"
            "        return False\n"
            "    return True\n\n\n"
            "_TORCH = _check()\n\n\n"
            "def is_torch_available():\n"
            "    return _TORCH\n"
        ),
    }


def plain_files(name: str, version: str) -> dict[str, str]:
    """The one file of any other stand-in package: ``<name>/__init__.py`` with ``__version__``."""
    return {f"{name}/__init__.py": f'__version__ = "{version}"\n'}


def stand_in_wheel(name: str, version: str) -> tuple[str, bytes]:
    """The stand-in wheel for one distribution.

    Args:
        name: ``torch``, ``transformers`` or any other name (a package holding only
            ``__version__``).
        version: for torch a version with its index label (``2.1.0+cu118``,
            ``2.5.1+cpu``); otherwise a plain version (``4.46.3``).

    Returns:
        ``(file name, wheel bytes)``.

    Raises:
        ValueError: a torch version without its ``+<tag>`` label.
    """
    if name == "torch":
        base, sep, tag = version.partition("+")
        if not sep or not tag:
            raise ValueError(f"torch {version!r} needs its index label, e.g. 2.1.0+cu118")
        return build_wheel("torch", version, torch_files(base, tag))
    if name == "transformers":
        return build_wheel(name, version, transformers_files(version))
    return build_wheel(name, version, plain_files(name, version))
