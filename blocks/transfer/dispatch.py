"""Moving a directory to and from a pod, verified end to end (docs/architecture.md#transfers-and-integrity).

``upload_dir`` / ``download_dir`` pick a method from what the pod offers (or the
caller's choice), let it move the files, and return a ``TransferReport`` whose two
manifests (sha256 per file) were computed where the files were and where they
landed. A file that still differs after one retry raises ``ChecksumMismatchError``
naming it; nothing mismatched is accepted.

Methods are looked up by name in ``registry.METHOD_REGISTRY`` (name -> factory of a
``TransferMethod``, :mod:`prefect_runpod.blocks.transfer.base`); nothing here knows a
method by its name. The built-in ones, each in its own module:

    ``pty``        framed chunks through the PodConsole (works through RunPod's PTY-only
                   gateway); :mod:`prefect_runpod.blocks.transfer.pty`.
    ``sftp``       paramiko SFTP to a direct-TCP sshd; :mod:`.sftp`.
    ``rsync``      rsync over OpenSSH to a direct-TCP sshd with rsync; :mod:`.rsync`.
    ``s3``         boto3 to a RunPod network volume's S3 API; :mod:`.s3`.
    ``runpodctl``  ``runpodctl send``/``receive`` (croc relay); :mod:`.runpodctl`.

``auto`` takes the available method with the highest ``auto_priority`` (``s3`` when a
target is configured, ``rsync`` when the pod has a direct-TCP sshd and rsync, ``sftp``
when it has the sshd only, else ``pty``); once the pod runs, a method whose pod end
is missing (``pod_unavailable``) gives way to the next.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, wait
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from prefect_runpod.blocks.console.reconnect import resuming
from prefect_runpod.blocks.exceptions import SpecError, TransferError
from prefect_runpod.blocks.interrupts import raise_if_stopped
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.pod_side import manifest as mf
from prefect_runpod.blocks.transfer import registry
from prefect_runpod.blocks.transfer.base import (
    MethodConfig,
    MethodOptions,
    PodLink,
    ProgressCallback,
    TransferHooks,
    TransferMethod,
    is_disk_full,
    local_disk_full,
)
from prefect_runpod.blocks.transfer.models import (
    Manifest,
    MethodResult,
    TransferReport,
    refuse_links,
)
from prefect_runpod.blocks.transfer.pod_tools import bootstrap_pod_tools, remote_path

if TYPE_CHECKING:
    from prefect_runpod.blocks.console.session import PodConsole
    from prefect_runpod.blocks.transfer.pty import PtyMethod
    from prefect_runpod.blocks.transfer.rsync import RsyncMethod
    from prefect_runpod.blocks.transfer.runpodctl import RunpodctlMethod
    from prefect_runpod.blocks.transfer.s3 import S3Method, S3Target
    from prefect_runpod.blocks.transfer.sftp import SftpMethod

    # mypy checks here that every built-in class implements the protocol
    _BUILT_IN: tuple[type[TransferMethod], ...] = (
        PtyMethod,
        SftpMethod,
        RsyncMethod,
        S3Method,
        RunpodctlMethod,
    )

__all__ = [
    "check_pod_end",
    "check_tree",
    "download_dir",
    "pick_method",
    "upload_dir",
]


def _choose(
    handle: PodHandle, requested: str, config: MethodConfig, pod: PodLink | None = None
) -> tuple[str, TransferMethod]:
    """``(name, method)`` for ``requested`` (see ``pick_method``); with ``pod`` (the pod
    runs), ``auto`` also passes over methods whose pod end is missing."""
    if requested == "auto":
        ranked: list[tuple[int, str, TransferMethod]] = []
        for name, factory in registry.METHOD_REGISTRY.items():
            method = factory(config)
            if method.auto_priority is not None and method.unavailable(handle) is None:
                ranked.append((method.auto_priority, name, method))
        ranked.sort(key=lambda r: -r[0])  # stable: the registry's order breaks ties
        for _rank, name, method in ranked:
            ask = getattr(method, "pod_unavailable", None) if pod is not None else None
            if ask is None or ask(pod) is None:
                return name, method
        raise SpecError(
            f"no transfer method can reach pod {handle.pod_id}; name one of "
            f"{', '.join(registry.METHOD_REGISTRY)}",
            pod_id=handle.pod_id,
        )
    build = registry.METHOD_REGISTRY.get(requested)
    if build is None:
        raise SpecError(
            f"unknown transfer method {requested!r}; use auto, {', '.join(registry.METHOD_REGISTRY)}"
        )
    method = build(config)
    reason = method.unavailable(handle)
    if reason is not None:
        raise SpecError(reason, pod_id=handle.pod_id)
    return requested, method


def _choose_again(
    handle: PodHandle, config: MethodConfig, pod: PodLink, chosen: str, method: TransferMethod
) -> tuple[str, TransferMethod]:
    """``auto``'s choice once the pod runs: ``(chosen, method)`` itself (with whatever
    it connected early) while its pod end is there, else the next method's."""
    name, other = _choose(handle, "auto", config, pod)
    return (chosen, method) if name == chosen else (name, other)


