"""The only doors between the machine's network namespace and the real node's (`make e2e-pods`).

The node (containerd, kubelet, kube-proxy and every Pod) lives in a network namespace of its own, so the machine's
namespace keeps no bridge, route or firewall rule of it, and a Pod or Service address means nothing outside. What
must cross does so through this one process, which runs in the machine's namespace:

- `--forward LISTEN=TARGET`: a listening socket made inside the node's namespace (e.g. 0.0.0.0:6443 there), each
  connection relayed to TARGET on the machine's loopback (the API server, the image registry, the machine room);
- `--connect SOCKET`: an HTTP CONNECT proxy on a Unix socket, each tunnel dialled from inside the node's namespace:
  the API server's egress to the cluster (`--egress-selector-config-file`, "cluster": the kubelet for logs, exec
  and port-forward, webhook Services) goes through it, so it reaches Pod and Service addresses where they exist.

A socket belongs to the namespace it was created in: the process enters the node's namespace only for the moment
it creates one, and returns at once (setns(2) on the calling thread; asyncio runs on one thread).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
CONNECT_LINE_LIMIT = 8192
DIAL_TIMEOUT = 10.0
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def inside(netns_fd: int, home_fd: int) -> Iterator[None]:
    """The calling thread in the node's namespace for the block, then back in the machine's."""
    _setns(netns_fd)
    try:
        yield
    finally:
        _setns(home_fd)


def parse_addr(text: str) -> tuple[str, int]:
    """'host:port' → (host, port); a bad one names itself."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {text!r}")
    return host, int(port)


def parse_forward(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """'LISTEN=TARGET' → the two addresses."""
    listen, sep, target = text.partition("=")
    if not sep:
        raise ValueError(f"--forward wants LISTEN=TARGET, got {text!r}")
    return parse_addr(listen), parse_addr(target)


def parse_connect_request(head: bytes) -> tuple[str, int]:
    """The target of an HTTP CONNECT request head ('CONNECT host:port HTTP/1.1\\r\\n...'), or ValueError."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or parts[0] != "CONNECT" or not parts[2].startswith("HTTP/"):
        raise ValueError(f"not a CONNECT request: {line!r}")
    target = parts[1]
    if target.startswith("[") and "]:" in target:  # [v6]:port
        host, port = target[1:].split("]:", 1)
        return host, int(port)
    return parse_addr(target)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _splice(a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                  b: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:  # fmt: skip
    try:
        await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))
    finally:
        for _, w in (a, b):
            w.close()


class Bridge:
    """Every door of one node; `serve()` runs until SIGTERM."""

    def __init__(self, netns: str, forwards: list[tuple[tuple[str, int], tuple[str, int]]], connect: str | None):
        self.netns_fd = os.open(netns, os.O_RDONLY)
        self.home_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        self.forwards = forwards
        self.connect = connect

    def _listen_inside(self, host: str, port: int) -> socket.socket:
        with inside(self.netns_fd, self.home_fd):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
        return sock

    async def _dial_inside(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with inside(self.netns_fd, self.home_fd):
            sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)), DIAL_TIMEOUT)
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)

    async def _forwarded(self, target: tuple[str, int], reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:  # fmt: skip
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(*target), DIAL_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            print(f"nsbridge: forward to {target[0]}:{target[1]} failed: {exc}", file=sys.stderr, flush=True)
            writer.close()
            return
        await _splice((reader, writer), upstream)

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DIAL_TIMEOUT)
            if len(head) > CONNECT_LINE_LIMIT:
                raise ValueError("CONNECT request too long")
            host, port = parse_connect_request(head)
        except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
            writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            print(f"nsbridge: refused a tunnel: {exc}", file=sys.stderr, flush=True)
            writer.close()
            return
        try:
            upstream = await self._dial_inside(host, port)
        except (OSError, TimeoutError) as exc:
            writer.write(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{exc}".encode())
            print(f"nsbridge: tunnel to {host}:{port} failed: {exc}", file=sys.stderr, flush=True)
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await _splice((reader, writer), upstream)

    async def serve(self) -> None:
        servers = []
        for (host, port), target in self.forwards:
            sock = self._listen_inside(host, port)

            async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, t: tuple[str, int] = target) -> None:
                await self._forwarded(t, r, w)

            servers.append(await asyncio.start_server(handle, sock=sock))
            print(f"nsbridge: {host}:{port} in the node's namespace -> {target[0]}:{target[1]}", flush=True)
        if self.connect:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.connect)
            servers.append(await asyncio.start_unix_server(self._tunnel, path=self.connect))
            print(f"nsbridge: CONNECT proxy on {self.connect}, dialling inside the node's namespace", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print("nsbridge: ready", flush=True)
        await stop.wait()
        for s in servers:
            s.close()
        if self.connect:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.connect)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--netns", required=True, help="the node's network namespace file (/var/run/netns/NAME)")
    parser.add_argument("--forward", action="append", default=[], help="LISTEN=TARGET: listen inside, dial here")
    parser.add_argument("--connect", default=None, help="a Unix socket for HTTP CONNECT tunnels dialled inside")
    args = parser.parse_args(argv)
    try:
        forwards = [parse_forward(f) for f in args.forward]
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(Bridge(args.netns, forwards, args.connect).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
