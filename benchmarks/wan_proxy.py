"""A loopback TCP proxy that behaves like a far link: a fixed delay each way and a
bandwidth cap (the kernel's netem is not available everywhere).

Each direction reads in slices of at most 64 KiB and paces them to the cap; each slice
is delivered ``delay_seconds`` after it finished "transmitting", without holding back
the next one, so a pipelined protocol keeps the link full while stop-and-wait pays
the round trip for every chunk. Two caps can apply at once:

* the **link** cap (``rate_bytes_per_second``) is shared by every connection, in each
  direction — one uplink, one downlink, as a real path has;
* a **per-connection** cap (``connection_rate_bytes_per_second``), as a gateway that
  limits each session, so several sessions in parallel get more than one.

Pacing gives back up to 10 ms of link time lost to a late wakeup of this process (the
link would have kept sending what was queued), so the proxy's own scheduling does not
count as lost bandwidth.

    python -m benchmarks.wan_proxy --target-port 22 --delay-ms 50 --mbit 100
    python -m benchmarks.wan_proxy --target-port 22 --mbit 1000 --conn-mbit 100
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time

__all__ = ["Pacer", "WanProxy", "measure_link"]

_SLICE = 64 * 1024
_SLACK_SECONDS = 0.01


class Pacer:
    """When a link of ``rate`` bytes/s is next free (None: no cap)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.next_free = 0.0


def _pace(pacers: list[Pacer], size: int, now: float) -> float:
    """Book ``size`` bytes on every capped pacer; returns when they are all sent."""
    capped = [p for p in pacers if p.rate]
    if not capped:
        return now
    start = max(now - _SLACK_SECONDS, *(p.next_free for p in capped))
    done = now
    for p in capped:
        assert p.rate is not None
        p.next_free = start + size / p.rate
        done = max(done, p.next_free)
    return done


class WanProxy:
    """Proxy ``127.0.0.1:<port>`` → ``target_host:target_port`` in a background thread.

    Args:
        target_port: where to forward.
        delay_seconds: one-way delay added in each direction (seconds).
        rate_bytes_per_second: the link's cap in each direction, shared by every
            connection (100 Mbit/s = 12_500_000); None for none.
        connection_rate_bytes_per_second: each connection's own cap in each direction;
            None for none.

    Attributes:
        bytes_up / bytes_down: bytes forwarded client → target and target → client since
            the start or the last :meth:`reset_counts` (what crossed the "gateway").
        connections: connections accepted so far.
    """

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        delay_seconds: float = 0.05,
        rate_bytes_per_second: float | None = 12_500_000,
        connection_rate_bytes_per_second: float | None = None,
    ):
        self.target = (target_host, target_port)
        self.delay_seconds, self.rate = delay_seconds, rate_bytes_per_second
        self.connection_rate = connection_rate_bytes_per_second
        self.port = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections = 0
        self._links = {"bytes_up": Pacer(self.rate), "bytes_down": Pacer(self.rate)}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WanProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")
        return self

    def reset_counts(self) -> None:
        """Start counting forwarded bytes from zero."""
        self.bytes_up = self.bytes_down = 0

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        own_up, own_down = Pacer(self.connection_rate), Pacer(self.connection_rate)
        try:
            await asyncio.gather(
                self._pipe(reader, up_w, "bytes_up", own_up),
                self._pipe(up_r, writer, "bytes_down", own_down),
                return_exceptions=True,
            )
        except asyncio.CancelledError:  # the proxy is shutting down: end quietly
            for w in (writer, up_w):
                w.close()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        counter: str,
        own: Pacer,
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        pacers = [self._links[counter], own]

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    writer.close()
                    return
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(_SLICE)
                setattr(self, counter, getattr(self, counter) + len(data))
                now = time.monotonic()
                sent = _pace(pacers, len(data), now)
                await queue.put((sent + self.delay_seconds, data))
                if not data:
                    break
                if sent > now:
                    await asyncio.sleep(sent - now)
            await sender
        except (ConnectionError, OSError):
            sender.cancel()
        except asyncio.CancelledError:  # the proxy is shutting down
            sender.cancel()
            raise


def measure_link(proxy: WanProxy, size_bytes: int = 32 * 1024 * 1024) -> float:
    """Bytes/s a plain TCP stream gets through ``proxy`` (to a local sink it starts):
    what the link delivers to a sender that always has data."""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(1)
    done: dict[str, float] = {}

    def drain() -> None:
        conn, _ = sink.accept()
        with conn:
            while conn.recv(1 << 20):
                pass
        done["at"] = time.monotonic()

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    with WanProxy(
        sink.getsockname()[1],
        delay_seconds=proxy.delay_seconds,
        rate_bytes_per_second=proxy.rate,
        connection_rate_bytes_per_second=proxy.connection_rate,
    ) as probe:
        block = bytes(1 << 20)
        with socket.create_connection(("127.0.0.1", probe.port)) as conn:
            started = time.monotonic()
            for _ in range(max(1, size_bytes >> 20)):
                conn.sendall(block)
            conn.shutdown(socket.SHUT_WR)
            thread.join(600)
    sink.close()
    return (size_bytes >> 20 << 20) / max(done.get("at", time.monotonic()) - started, 1e-9)


def main() -> None:
    """Run the proxy until interrupted, printing its port."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--mbit", type=float, default=100.0, help="link cap (0: none)")
    parser.add_argument("--conn-mbit", type=float, default=0.0, help="per-connection cap")
    args = parser.parse_args()
    with WanProxy(
        args.target_port,
        delay_seconds=args.delay_ms / 1000,
        rate_bytes_per_second=args.mbit * 1e6 / 8 or None,
        connection_rate_bytes_per_second=args.conn_mbit * 1e6 / 8 or None,
    ) as proxy:
        print(f"listening on 127.0.0.1:{proxy.port}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
