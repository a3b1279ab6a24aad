"""One flow run on one pod, for the ``runpod`` worker (docs/worker.md#what-run-does).

Plain, blocking Python (the worker calls it from a thread), made of the fine-tune's
pieces: the provider from the registry (``flows.run.providers.build_provider``), the
pod's tools and dead-man switch (``tasks.provision.prepare_pod``), the verified upload
(``blocks.transfer.dispatch.upload_dir``), the venv that sees this machine's packages
(``tasks.publish_env.host_packages_venv``), the console's hidden export, the launcher
and its log follower (``blocks.console.launcher_client``), the confirmed terminate and
the ``finetune-costs`` record (``flows.run.cost_record``).

Order: ``rent`` (a live pod of the same name is ended first; the pod id goes to
``on_created`` before any wait), ``put_code``, ``ready_python``,
``install_requirements``, ``launch``, ``follow``;
``end`` whatever happened.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import sys
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from prefect_runpod.blocks.api_outbox import outbox
from prefect_runpod.blocks.console.launcher_client import (
    LogFollower,
    kill_training,
    launch_training,
    sleep_in_steps,
)
from prefect_runpod.blocks.console.reconnect import ReconnectPolicy
from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.pod_handle import PodHandle
from prefect_runpod.blocks.pod_watch import PodWatch
from prefect_runpod.blocks.provider import (
    Capability,
    DeadmanConfig,
    EndedBy,
    PodEnd,
    PodProvider,
    PodRequest,
)
from prefect_runpod.blocks.provider_registry import provider_supports
from prefect_runpod.flows.run.attempts import PodAttempt
from prefect_runpod.flows.run.cost_record import CostRecord, publish_record, record_pod_end
from prefect_runpod.flows.run.heartbeat import heartbeat_interval_seconds
from prefect_runpod.flows.run.names import (
    POD_KEY_FILE,
    forget_pod_access,
    pod_name_for,
    save_pod_key,
)
from prefect_runpod.flows.worker.adoption import heartbeat_quiet, worker_run_dir
from prefect_runpod.flows.worker.code import PREFECT_DEFAULT_COMMAND, local_code_dir, pod_command
from prefect_runpod.flows.worker.config import RunPodJobConfiguration, with_spec

__all__ = [
    "HIDDEN_ENV",
    "PREFECT_DEFAULT_COMMAND",
    "PodFlowRun",
    "local_code_dir",
    "pod_command",
]

HIDDEN_ENV = ("PREFECT_API_URL", "PREFECT_API_KEY", "PREFECT_API_AUTH_STRING")
"""Settings the pod's shell gets through the console's hidden export only: never in the
create request, a command line, ``train.cmd`` or a log."""

_NOT_FOR_THE_POD = frozenset(
    {*HIDDEN_ENV, "PREFECT_HOME", "PREFECT_PROFILES_PATH", "PREFECT_LOCAL_STORAGE_PATH"}
)
"""The worker's settings that name this machine (its home, profiles, storage folder)."""

_READY_TIMEOUT_SECONDS = 600.0
_POLL_SECONDS = 1.0
_STATE_EVERY_SECONDS = 2.0
_AFTER_FINAL_STATE_SECONDS = 30.0
_FLOW_STOP_GRACE_SECONDS = 20.0
"""How long the pod's dead-man gives the flow process, SIGTERMed, before it ends the pod:
time for Prefect's engine to mark its run Crashed itself when no worker is left to."""
_log = logging.getLogger("prefect_runpod.worker")


