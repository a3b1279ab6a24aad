"""An emulated ``ssh.runpod.io``: one SSH server with one host key in front of every pod,
routing each login to the pod its user names (``<podHostId>@ssh.runpod.io``), as RunPod's
gateway does (RunPod docs, ``pods/configuration/use-ssh``).

Built on asyncssh, server and client both: the gateway authenticates the login (the
account's keys, or the pod's ``PUBLIC_KEY``), opens its own SSH connection to the pod's
local daemon with the gateway's key, and relays the session byte for byte — PTY, shell,
exec and subsystem requests included, so a session without a PTY gets the pod's own
``Error: Your SSH client doesn't support PTY``. Several pods can be reached at once,
each by its own user.

A fault can cut one session after it has relayed a number of bytes of channel data
(both directions): a dropped link at a chosen point, by volume, never by time. One cut,
then the fault is spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import asyncssh

from prefect_runpod.blocks.local_pod.daemon import PublicKeyLogins

__all__ = ["GatewayLink", "Route", "SSHGateway"]

_WINDOW_BYTES = 8 * 1024 * 1024
_CHUNK_BYTES = 65536


@dataclass(frozen=True)
class Route:
    """Where a login goes.

    Attributes:
        pod_id: the pod.
        port: its daemon's loopback SSH port.
        user: the login user on the pod (its ``podHostId``).
        public_keys: OpenSSH lines allowed to log in through the gateway for this pod.
    """

    pod_id: str
    port: int
    user: str
    public_keys: tuple[str, ...]


@dataclass
class GatewayLink:
    """One session through the gateway.

    Attributes:
        pod_id: the pod it was routed to.
        relayed_bytes: channel bytes relayed so far, both directions together.
        drop_after_bytes: the session is cut once it has relayed this many bytes; 0: never.
        dropped: True once the gateway cut it.
    """

    pod_id: str
    relayed_bytes: int = 0
    drop_after_bytes: int = 0
    dropped: bool = False


class SSHGateway:
    """The gateway, serving on ``127.0.0.1`` from a thread of its own.

    Args:
        route: ``podHostId`` → ``Route`` for a pod that may be reached now, else None.
        drop_after_bytes: the byte count after which a session is cut while the fault is
            armed; 0 for none.
        drop_spent: called once a session was cut (the fault is then spent).
        refusing: called for each new connection; True closes it at once, before the SSH
            banner, as a restarting proxy does (the caller counts them). None: never.
    """

    def __init__(
        self,
        route: Callable[[str], Route | None],
        drop_after_bytes: Callable[[], int],
        drop_spent: Callable[[], None],
        refusing: Callable[[], bool] | None = None,
    ) -> None:
        self._route = route
        self._refusing = refusing
        self._drop_after = drop_after_bytes
        self._drop_spent = drop_spent
        self.links: list[GatewayLink] = []
        self._host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = asyncssh.generate_private_key("ssh-ed25519")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="gw")
        self._server: asyncssh.SSHAcceptor | None = None
        self.port = 0

    @property
    def host_key(self) -> str:
        """The gateway's host key (one OpenSSH line), the same for every pod, as
        ``ssh.runpod.io`` has one."""
        return self._host_key.export_public_key().decode().strip()

    @property
    def client_public_key(self) -> str:
        """The gateway's own key (one OpenSSH line), which every pod must authorise."""
        return self.client_key.export_public_key().decode().strip()

    def start(self) -> SSHGateway:
        """Listen; returns self once the port is known."""
        logging.getLogger("asyncssh").setLevel(logging.WARNING)  # a line per packet otherwise
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(30)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Stop listening and end every session."""
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _listen(self) -> asyncssh.SSHAcceptor:
        return await asyncssh.listen(
            "127.0.0.1",
            0,
            server_host_keys=[self._host_key],
            server_factory=lambda: _Login(self),
            process_factory=self._relay,
            encoding=None,
            line_editor=False,
            allow_pty=True,
            agent_forwarding=False,
            x11_forwarding=False,
            window=_WINDOW_BYTES,
            sftp_factory=None,
            allow_scp=False,
        )

    async def _relay(self, process: asyncssh.SSHServerProcess) -> None:
        conn = process.channel.get_connection()
        route: Route | None = conn.get_extra_info("gateway_route")
        if route is None:  # cannot happen after a successful login
            process.exit(255)
            return
        link = GatewayLink(route.pod_id, drop_after_bytes=self._drop_after())
        self.links.append(link)
        try:
            upstream_conn = await asyncssh.connect(
                "127.0.0.1",
                route.port,
                username=route.user,
                client_keys=[self.client_key],
                known_hosts=None,
                agent_path=None,
            )
        except (OSError, asyncssh.Error):
            process.stderr.write(b"Error: the pod is not reachable\r\n")
            process.exit(255)
            return
        async with upstream_conn:
            term_type = process.get_terminal_type()
            size = process.get_terminal_size()
            try:
                upstream = await upstream_conn.create_process(
                    command=process.command,
                    subsystem=process.subsystem,
                    term_type=term_type,
                    term_size=size if term_type else None,
                    encoding=None,
                    window=_WINDOW_BYTES,
                )
            except asyncssh.Error:
                process.exit(1)
                return
            pumps = [
                asyncio.ensure_future(self._to_pod(process, upstream, link, conn)),
                asyncio.ensure_future(self._pump(upstream.stdout, process.stdout, link, conn)),
                asyncio.ensure_future(self._pump(upstream.stderr, process.stderr, link, conn)),
            ]
            result = await upstream.wait(check=False)
            for pump in pumps[1:]:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pump, 5)
            pumps[0].cancel()
            if not link.dropped:
                process.exit(result.exit_status if result.exit_status is not None else 255)

    async def _to_pod(
        self,
        process: asyncssh.SSHServerProcess,
        upstream: asyncssh.SSHClientProcess,
        link: GatewayLink,
        conn: asyncssh.SSHServerConnection,
    ) -> None:
        """Client → pod: keystrokes and window changes; the pod's session ends when the
        client's does."""
        while True:
            try:
                data = await process.stdin.read(_CHUNK_BYTES)
            except asyncssh.TerminalSizeChanged as change:
                upstream.change_terminal_size(
                    change.width, change.height, change.pixwidth, change.pixheight
                )
                continue
            except (asyncssh.Error, OSError):
                upstream.close()
                return
            if not data:
                with contextlib.suppress(asyncssh.Error, OSError):
                    upstream.stdin.write_eof()
                return
            if not self._count(link, conn, len(data)):
                upstream.close()
                return
            upstream.stdin.write(data)

    async def _pump(
        self,
        src: asyncssh.SSHReader[bytes],
        dst: asyncssh.SSHWriter[bytes],
        link: GatewayLink,
        conn: asyncssh.SSHServerConnection,
    ) -> None:
        """Pod → client."""
        try:
            while data := await src.read(_CHUNK_BYTES):
                if not self._count(link, conn, len(data)):
                    return
                dst.write(data)
        except (asyncssh.Error, OSError):
            return

    def _count(self, link: GatewayLink, conn: asyncssh.SSHServerConnection, size: int) -> bool:
        """Count ``size`` relayed bytes; False (and the client's connection cut) once the
        session's drop fault fires, if it is still armed (one cut in all)."""
        if link.dropped:
            return False
        limit = link.drop_after_bytes
        if limit and link.relayed_bytes + size >= limit and self._drop_after() > 0:
            link.dropped = True
            self._drop_spent()
            conn.abort()  # the link drops mid-stream: nothing more is relayed
            return False
        link.relayed_bytes += size
        return True


class _Login(PublicKeyLogins):
    """Public-key logins only; the user names the pod."""

    def __init__(self, gateway: SSHGateway) -> None:
        self.gateway = gateway
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        refusing = self.gateway._refusing
        if refusing is not None and refusing():
            conn.abort()  # closed at once, before the SSH banner, as a restarting proxy does

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        route = self.gateway._route(username)
        if route is None:
            return False
        allowed = set()
        for line in route.public_keys:
            with contextlib.suppress(ValueError, asyncssh.KeyImportError):
                allowed.add(asyncssh.import_public_key(line).public_data)
        if key.public_data not in allowed:
            return False
        assert self.conn is not None
        self.conn.set_extra_info(gateway_route=route)
        return True
