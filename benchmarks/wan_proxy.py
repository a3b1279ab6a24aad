"""A loopback TCP proxy that behaves like a far link: a fixed delay each way and a
bandwidth cap (the kernel's netem is not available everywhere).

Each direction reads in slices of at most 64 KiB, is paced to the cap as it reads,
and delivers each slice ``delay_seconds`` later without holding back the next one,
so a pipelined protocol keeps the link full while stop-and-wait pays the round trip
for every chunk.

    python -m benchmarks.wan_proxy --target-port 22 --delay-ms 50 --mbit 100
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time

__all__ = ["WanProxy"]

_SLICE = 64 * 1024


class WanProxy:
    """Proxy ``127.0.0.1:<port>`` → ``target_host:target_port`` in a background thread.

    Args:
        target_port: where to forward.
        delay_seconds: one-way delay added in each direction (seconds).
        rate_bytes_per_second: cap in each direction (100 Mbit/s = 12_500_000).

    Attributes:
        bytes_up / bytes_down: bytes forwarded client → target and target → client since
            the start or the last :meth:`reset_counts` (what crossed the "gateway").
    """

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = "127.0.0.1",
        delay_seconds: float = 0.05,
        rate_bytes_per_second: float = 12_500_000,
    ):
        self.target = (target_host, target_port)
        self.delay_seconds, self.rate = delay_seconds, rate_bytes_per_second
        self.port = 0
        self.bytes_up = 0
        self.bytes_down = 0
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
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(
                self._pipe(reader, up_w, "bytes_up"),
                self._pipe(up_r, writer, "bytes_down"),
                return_exceptions=True,
            )
        except asyncio.CancelledError:  # the proxy is shutting down: end quietly
            for w in (writer, up_w):
                w.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: str
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

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
        next_free = time.monotonic()
        try:
            while True:
                data = await reader.read(_SLICE)
                setattr(self, counter, getattr(self, counter) + len(data))
                now = time.monotonic()
                next_free = max(next_free, now) + len(data) / self.rate
                await queue.put((next_free + self.delay_seconds, data))
                if not data:
                    break
                if next_free > now:
                    await asyncio.sleep(next_free - now)
            await sender
        except (ConnectionError, OSError):
            sender.cancel()
        except asyncio.CancelledError:  # the proxy is shutting down
            sender.cancel()
            raise


def main() -> None:
    """Run the proxy until interrupted, printing its port."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--mbit", type=float, default=100.0)
    args = parser.parse_args()
    with WanProxy(
        args.target_port,
        delay_seconds=args.delay_ms / 1000,
        rate_bytes_per_second=args.mbit * 1e6 / 8,
    ) as proxy:
        print(f"listening on 127.0.0.1:{proxy.port}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
