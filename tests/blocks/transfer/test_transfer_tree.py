"""Transfers keep the whole tree and leave the caller's shell alone (#13).

A tree with ``ckpt/empty/`` (an empty directory), ``ckpt/latest.bin -> weights.bin``
and ``current -> ckpt`` used to round-trip without ``ckpt/empty`` and ``current``,
reported ``verified=True``; dangling links vanished the same way, and a link pointing
out of the tree was followed (a bundle holding ``passwd -> /etc/passwd`` uploaded
/etc/passwd). And ``cd /tmp`` then an upload left the shell in the pod tools folder.
Every method (pty, sftp, rsync, s3, runpodctl) is checked, and that a second upload of
an unchanged tree sends no file content.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefect_runpod.blocks.console.session import PodConsole
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer import s3 as s3_module
from prefect_runpod.blocks.transfer.dispatch import check_tree, download_dir, upload_dir
from prefect_runpod.blocks.transfer.models import Manifest
from prefect_runpod.blocks.transfer.runpodctl import RunpodctlOptions
from prefect_runpod.blocks.transfer.s3 import S3Target
from prefect_runpod.tasks.bundle_files import select_bundle_files
from prefect_runpod.tasks.checksum import verify_manifest
from prefect_runpod.tasks.preflight import validate_settings
from tests.fixtures.transfer import make_tree, moto_target

METHODS = ("pty", "sftp", "rsync", "s3", "runpodctl")


def make_link_tree(root: Path) -> Path:
    """The issue's tree: files, an empty directory, a file link, a directory link."""
    (root / "ckpt" / "empty").mkdir(parents=True)
    (root / "ckpt" / "weights.bin").write_bytes(os.urandom(300_000))
    (root / "ckpt" / "latest.bin").symlink_to("weights.bin")
    (root / "current").symlink_to("ckpt")
    (root / "notes.txt").write_text("a checkpoint\n")
    return root