def _connecting(
    method: TransferMethod, handle: PodHandle, console: PodConsole
) -> contextlib.AbstractContextManager[object]:
    """The method's early connection (its optional ``connecting(handle, console)``:
    logging in while the pod's tools are checked and the local tree hashed), or
    nothing for methods without one."""
    start = getattr(method, "connecting", None)
    return start(handle, console) if start is not None else contextlib.nullcontext()


def pick_method(handle: PodHandle, requested: str = "auto", s3: S3Target | None = None) -> str:
    """The transfer method for this pod.

    ``auto``: of the registered methods that are available, the one with the highest
    ``auto_priority`` — ``s3`` when a network volume is configured, ``rsync`` when the
    pod has a direct-TCP sshd and this machine rsync, ``sftp`` when it has the sshd,
    else ``pty`` (RunPod's gateway refuses SFTP and exec). Once the pod runs,
    ``upload_dir`` / ``download_dir`` / ``check_pod_end`` pass over a method whose pod
    end is missing (rsync not on the pod: ``sftp`` then).

    Raises:
        SpecError: an unknown method, or one that says it cannot work here (``sftp``
            without a direct endpoint, ``s3`` without a network volume).
    """
    return _choose(handle, requested, MethodConfig(s3=s3))[0]


def check_pod_end(
    console: PodConsole,
    handle: PodHandle,
    requested: str = "auto",
    *,
    s3: S3Target | None = None,
    private_key: SecretStr | None = None,
    options: MethodOptions | None = None,
) -> str:
    """Once the pod runs and before any byte moves: the method ``upload_dir`` would use,
    asked whether the pod as it now is can serve it (``TransferMethod.pod_unavailable``:
    a tool missing on the pod, an endpoint that did not appear).

    Args:
        console: an open console to the pod.
        handle: the ready pod.
        requested: ``auto`` or a registered name.
        s3 / private_key / options: as for ``upload_dir``.

    Returns:
        The name of the method the transfers will use.

    Raises:
        SpecError: the method cannot work with this pod (the method's own reason).
    """
    config = MethodConfig(private_key=private_key, s3=s3, options=options)
    chosen, method = _choose(handle, requested, config)
    link = PodLink(handle, console, bootstrap_pod_tools(resuming(console), handle))
    if requested == "auto":  # the first whose pod end is there
        return _choose(handle, requested, config, link)[0]
    ask = getattr(method, "pod_unavailable", None)  # methods registered before it existed
    reason = ask(link) if ask else None
    if reason is not None:
        raise SpecError(reason, pod_id=handle.pod_id)
    return chosen


