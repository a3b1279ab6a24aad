"""ChannelIO's writes against SSH peers with unusual window policies (a real paramiko
server on a socket pair, no mocks)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import paramiko
import pytest

from prefect_runpod.blocks.console.channel import ChannelIO
from prefect_runpod.blocks.exceptions import ConsoleConnectError

WINDOW_BYTES = 100_000


class _AcceptAll(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "none"

    def check_auth_none(self, username: str) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED


@pytest.fixture(scope="module")
def host_key() -> paramiko.RSAKey:
    return paramiko.RSAKey.generate(2048)


@pytest.fixture
def channels(host_key: paramiko.RSAKey) -> Iterator[tuple[paramiko.Channel, paramiko.Channel]]:
    """(client channel, server channel): the server grants a 100,000-byte window and
    returns window only once all of it has been read."""
    client_sock, server_sock = socket.socketpair()
    server = paramiko.Transport(server_sock, default_window_size=WINDOW_BYTES)
    server.add_server_key(host_key)
    server.start_server(event=threading.Event(), server=_AcceptAll())  # returns at once
    client = paramiko.Transport(client_sock)
    client.start_client(timeout=10)
    client.auth_none("pod")
    client_channel = client.open_session(timeout=10)
    server_channel = server.accept(timeout=10)
    assert server_channel is not None
    server_channel.in_window_threshold = WINDOW_BYTES - 1
    try:
        yield client_channel, server_channel
    finally:
        client.close()
        server.close()


def _on_drop(exc: BaseException | None) -> ConsoleConnectError:
    return ConsoleConnectError(f"dropped: {exc!r}")


def test_send_fills_a_window_the_peer_returns_only_when_used_up(
    channels: tuple[paramiko.Channel, paramiko.Channel],
) -> None:
    client_channel, server_channel = channels
    data = os.urandom(5 * WINDOW_BYTES + 12_345)
    received = bytearray()

    def read_all() -> None:
        server_channel.settimeout(10)
        while len(received) < len(data):
            piece = server_channel.recv(1 << 20)
            if not piece:
                return
            received.extend(piece)

    reader = threading.Thread(target=read_all)
    reader.start()
    # Whole packets leave 100,000 - 3 x 32,704 = 1,888 bytes of window, which this peer
    # returns only once they are used: waiting for room for a packet would stall.
    ChannelIO(client_channel, _on_drop).send(data, lambda _: None, timeout_seconds=5)
    reader.join(timeout=10)
    assert bytes(received) == data