def _tree(root: Path) -> list[tuple[str, str, str]]:
    """What is on disk under ``root``, links not followed: (path, kind, detail)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if mf.is_transfer_scratch(name):
                continue
            if full.is_symlink():
                out.append((rel, "link", os.readlink(full)))
            elif full.is_dir():
                out.append((rel, "dir", ""))
            else:
                out.append((rel, "file", hashlib.sha256(full.read_bytes()).hexdigest()))
    return sorted(out)


class TestManifest:
    def test_lists_files_empty_dirs_and_links(self, tmp_path: Path) -> None:
        root = make_link_tree(tmp_path / "t")
        entries = {e["path"]: e for e in mf.compute_manifest(str(root))["entries"]}
        assert set(entries) == {
            "ckpt/empty",
            "ckpt/latest.bin",
            "ckpt/weights.bin",
            "current",
            "notes.txt",
        }
        assert entries["ckpt/empty"]["kind"] == "dir"
        assert (entries["ckpt/latest.bin"]["kind"], entries["ckpt/latest.bin"]["target"]) == (
            "link",
            "weights.bin",
        )
        assert (entries["current"]["kind"], entries["current"]["target"]) == ("link", "ckpt")
        assert "kind" not in entries["notes.txt"]  # file entries keep their old shape
        assert Manifest.compute(root).total_bytes == 300_000 + len("a checkpoint\n")

    def test_compare_names_a_missing_dir_and_a_link_replaced_by_a_copy(
        self, tmp_path: Path
    ) -> None:
        root = make_link_tree(tmp_path / "t")
        want = mf.compute_manifest(str(root))
        (root / "ckpt" / "empty").rmdir()
        (root / "current").unlink()
        (root / "current").mkdir()
        (root / "ckpt" / "latest.bin").unlink()
        (root / "ckpt" / "latest.bin").symlink_to("../notes.txt")
        have = mf.compute_manifest(
            str(root), [e["path"] for e in want["entries"] if e["path"] != "ckpt/empty"]
        )
        problems = dict(mf.compare_manifests(want, have))
        assert problems["ckpt/empty"] == "missing"
        assert problems["current"] == "a dir, not a link"
        assert problems["ckpt/latest.bin"] == "link to ../notes.txt != weights.bin"

    @pytest.mark.parametrize(
        ("name", "target", "why"),
        [
            ("passwd", "/etc/passwd", "absolute link"),
            ("up", "../outside.txt", "points outside the tree"),
            ("gone", "nothing-here", "dangling"),
        ],
    )
    def test_links_a_transfer_cannot_carry_are_refused_by_name(
        self, tmp_path: Path, name: str, target: str, why: str
    ) -> None:
        (tmp_path / "outside.txt").write_text("x")
        root = make_link_tree(tmp_path / "t")
        (root / name).symlink_to(target)
        with pytest.raises(SpecError, match=rf"{name} \({why}.*Nothing was moved"):
            Manifest.compute(root)
        with pytest.raises(SpecError, match=rf"{name} \({why}"):
            check_tree(root)

    def test_follow_links_copies_an_escaping_target_but_never_a_dangling_one(
        self, tmp_path: Path
    ) -> None:
        (tmp_path / "shared").mkdir()
        (tmp_path / "shared" / "tokenizer.json").write_text("{}")
        root = make_link_tree(tmp_path / "t")
        (root / "tok").symlink_to(tmp_path / "shared")
        entries = {e.path: e for e in Manifest.compute(root, follow_links=True).entries}
        assert entries["tok/tokenizer.json"].kind == "file"
        assert entries["current"].kind == "link"  # in-tree links stay links
        check_tree(root, follow_links=True)
        (root / "gone").symlink_to("nothing-here")
        with pytest.raises(SpecError, match=r"gone \(dangling"):
            check_tree(root, follow_links=True)

    def test_apply_structure_makes_dirs_and_links_and_refuses_escapes(self, tmp_path: Path) -> None:
        src = make_link_tree(tmp_path / "src")
        dest = tmp_path / "dest"
        (dest / "ckpt").mkdir(parents=True)
        (dest / "ckpt" / "weights.bin").write_bytes((src / "ckpt" / "weights.bin").read_bytes())
        (dest / "notes.txt").write_text("a checkpoint\n")
        (dest / "current").write_text("a stale copy where the link belongs")
        entries = mf.compute_manifest(str(src))["entries"]
        assert mf.apply_structure(str(dest), entries) == []
        assert _tree(dest) == _tree(src)
        errors = mf.apply_structure(
            str(dest), [{"path": "evil", "kind": "link", "target": "../../x"}]
        )
        assert errors and errors[0][0] == "evil" and not os.path.lexists(dest / "evil")

    def test_the_checksum_stage_checks_dirs_and_links(self, tmp_path: Path) -> None:
        root = make_link_tree(tmp_path / "t")
        expected = Manifest.compute(root)
        assert verify_manifest(root, expected)[1] == []
        (root / "ckpt" / "empty").rmdir()
        (root / "current").unlink()
        (root / "current").mkdir()
        problems = dict(verify_manifest(root, expected)[1])
        assert problems == {"ckpt/empty": "missing", "current": "a dir, not a link"}

    def test_preflight_refuses_a_bundle_with_an_escaping_link(self, tmp_path: Path) -> None:
        """#13: a bundle holding ``passwd -> /etc/passwd`` uploaded /etc/passwd."""
        bundle = tmp_path / "bundle"
        bundle.mkdir()
        (bundle / "bundle.toml").write_text('[job]\ntrain = "{python} train.py"\n')
        (bundle / "train.py").write_text("print('hi')\n")
        (bundle / "passwd").symlink_to("/etc/passwd")
        settings = {"bundle": bundle, "output_dir": tmp_path / "out"}
        with pytest.raises(SpecError, match=r"passwd \(absolute link to /etc/passwd"):
            validate_settings(**settings)
        assert validate_settings(**settings, follow_links=True).bundle.root == str(bundle)
        (bundle / ".prefectrunpodignore").write_text("passwd\n")  # left out: never checked
        assert "passwd" not in validate_settings(**settings).upload.files  # type: ignore[union-attr]

    def test_the_bundle_selection_keeps_empty_dirs_and_links_for_the_manifest(
        self, tmp_path: Path
    ) -> None:
        bundle = make_link_tree(tmp_path / "bundle")
        (bundle / "gone").symlink_to("missing.bin")
        (bundle / "cache").mkdir()
        (bundle / ".prefectrunpodignore").write_text("cache/\n")
        files = select_bundle_files(bundle).files
        assert {"ckpt/empty", "ckpt/latest.bin", "current", "gone"} <= set(files)
        assert "cache" not in files  # ignored directories stay ignored, even empty ones
        with pytest.raises(SpecError, match=r"gone \(dangling"):
            check_tree(bundle, paths=files)
        files.remove("gone")
        kinds = {e.path: e.kind for e in Manifest.compute(bundle, files).entries}
        assert kinds == {
            ".prefectrunpodignore": "file",
            "ckpt/empty": "dir",
            "ckpt/latest.bin": "link",
            "ckpt/weights.bin": "file",
            "current": "link",
            "notes.txt": "file",
        }