def check_tree(
    root: Path | str, *, follow_links: bool = False, paths: list[str] | None = None
) -> None:
    """Refuse a local tree that a transfer would refuse, without hashing anything (the
    check a run makes on its bundle before it rents a pod).

    Args:
        root: a local folder or file.
        follow_links: links that leave the tree will be copied through (only dangling
            ones are refused then).
        paths: only these entries of the tree (the upload's selection); None for all.

    Raises:
        SpecError: ``root`` does not exist, or holds links that leave the tree or
            dangle (each named).
    """
    if not os.path.exists(root):
        raise SpecError(f"{root} does not exist")
    if paths is None:
        _items, problems = mf.scan_tree(str(root), follow_links)
    else:
        _items, problems = mf.select_tree(str(root), paths, follow_links)
    if problems:
        raise refuse_links(str(root), problems)


def _report(
    direction: str, method: str, started: float, result: MethodResult, source: Manifest
) -> TransferReport:
    """The ``TransferReport`` of ``result``, verified against ``source`` (the manifest
    dispatch trusts: its own for an upload, the pod's for a download)."""
    problems = mf.compare_manifests(source.as_dict(), result.dest_manifest.as_dict())
    return TransferReport(
        direction=direction,  # type: ignore[arg-type]
        method=method,
        bytes=result.bytes,
        sent_bytes=result.sent_bytes,
        seconds=time.monotonic() - started,
        retries=result.retries + result.reconnects,
        source_manifest=source,
        dest_manifest=result.dest_manifest,
        verified=not problems,
        link=result.link,
    )


def _at_chunks(on_progress: ProgressCallback | None) -> ProgressCallback:
    """``on_progress`` with a stop boundary after it: a Ctrl-C the garbage collector
    dropped (``blocks.interrupts``) is raised at the next confirmed chunk, in the main
    thread (a lane's thread leaves it to the main one)."""

    def step(done: int, total: int) -> None:
        if on_progress is not None:
            on_progress(done, total)
        raise_if_stopped()

    return step


def _tools_while_hashing(
    console: PodConsole, handle: PodHandle, local_dir: Path, paths: list[str] | None, follow: bool
) -> tuple[str, Manifest]:
    """``(tools dir, source manifest)``: the pod's tools are checked
    (``bootstrap_pod_tools``, a round trip: a gateway's 100 ms and more) on a thread of
    its own while the local tree is hashed here, not one after the other. The hashing
    stays on this thread: large reads on a short-lived thread leave their memory in
    its own allocator arena (about 20-30 MiB more peak RSS, measured). The check has
    finished, the console free again, before any error is raised."""
    checked: Future[str] = Future()

    def check() -> None:
        try:
            checked.set_result(bootstrap_pod_tools(resuming(console), handle))
        except BaseException as exc:  # handed over by .result()
            checked.set_exception(exc)

    threading.Thread(target=check, name="pod-tools-check", daemon=True).start()
    try:
        source = Manifest.compute(local_dir, paths, follow_links=follow)
    except BaseException:
        wait([checked])
        raise
    return checked.result(), source


