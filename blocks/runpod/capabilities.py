"""What RunPod offers beyond the ``PodProvider`` calls (docs/architecture.md#capabilities):
the provider built from a run's parameters, the pod a run is about to rent, the GPU
types' prices and availability, RunPod's own bill, the account's checks, the user's key,
and the parameters only RunPod takes. ``RunPodProvider`` inherits them.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from prefect_runpod.blocks.exceptions import SpecError
from prefect_runpod.blocks.keys import KeyPair
from prefect_runpod.blocks.pod_handle import PodHandle, SSHEndpoint
from prefect_runpod.blocks.provider_capabilities import (
    AccountCheck,
    Capability,
    Capable,
    Offer,
    Offers,
    PlannedPod,
    ProviderBill,
)
from prefect_runpod.blocks.secret_mask import check_secret, error_text
from prefect_runpod.blocks.validation import load_block, pydantic_reason

if TYPE_CHECKING:
    from prefect_runpod.blocks.runpod.blocks import RunPodCredentials, RunPodPodSpec
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey

__all__ = ["DEFAULT_KEY_PATH", "RunPodCapabilities"]

DEFAULT_KEY_PATH = "~/.ssh/id_ed25519_runpod"
"""Where the RunPod SSH key is read from without a key block (``RUNPOD_SSH_KEY_PATH``)."""


class RunPodCapabilities(Capable):
    """RunPod's side of the capabilities (see ``blocks/provider_capabilities.py``)."""

    provider_name = "runpod"
    display_name = "RunPod"
    capabilities = frozenset(
        {
            Capability.POD_PLAN,
            Capability.PRICES,
            Capability.BILL,
            Capability.SELF_TERMINATE,
            Capability.OPTIONS,
            Capability.ACCOUNT,
            Capability.USER_KEY,
        }
    )

    credentials: RunPodCredentials
    spec: RunPodPodSpec
    ssh_key: RunPodSSHKey

    if TYPE_CHECKING:
        from prefect_runpod.blocks.runpod.api import RunPodApi
        from prefect_runpod.blocks.runpod.catalog import GpuAvailability

        @property
        def api(self) -> RunPodApi: ...
        def gpu_offers(self) -> dict[str, GpuAvailability]: ...

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The run parameters that mean something for RunPod only."""
        return ("runpod_credentials_block", "runpod_spec_block", "ssh_key_block", "gpu_type_ids")

    @classmethod
    def user_key_path(cls) -> str:
        """The key file a person gets into a RunPod pod with: ``RUNPOD_SSH_KEY_PATH``,
        default ``~/.ssh/id_ed25519_runpod`` (as written: ``~`` not expanded)."""
        return os.environ.get("RUNPOD_SSH_KEY_PATH", DEFAULT_KEY_PATH)

    @classmethod
    def from_params(cls, params: dict[str, Any], *, need_ssh_key: bool = True) -> Any:
        """A ``RunPodProvider`` and its key pair from the named blocks
        (``runpod_credentials_block``, ``runpod_spec_block``, ``ssh_key_block``); a block
        that is named must exist. Only without a name, the API key is read from
        ``RUNPOD_API_KEY`` and the SSH key from ``RUNPOD_SSH_KEY_PATH``; without a key
        and with ``need_ssh_key`` False (callers that only list and end pods), a
        throwaway one. ``RUNPOD_SSH_GATEWAY_HOST`` / ``_PORT`` point at another gateway.

        Returns:
            ``(RunPodProvider, KeyPair)``.

        Raises:
            SpecError: a named block is not saved, no API key, no SSH key (when needed),
                or a GPU type id list that is not one.
            SecretShapeError: the API key holds whitespace or a control character.
        """
        from prefect_runpod.blocks.runpod.blocks import RunPodCredentials, RunPodPodSpec
        from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey

        def _load(block: Any, param: str) -> Any:
            name = params.get(param)
            return load_block(block, name, param) if name else None

        creds = _load(RunPodCredentials, "runpod_credentials_block")
        if creds is None:
            creds = RunPodCredentials(api_key=SecretStr(_env_api_key()))
        else:
            what = (
                f"the api_key of the RunPodCredentials block {params['runpod_credentials_block']!r}"
            )
            key = creds.api_key.get_secret_value()
            fix = "remove it and save the block again"
            creds.api_key = SecretStr(check_secret(key, what, fix=fix))
        spec = _load(RunPodPodSpec, "runpod_spec_block") or RunPodPodSpec()
        if params.get("gpu_type_ids"):
            spec = spec.model_copy(update={"gpu_type_ids": list(params["gpu_type_ids"])})
            try:
                spec = RunPodPodSpec.model_validate(spec.model_dump())  # validate the ids
            except ValueError as exc:
                raise SpecError(f"gpu_type_ids (--gpu-type): {pydantic_reason(exc)}") from None
        key_block = _load(RunPodSSHKey, "ssh_key_block") or _key_from_file(need_ssh_key)
        gateway_host = os.environ.get("RUNPOD_SSH_GATEWAY_HOST")
        gateway_port = os.environ.get("RUNPOD_SSH_GATEWAY_PORT")
        if gateway_host:
            key_block.gateway_host = gateway_host
        if gateway_port:
            key_block.gateway_port = int(gateway_port)
        provider = spec.get_provider(creds, key_block)
        keypair = KeyPair(
            private_key=key_block.get_private_key(), public_key=key_block.get_public_key()
        )
        return provider, keypair

    def plan_pod(self, name: str) -> PlannedPod:
        """The pod this spec would rent: the gateway always, a direct endpoint when the
        spec exposes ``22/tcp`` on a public IP (whether the host grants one shows only
        once the pod runs, and is checked again then), and the volume (when mounted at
        the workdir) or container disk it asks for."""
        pending = "(not rented yet)"
        spec = self.spec
        gateway = SSHEndpoint(host="ssh.runpod.io", port=22, user=pending, mode="gateway")
        direct = "22/tcp" in spec.ports.split(",") and spec.support_public_ip
        handle = PodHandle(
            pod_id=pending,
            name=name,
            provider=self.provider_name,
            gpu_count=spec.gpu_count,
            ssh=gateway,
            direct_ssh=SSHEndpoint(host="0.0.0.0", port=22, user="root", mode="direct")
            if direct
            else None,
        )
        on_volume = spec.volume_gb > 0 and spec.volume_mount_path.rstrip("/") == handle.workdir
        size_gb = spec.volume_gb if on_volume else spec.container_disk_gb
        what = "volume" if on_volume else "container disk"
        ssh = (
            "gateway SSH, direct SSH if its host grants a public IP"
            if direct
            else "gateway SSH only"
        )
        return PlannedPod(
            description=f"a RunPod pod ({ssh})",
            handle=handle,
            disk_bytes=size_gb * 10**9,
            disk_description=f"the pod's {size_gb} GB {what}",
            gateway_only=handle.model_copy(update={"direct_ssh": None}) if direct else None,
        )

    def offers(self) -> Offers:
        """The spec's GPU types in failover order with USD/h and availability: one read
        of REST v2's catalog (over GraphQL the SDK's prices, the catalog's availability
        beside them; ``gpu_offers``); a catalog that says nothing is said in ``note``.

        Raises:
            SpecError: an unknown GPU type id (with the closest ids RunPod knows).
            ProviderError: RunPod could not be asked.
        """
        cloud, count = self.spec.cloud_type, self.spec.gpu_count
        offers = [
            Offer(gpu_id, offer.usd_per_hr(cloud, count), offer.availability)
            for gpu_id, offer in self.gpu_offers().items()
        ]
        unknown = all(o.availability == "UNKNOWN" for o in offers)
        return Offers(
            offers, "availability unknown: RunPod's catalog did not say" if unknown else None
        )

    def fetch_bill(self, pod_id: str, start: datetime, end: datetime) -> ProviderBill | None:
        """RunPod's own bill for the pod (REST billing), None while it has no record.

        Raises:
            Exception: RunPod's billing did not answer (the caller says why).
        """
        bill = self.credentials.fetch_pod_bill(pod_id, start, end)
        if bill is None:
            return None
        return ProviderBill(
            usd=bill.usd,
            billed_seconds=bill.billed_seconds,
            note=f"RunPod REST {bill.api}, {len(bill.records)} record(s)",
            gpu_usd=bill.gpu_usd,
            cpu_usd=bill.cpu_usd,
            disk_usd=bill.disk_usd,
        )

    def account_checks(self, *, key_only: bool = False) -> list[AccountCheck]:
        """The API key (does the API answer for the account?) and the account's SSH keys
        (do they hold this run's key? read only: nothing is added here); with
        ``key_only`` just the latter."""
        checks = [] if key_only else [self._api_key_check()]
        if checks and not checks[0].ok:
            return checks
        return [*checks, self._account_key_check()]

    def _api_key_check(self) -> AccountCheck:
        """Does RunPod answer for the account? The account's SSH keys read through the
        client the credentials choose; the line says which API answered."""
        which = {"v2": "REST v2", "graphql": "GraphQL (the fallback)"}[self.api.name]
        try:
            self.api.get_account_keys()
            return AccountCheck("RunPod API key", True, f"{which} answered for the account")
        except SpecError as exc:  # the key's header was refused: nothing was sent
            return AccountCheck("RunPod API key", False, str(exc))
        except Exception as exc:  # RunPod's own answer: say what it said
            return AccountCheck(
                "RunPod API key",
                False,
                f"RunPod ({which}) refused or did not answer ({error_text(exc)}); check the "
                "key at https://www.runpod.io/console/user/settings",
            )

    def _account_key_check(self) -> AccountCheck:
        key = self.ssh_key
        name = "account SSH key"
        try:
            held = key.account_has_key(self.credentials)
        except Exception as exc:  # the SDK's own error: say what it said
            return AccountCheck(name, False, f"could not read it ({error_text(exc)})")
        if held:
            return AccountCheck(name, True, "the account holds this key")
        if key.add_to_account:
            return AccountCheck(
                name,
                True,
                "not on the account yet; the run adds it (the key block's add_to_account)",
            )
        return AccountCheck(
            name,
            False,
            "the account's SSH keys do not hold this key, so the gateway would refuse it: add "
            "it in the RunPod console (Settings, SSH Public Keys) or set add_to_account=True on "
            "the RunPodSSHKey block",
        )


def _env_api_key() -> str:
    api_key = os.environ.get("RUNPOD_API_KEY")
    if not api_key:
        raise SpecError(
            "RunPod needs an API key: save a RunPodCredentials block "
            "(prefect block register -m prefect_runpod.blocks) and pass "
            "--runpod-credentials NAME, or set RUNPOD_API_KEY"
        )
    return check_secret(api_key, "RUNPOD_API_KEY")


def _key_from_file(need_ssh_key: bool) -> Any:
    """The SSH key block from ``RUNPOD_SSH_KEY_PATH`` (or a throwaway one)."""
    from prefect_runpod.blocks.keys import public_key_line
    from prefect_runpod.blocks.runpod.ssh_key import RunPodSSHKey

    key_path = os.path.expanduser(RunPodCapabilities.user_key_path())
    if not os.path.isfile(key_path) and not need_ssh_key:
        return RunPodSSHKey.generate(comment="prefect-runpod-lister")
    if not os.path.isfile(key_path):
        raise SpecError(
            f"no SSH key for RunPod: {key_path} does not exist; create one with "
            "`ssh-keygen -t ed25519 -f ~/.ssh/id_ed25519_runpod -N ''`, add its .pub at "
            "account level, or save a RunPodSSHKey block and pass --ssh-key NAME"
        )
    with open(key_path, encoding="utf-8") as fh:
        private = SecretStr(fh.read())
    return RunPodSSHKey(private_key=private, public_key=public_key_line(private))