# --- through pods ----------------------------------------------------------------------


class _VolumeView:
    """RunPod's network volume, as far as the s3 method sees it: ``/workspace/x`` on the
    pod is ``s3://<volume>/x``. Here the local pod's workspace and a moto bucket are kept
    in step around each S3 call (objects appear as files, files as objects)."""

    def __init__(self, target: S3Target, workdir: str):
        self.target, self.workdir = target, Path(workdir)

    def after_upload(self) -> None:
        client = self.target.get_client()
        for obj in client.list_objects_v2(Bucket=self.target.bucket).get("Contents", []):
            path = self.workdir.joinpath(*obj["Key"].split("/"))
            path.parent.mkdir(parents=True, exist_ok=True)
            body = client.get_object(Bucket=self.target.bucket, Key=obj["Key"])["Body"].read()
            path.write_bytes(body)

    def before_download(self, key_prefix: str) -> None:
        client = self.target.get_client()
        root = self.workdir.joinpath(*key_prefix.split("/"))
        for dirpath, _, filenames in os.walk(root):
            for name in filenames:
                full = Path(dirpath) / name
                if full.is_symlink():
                    continue  # a volume's S3 API serves files, not links
                key = full.relative_to(self.workdir).as_posix()
                client.put_object(Bucket=self.target.bucket, Key=key, Body=full.read_bytes())


@pytest.fixture
def s3_volume(moto_s3, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Make an S3Target whose objects show under a pod's workspace (see ``_VolumeView``)."""

    def make(handle: PodHandle) -> S3Target:
        target = moto_target(moto_s3, volume_mount_path=handle.workdir)
        view = _VolumeView(target, handle.workdir)
        real_up, real_down = s3_module.s3_upload_dir, s3_module.s3_download_dir

        def upload(*args: Any, **kw: Any) -> Any:
            keys = real_up(*args, **kw)
            view.after_upload()
            return keys

        def download(target_: S3Target, key_prefix: str, *args: Any, **kw: Any) -> Any:
            view.before_download(key_prefix)
            return real_down(target_, key_prefix, *args, **kw)

        monkeypatch.setattr(s3_module, "s3_upload_dir", upload)
        monkeypatch.setattr(s3_module, "s3_download_dir", download)
        return target

    return make


@pytest.fixture(params=METHODS)
def pod_for_method(
    request: pytest.FixtureRequest, local_pod, direct_pod, s3_volume, runpodctl_standin
) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """A pod and the ``upload_dir`` / ``download_dir`` arguments for one method."""
    method = request.param
    _, handle, keypair = direct_pod if method in ("sftp", "rsync") else local_pod
    kw: dict[str, Any] = {"method": method}
    if method in ("sftp", "rsync"):
        kw["private_key"] = keypair.private_key
    elif method == "s3":
        kw["s3"] = s3_volume(handle)
    elif method == "runpodctl":
        kw["options"] = RunpodctlOptions(local_exe=runpodctl_standin, pod_exe=runpodctl_standin)
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        yield {"console": console, "handle": handle, "kw": kw}


def _shell_state(console: PodConsole) -> tuple[str, str]:
    return console.run("pwd").output, console.run("env | sort").output


@pytest.mark.slow
def test_a_round_trip_keeps_the_tree_and_the_callers_shell(
    tmp_path: Path, pod_for_method: dict[str, Any]
) -> None:
    console, handle, kw = pod_for_method["console"], pod_for_method["handle"], pod_for_method["kw"]
    src = make_link_tree(tmp_path / "src")
    console.run("cd /tmp && export PRX_CALLER=mine")
    before = _shell_state(console)
    up = upload_dir(console, handle, src, "tree", **kw)
    assert _shell_state(console) == before  # #13: `pwd` said …/.prefect-runpod/bin
    assert up.verified
    kinds = {e.path: e.kind for e in up.dest_manifest.entries}
    assert kinds["ckpt/empty"] == "dir" and kinds["current"] == "link"
    on_pod = Path(handle.workdir) / "tree"
    assert _tree(on_pod) == _tree(src)
    down = download_dir(console, handle, "tree", tmp_path / "back", **kw)
    assert console.run("jobs").output == ""  # no job whose "Done" notice comes later
    assert _shell_state(console) == before
    assert down.verified
    assert _tree(tmp_path / "back") == _tree(src)  # ckpt/empty and current came back


def _stamps(root: Path) -> dict[str, tuple[int, int]]:
    """Each file's inode and ctime: a write or a replacement changes one of them."""
    return {
        p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_ctime_ns)
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and not mf.is_transfer_scratch(p.name)
    }


