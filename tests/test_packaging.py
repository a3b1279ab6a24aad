"""What `pip install .` ships: every package folder of the product is named in pyproject.toml.

An editable install finds a forgotten sub-package through its parent's folder, so the test
suite (installed with ``-e``) passes while a user's ``pip install .`` leaves the folder out
and the first command fails with ModuleNotFoundError. This reads the setuptools table itself.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT_FOLDERS = ("flows", "tasks", "blocks", "deployments")


def _setuptools_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folders() -> dict[str, str]:
    """``{dotted package name: folder}`` for every folder holding an ``__init__.py``."""
    found: dict[str, str] = {}
    for top in PRODUCT_FOLDERS:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            folder = init.parent.relative_to(ROOT).as_posix()
            found["prefect_runpod." + folder.replace("/", ".")] = folder
    return found


def test_every_package_folder_is_shipped_by_a_plain_install() -> None:
    table = _setuptools_table()
    folders = _package_folders()
    assert "prefect_runpod.blocks.publish" in folders  # the one once forgotten
    missing_packages = sorted(set(folders) - set(table["packages"]))
    assert not missing_packages, f"add to [tool.setuptools] packages: {missing_packages}"
    package_dir = table["package-dir"]
    wrong = {n: f for n, f in folders.items() if package_dir.get(n) != f}
    assert not wrong, f"add to [tool.setuptools] package-dir: {wrong}"


def test_every_shipped_package_exists() -> None:
    table = _setuptools_table()
    for name, folder in table["package-dir"].items():
        assert (ROOT / folder).is_dir(), (name, folder)  # examples/demo ships as data
    assert set(table["packages"]) == set(table["package-dir"])