class PodFlowRun:
    """A flow run on a pod, from renting to the confirmed end.

    Args:
        config: the run's job configuration.
        flow_run_id: the run (its pod is ``<name_prefix>-<flow_run_id>``).
        api_url: the Prefect API URL the pod uses (``api_url.pod_api_url``).
        api_key: the Prefect API key, or None (a server without auth).
        logger: the flow run's logger on the worker (what the worker decides).
        on_created: called with the pod id as soon as it exists (the infrastructure id).

    Attributes:
        provider / key / handle / tools_dir / run_dir / python: filled in as the pod
            comes up.
        tail: the flow process's last output lines (for a crash's diagnosis).
        stopped: why the worker stopped the flow process (``cancelled``,
            ``runtime cap``), or None.
    """

    def __init__(
        self,
        config: RunPodJobConfiguration,
        flow_run_id: str,
        *,
        api_url: str,
        api_key: str | None,
        logger: Any,
        on_created: Callable[[str], None],
    ) -> None:
        from prefect_runpod.flows.run.providers import build_provider

        self.config, self.flow_run_id = config, flow_run_id
        self.api_url, self.api_key = api_url, api_key
        self.logger, self.on_created = logger, on_created
        provider, keypair = build_provider(config.provider_params())
        self.provider: PodProvider = with_spec(provider, config)
        self.keypair = keypair
        self.key: SecretStr = keypair.private_key
        self.kept_key = worker_run_dir(flow_run_id) / POD_KEY_FILE
        self.name = pod_name_for(config.name_prefix, flow_run_id)
        self.handle: PodHandle | None = None
        self.watch: PodWatch | None = None
        self.reconnect: ReconnectPolicy | None = None
        self.console: Any = None
        self.tools_dir = self.run_dir = ""
        self.python = "python3"
        self.code_uploaded = False
        self.tail: deque[str] = deque(maxlen=20)
        self.stopped: str | None = None
        self.deadman = DeadmanConfig(
            heartbeat_stale_seconds=config.heartbeat_stale_seconds,
            lifetime_seconds=config.pod_lifetime_seconds,
            check_interval_seconds=heartbeat_interval_seconds(config.heartbeat_stale_seconds),
            stop_run_seconds=_FLOW_STOP_GRACE_SECONDS,
        )

    # -- bring up ---------------------------------------------------------------------

    def rent(self) -> PodHandle:
        """End a live pod of this run's name (a run handed over again), create the pod,
        record it (the infrastructure id, the cost record) before any wait, wait until
        its SSH answers, put the pod tools on it and arm the dead-man switch.

        Raises:
            ProviderError / PodTimeoutError / TerminateError: as ``tasks.provision``;
            SpecError: the pod's price is over ``max_usd_per_hour``.
        """
        from prefect_runpod.blocks.console.session import PodConsole
        from prefect_runpod.tasks.provision import prepare_pod
        from prefect_runpod.tasks.terminate import terminate_by_name

        if terminate_by_name(self.provider, self.name) is not None:
            self.logger.info("ended the pod %s an earlier attempt of this run left", self.name)
        request = PodRequest(
            public_key=self.keypair.public_key,
            deadman=self.deadman,
            allowed_cuda_versions=list(self.config.allowed_cuda_versions),
        )
        handle = self.provider.create(request, self.name)
        self.handle = handle
        self._keep_key()
        self.on_created(handle.pod_id)
        self._record_rented(handle)
        self.logger.info(
            "pod %s (%s) created: %s, %.4f USD/h",
            handle.pod_id, self.name, handle.gpu_type, handle.cost_per_hr,
        )  # fmt: skip
        cap = self.config.max_usd_per_hour
        if cap is not None and handle.cost_per_hr > cap:
            raise SpecError(
                f"pod {handle.pod_id} costs {handle.cost_per_hr:.4f} USD/h, over "
                f"max_usd_per_hour={cap:g}; it is ended and the run not started"
            )
        handle = self.provider.wait_ready(handle, _READY_TIMEOUT_SECONDS)
        self._reach(handle)
        self.tools_dir = prepare_pod(handle, self.key, self.run_dir, self.deadman, self.reconnect)
        self.console = PodConsole.for_pod(handle, self.key, reconnect=self.reconnect)
        self.console.connect()
        return handle

    def _reach(self, handle: PodHandle) -> None:
        self.handle = handle
        self.watch = PodWatch(self.provider, handle.pod_id, 10.0).start()
        self.reconnect = ReconnectPolicy(status=self.watch.ask, unreachable=self.watch.unreachable)
        self.run_dir = f"{handle.workdir.rstrip('/')}/prefect-runpod/{self.flow_run_id}"

    def _keep_key(self) -> None:
        """Keep a per-run key (the local pod's) where a restarted worker finds it; a
        provider that reaches pods with the user's key, or a saved key block, needs none."""
        if self.config.ssh_key_block or provider_supports(
            self.config.provider, Capability.USER_KEY
        ):
            return
        save_pod_key(self.key, self.kept_key.parent)

    def adopt(self, handle: PodHandle, quiet_seconds: float) -> bool:
        """Take over this run's live pod from a worker that stopped (a restart): reach
        it, make sure no other worker follows it (its heartbeat stays untouched for
        ``quiet_seconds``, ``adoption_quiet_seconds``), then put the tools on it again
        and re-arm its dead-man switch (both idempotent), so ``follow`` and ``end`` go on
        as if this worker had started it.

        Returns:
            True when the pod is now this worker's; False when another worker touched
            its heartbeat meanwhile (it follows the pod; nothing was changed).

        Raises:
            ConsoleError / PodGoneError / PodTimeoutError: the pod could not be reached.
        """
        from prefect_runpod.blocks.console.session import PodConsole
        from prefect_runpod.tasks.provision import prepare_pod

        if self.kept_key.is_file():  # the per-run key the earlier worker reached it with
            self.key = SecretStr(self.kept_key.read_text())
        handle = self.provider.wait_ready(handle, 60.0)
        self._reach(handle)
        self.console = PodConsole.for_pod(handle, self.key, reconnect=self.reconnect)
        self.console.connect()
        if not heartbeat_quiet(self.console, self.run_dir, self.name, quiet_seconds):
            return False
        self.tools_dir = prepare_pod(handle, self.key, self.run_dir, self.deadman, self.reconnect)
        self.logger.info(
            "adopted pod %s (%s) after a worker restart: following the flow process again",
            handle.pod_id, self.name,
        )  # fmt: skip
        return True

    def _record_rented(self, handle: PodHandle) -> None:
        """The run's ``finetune-costs`` record with the pod in it, while it may bill."""
        attempt = PodAttempt.of(handle, 1).model_copy(update={"handle": None})
        record = CostRecord(flow_run_id=self.flow_run_id, attempts=[attempt], recorded_by="worker")
        record.settle()
        held = publish_record(record, hold=True)  # held through an outage of the Prefect API
        if held is not None and not outbox().wait_for(held):  # the pod is ended whatever
            self.logger.warning("pod %s's cost record: %s", handle.pod_id, held.error or "held")

    def put_code(self, local_dir: Path | None) -> None:
        """Upload the deployment's local folder to ``<run_dir>/code``, verified by
        manifest (the bundle's upload: ignore file and secret scan applied); nothing
        when the pod fetches the code itself (``local_dir`` None).

        Raises:
            SpecError: files that look like secrets, or that cannot travel.
            ChecksumMismatchError / TransferError: as ``upload_dir``.
        """
        from prefect_runpod.blocks.transfer.dispatch import upload_dir
        from prefect_runpod.tasks.bundle_files import select_bundle_files

        assert self.handle is not None
        self.console.run(f"mkdir -p {shlex.quote(self.run_dir)}/code", check=True)
        if local_dir is None:
            return
        selection = select_bundle_files(local_dir)
        report = upload_dir(
            self.console,
            self.handle,
            local_dir,
            f"{self.run_dir}/code",
            private_key=self.key,
            paths=selection.files,
        )
        self.code_uploaded = True
        self.logger.info(
            "uploaded %s to pod %s: %d files, %d bytes by %s, verified",
            local_dir, self.handle.pod_id, len(selection.files), report.bytes, report.method,
        )  # fmt: skip

    def ready_python(self) -> str:
        """A Python on the pod that imports Prefect at this worker's version: the local
        pod's venv that sees this machine's site-packages (nothing installed); on
        RunPod the image's ``python3`` when its Prefect has this version's minor, else a
        venv beside the image's packages with ``prefect==<this version>`` installed.

        Raises:
            SpecError: the local pod's Python differs from this one's minor version, or
                the pod could not install Prefect.
        """
        import prefect

        from prefect_runpod.tasks.publish_env import host_packages_venv, host_site_dirs

        assert self.handle is not None
        q = shlex.quote
        venv = f"{self.run_dir}/venv"
        probe = "import sys; print('PYVER=%d.%d' % sys.version_info[:2])"
        seen = self.console.run(f"python3 -c {q(probe)}", check=True).output or ""
        mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if provider_supports(self.handle.provider, Capability.ON_THIS_MACHINE):
            if f"PYVER={mine}" not in seen:
                raise SpecError(
                    f"the local pod's python3 is not Python {mine}, the worker's: the local "
                    "pod lends the flow this environment's packages, which needs the same "
                    "minor version"
                )
            commands = host_packages_venv("python3", venv, host_site_dirs())
        else:
            has = "import prefect; print('PREFECT=' + prefect.__version__)"
            found = self.console.run(f"python3 -c {q(has)} 2>/dev/null || true").output or ""
            wanted = ".".join(prefect.__version__.split(".")[:2])
            if f"PREFECT={wanted}." in found:
                self.python = "python3"
                return self.python
            commands = [
                f"python3 -m venv --system-site-packages {q(venv)}",
                f"{q(venv)}/bin/python -m pip install --disable-pip-version-check --no-input "
                f"--progress-bar off {q('prefect==' + prefect.__version__)}",
            ]
        for command in commands:
            self.console.run(command, check=True, timeout_seconds=900.0)
        self.python = f"{venv}/bin/python"
        return self.python

    def install_requirements(self) -> None:
        """``code.install_requirements`` with the flow's Python in the code folder: the job
        variable's, and the uploaded code's ``pip_install_requirements`` files."""
        from prefect_runpod.flows.worker.code import install_requirements, requirement_files

        assert self.handle is not None
        files = requirement_files(self.config.deployment) if self.code_uploaded else []
        installed = install_requirements(
            self.console, self.python, f"{self.run_dir}/code", list(self.config.requirements),
            files, pod_id=self.handle.pod_id,
        )  # fmt: skip
        if installed:
            self.logger.info("installed on pod %s: %s", self.handle.pod_id, " ".join(installed))

    def launch(self) -> None:
        """Hand the pod's shell the Prefect API URL and key hidden, export the flow's
        own environment, and start its command detached through the launcher.

        Raises:
            TrainingError: the launcher refused or the pod could not be reached.
        """
        assert self.handle is not None
        self.console.set_secret_env("PREFECT_API_URL", SecretStr(self.api_url), mask=False)
        if self.api_key:
            self.console.set_secret_env("PREFECT_API_KEY", SecretStr(self.api_key))
        env = {
            k: v
            for k, v in (self.config.env or {}).items()
            if v is not None and k not in _NOT_FOR_THE_POD
        }
        deployment = self.config.deployment
        if self.code_uploaded and deployment is not None and deployment.entrypoint:
            env["PREFECT__FLOW_ENTRYPOINT"] = deployment.entrypoint
        env["PREFECT__FLOW_RUN_ID"] = self.flow_run_id
        exports = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted(env.items()))
        self.console.run(f"export {exports}", check=True)
        command = pod_command(self.config.command, self.python, code_uploaded=self.code_uploaded)
        started = launch_training(
            self.console,
            self.run_dir,
            self.tools_dir,
            command,
            cwd=f"{self.run_dir}/code",
            pod_id=self.handle.pod_id,
        )
        self.logger.info(
            "flow process started on pod %s (pid %s): %s",
            self.handle.pod_id,
            started["pid"],
            command,
        )

    # -- follow -----------------------------------------------------------------------

    def follow(self, state_type: Callable[[], str | None]) -> int | None:
        """Read the flow process's output until it ends (each read refreshes the pod's
        heartbeat), stopping it when the flow run is being cancelled, reached a final
        state and the process lingers, or passes ``max_runtime_seconds``.

        Args:
            state_type: the flow run's state type now (``RUNNING``, ``CANCELLING``…).

        Returns:
            The process's exit code, or None when the launcher lost it.

        Raises:
            PodGoneError: the pod is gone under the run.
            TrainingError: the pod stayed unreachable.
        """
        assert self.handle is not None
        follower = LogFollower(
            self.console,
            self.run_dir,
            self.tools_dir,
            on_line=self._pod_line,
            pod_id=self.handle.pod_id,
        )
        cap = self.config.max_runtime_seconds
        started = time.monotonic()
        next_look, final_seen = 0.0, None
        while True:
            chunk = follower.read_once()
            if not chunk.running and chunk.next_offset >= chunk.log_bytes:
                return chunk.exit_code
            now = time.monotonic()
            if self.stopped is None and now >= next_look:
                next_look = now + _STATE_EVERY_SECONDS
                state = state_type()
                if state == "CANCELLING":
                    self._stop("cancelled")
                elif state in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
                    final_seen = final_seen or now
                    if now - final_seen > _AFTER_FINAL_STATE_SECONDS:
                        self._stop(f"lingered after its {state} state")
                elif cap and now - started > cap:
                    self._stop("runtime cap")
            sleep_in_steps(_POLL_SECONDS, time.sleep)

    def _pod_line(self, line: str) -> None:
        self.tail.append(line)
        _log.debug("%s | %s", self.name, line)

    def _stop(self, why: str) -> None:
        assert self.handle is not None
        self.stopped = why
        self.logger.info("stopping the flow process on pod %s (%s)", self.handle.pod_id, why)
        kill_training(
            self.console,
            self.run_dir,
            self.tools_dir,
            grace_seconds=10.0,
            pod_id=self.handle.pod_id,
        )

    # -- end --------------------------------------------------------------------------

    def release(self) -> None:
        """Stop watching the pod and close its console, leaving the pod as it is (a pod
        another worker follows)."""
        if self.watch is not None:
            self.watch.stop()
        if self.console is not None:
            with contextlib.suppress(Exception):
                self.console.close()

    def end(self) -> PodEnd | None:
        """Stop watching, close the console, end the pod and wait for the provider's
        confirmation, and record the end in the run's ``finetune-costs`` record.

        Returns:
            The pod's end, or None when no pod was created.

        Raises:
            TerminateError: the end was not confirmed (the pod may still bill; recorded
                so first).
        """
        from prefect_runpod.blocks.exceptions import TerminateError

        if self.watch is not None:
            self.watch.stop()
        if self.console is not None:
            try:
                self.console.close()
            except Exception as exc:  # the pod is ended next whatever its console says
                _log.debug("console close: %s", exc)
        if self.handle is None:
            return None
        handle = self.handle
        try:
            result = self.provider.terminate(handle.pod_id, self.config.terminate_timeout_seconds)
        except TerminateError as exc:
            end = PodEnd(
                pod_id=handle.pod_id, layer="terminate (the runpod worker)", detail=str(exc)
            )
            record_pod_end(
                self.flow_run_id, end, recorded_by="worker", handle=handle, provider=self.provider
            )
            raise
        end = result.end(
            EndedBy.FLOW if not result.already_gone else EndedBy.OUTSIDE,
            "terminate (the runpod worker)",
            detail=self.stopped or "",
        )
        record_pod_end(
            self.flow_run_id, end, recorded_by="worker", handle=handle, provider=self.provider
        )
        forget_pod_access(self.kept_key.parent if self.kept_key.is_file() else None, None)
        with contextlib.suppress(OSError):
            self.kept_key.parent.rmdir()
        self.logger.info(
            "pod %s ended, confirmed at %s",
            handle.pod_id, result.confirmed_at.astimezone(UTC).strftime("%H:%M:%S UTC"),
        )  # fmt: skip
        return end