@pytest.mark.slow
def test_a_second_upload_of_an_unchanged_tree_sends_no_file_content(
    tmp_path: Path, pod_for_method: dict[str, Any]
) -> None:
    """A resumed attempt or a retry uploads the same bundle again: every file is
    already on the pod with its manifest's digests, so nothing is sent or rewritten."""
    console, handle, kw = pod_for_method["console"], pod_for_method["handle"], pod_for_method["kw"]
    src = make_link_tree(tmp_path / "src")
    first = upload_dir(console, handle, src, "again", **kw)
    assert first.verified and first.sent_bytes == first.bytes > 0
    on_pod = Path(handle.workdir) / "again"
    before = _stamps(on_pod)
    second = upload_dir(console, handle, src, "again", **kw)
    assert second.verified and second.sent_bytes == 0 and second.retries == 0
    assert _stamps(on_pod) == before and _tree(on_pod) == _tree(src)


@pytest.mark.slow
def test_links_that_cannot_travel_are_refused_before_any_byte_moves(
    tmp_path: Path, pod_for_method: dict[str, Any]
) -> None:
    console, handle, kw = pod_for_method["console"], pod_for_method["handle"], pod_for_method["kw"]
    src = make_tree(tmp_path / "src", big_bytes=1000)
    (src / "passwd").symlink_to("/etc/passwd")
    (src / "gone").symlink_to("missing.bin")
    with pytest.raises(SpecError, match=r"gone \(dangling.*passwd \(absolute link"):
        upload_dir(console, handle, src, "refused", **kw)
    assert not (Path(handle.workdir) / "refused").exists()
    # On the pod: the download is refused before any file comes back.
    pod_tree = Path(handle.workdir) / "outputs-with-escape"
    make_tree(pod_tree, big_bytes=1000)
    (pod_tree / "key").symlink_to("/etc/hostname")
    with pytest.raises(SpecError, match=r"key \(absolute link to /etc/hostname"):
        download_dir(console, handle, "outputs-with-escape", tmp_path / "back", **kw)
    assert not any(p.is_file() for p in (tmp_path / "back").rglob("*"))


@pytest.mark.slow
def test_publish_sends_the_files_and_keeps_the_link_rule(
    tmp_path: Path, local_pod, publish_hub, caplog: pytest.LogCaptureFixture
) -> None:
    """The Hub holds files only: in-tree links and empty directories are named and not
    published; a link leaving the outputs is refused unless ``follow_links``."""
    from tests.fixtures.publish import publish_through

    _, handle, keypair = local_pod
    outputs = make_link_tree(Path(handle.workdir) / "outputs")
    token = publish_hub.tokens["write"].get_secret_value()
    with PodConsole.for_pod(handle, keypair.private_key) as console:
        with caplog.at_level("WARNING", logger="prefect_runpod.publish"):
            report = publish_through(
                console, handle, outputs, "hf:demo/tree", token, publish_hub.endpoint
            )
        assert report.verified
        assert {f.path for f in report.files} == {"ckpt/weights.bin", "notes.txt"}
        assert set(publish_hub.stored("demo/tree")) == {"ckpt/weights.bin", "notes.txt"}
        assert "ckpt/latest.bin -> weights.bin" in caplog.text
        assert "current -> ckpt" in caplog.text and "ckpt/empty/ (empty)" in caplog.text
        (tmp_path / "outside.txt").write_text("kept outside\n")
        (outputs / "outside").symlink_to(tmp_path / "outside.txt")
        with pytest.raises(SpecError, match=r"outside \(absolute link"):
            publish_through(console, handle, outputs, "hf:demo/escape", token, publish_hub.endpoint)
        assert ("model", "demo/escape") not in publish_hub.hub.repos
        report = publish_through(
            console,
            handle,
            outputs,
            "hf:demo/escape",
            token,
            publish_hub.endpoint,
            follow_links=True,
        )
        assert "outside" in {f.path for f in report.files}
        assert publish_hub.stored("demo/escape")["outside"] is not None