def upload_dir(
    console: PodConsole,
    handle: PodHandle,
    local_dir: Path,
    remote_dir: str,
    *,
    method: str = "auto",
    private_key: SecretStr | None = None,
    s3: S3Target | None = None,
    on_progress: ProgressCallback | None = None,
    options: MethodOptions | None = None,
    hooks: TransferHooks | None = None,
    paths: list[str] | None = None,
    follow_links: bool = False,
) -> TransferReport:
    """Upload the tree ``local_dir`` (a folder or one file) to ``remote_dir`` on the pod:
    its files, empty directories and in-tree relative links, which are made links
    again on the pod. The console's shell keeps its working directory and environment.

    Args:
        console: an open console to the pod (the pty method runs through it; the
            others use it to install tools and verify).
        handle: the pod; ``remote_dir`` is relative to ``handle.workdir`` unless absolute.
        local_dir: the local folder or file.
        remote_dir: the pod folder the files land in.
        method: ``auto`` or a registered name (``method_names()``; see ``pick_method``).
        private_key: needed by ``sftp`` (a second SSH connection).
        s3: the bucket / network volume for ``s3``.
        on_progress: ``(done_bytes, total_bytes)``.
        options: one method's options (``PtyOptions``, ``RunpodctlOptions``): used when
            the chosen method is theirs, ignored otherwise.
        hooks: fault points (``TransferHooks``) for methods that honour them.
        paths: only these entries of ``local_dir`` (the bundle's selection: files,
            links and empty directories, ignore file and secret scan applied); None for
            the whole tree. Entries not listed never leave this machine, whatever the
            method.
        follow_links: copy what links that leave the tree point at, instead of refusing
            them (dangling links are refused either way).

    Returns:
        A ``TransferReport`` with ``verified=True`` (source manifest computed locally,
        destination manifest on the pod's disk).

    Raises:
        ChecksumMismatchError: a file differs after one retry (named).
        TransferError: disk full on the pod (file named), connection lost for good.
        SpecError: nothing to upload, links that leave the tree or dangle (each named,
            before any byte moves), or the method is not possible for this pod.
    """
    started = time.monotonic()
    local_dir = Path(local_dir)
    if not local_dir.exists():
        raise SpecError(f"nothing to upload: {local_dir} does not exist")
    config = MethodConfig(
        private_key=private_key, s3=s3, options=options, hooks=hooks, follow_links=follow_links
    )
    chosen, transfer = _choose(handle, method, config)
    remote = remote_path(handle, remote_dir)
    with _connecting(transfer, handle, console):
        tools, source = _tools_while_hashing(console, handle, local_dir, paths, follow_links)
        link = PodLink(handle, console, tools)
        if method == "auto":
            chosen, transfer = _choose_again(handle, config, link, chosen, transfer)
        result = transfer.upload(
            link, local_dir, remote, source, on_progress=_at_chunks(on_progress)
        )
    report = _report("upload", chosen, started, result, source)
    if not report.verified:  # the methods raise first; this is the last guard
        pod = handle.pod_id
        raise TransferError(f"pod {pod}: upload of {local_dir} did not verify", pod_id=pod)
    return report


def download_dir(
    console: PodConsole,
    handle: PodHandle,
    remote_dir: str,
    local_dir: Path,
    *,
    method: str = "auto",
    private_key: SecretStr | None = None,
    s3: S3Target | None = None,
    on_progress: ProgressCallback | None = None,
    options: MethodOptions | None = None,
    hooks: TransferHooks | None = None,
    follow_links: bool = False,
) -> TransferReport:
    """Download the tree ``remote_dir`` from the pod into ``local_dir``: files, empty
    directories and in-tree relative links; arguments as ``upload_dir``.

    Returns:
        A ``TransferReport`` with ``verified=True``: the source manifest was computed on
        the pod, the destination manifest re-read from the local disk.

    Raises:
        ChecksumMismatchError, TransferError, SpecError: as ``upload_dir`` (links on the
            pod that leave the tree or dangle are refused before any byte moves); a
            full local disk is a ``TransferError`` saying so (``local_disk_full``).
    """
    started = time.monotonic()
    local_dir = Path(local_dir)
    config = MethodConfig(
        private_key=private_key, s3=s3, options=options, hooks=hooks, follow_links=follow_links
    )
    chosen, transfer = _choose(handle, method, config)
    remote = remote_path(handle, remote_dir)
    with _connecting(transfer, handle, console):
        link = PodLink(handle, console, bootstrap_pod_tools(resuming(console), handle))
        if method == "auto":
            chosen, transfer = _choose_again(handle, config, link, chosen, transfer)
        try:
            result = transfer.download(link, remote, local_dir, on_progress=_at_chunks(on_progress))
        except OSError as exc:
            if is_disk_full(exc):
                raise local_disk_full(local_dir, exc, handle.pod_id) from exc
            raise
    report = _report("download", chosen, started, result, result.source_manifest)
    if not report.verified:
        pod = handle.pod_id
        raise TransferError(f"pod {pod}: download of {remote} did not verify", pod_id=pod)
    return report
