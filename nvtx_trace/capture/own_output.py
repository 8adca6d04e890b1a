"""The program's output straight to our stdout and stderr, not through nsys.

nsys passes the program's output through its own stdout and stderr, mixed with its messages,
and the program sees pipes instead of the terminal. So the program is started through this
file (run by path, standard library only): it asks ``nvtx-trace run`` for its stdout and stderr
over a Unix socket (``Handover``, named in ``NVTX_TRACE_OWN_OUTPUT``), puts them on 1 and 2 and
``exec``s the program. nsys's pipes then carry only nsys's own lines, and nsys and its agent
never hold our descriptors (an agent outliving a killed nsys would keep a pipe open). When
the handover fails, nothing is changed and ``FALLBACK_MARKER`` tells nvtx-trace to sort the
mixed stream line by line instead.

Usage (what nsys runs): ``python .../nvtx_trace/capture/own_output.py PROGRAM ARGS...``
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import sys
import threading

ENV = "NVTX_TRACE_OWN_OUTPUT"  # the Handover's socket name (Linux abstract namespace)
TMPDIR_ENV = "NVTX_TRACE_USER_TMPDIR"  # the user's TMPDIR ("" when unset): nsys had a private one, the program not
FALLBACK_MARKER = "nvtx-trace: the program's output passes through nsys"
_TIMEOUT_S = 10


class Handover:
    """Hands our stdout and stderr to whichever process of ours asks, while it is open."""

    def __init__(self, fds: tuple[int, int] = (1, 2)):
        self.fds, self.address = fds, f"nvtx-trace-{os.getpid()}-{secrets.token_hex(8)}"
        self.started = threading.Event()  # the program's launcher asked: nsys did start the program
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inherited by nsys
        self.sock.bind("\0" + self.address)
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            with conn:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                if struct.unpack("3i", creds)[1] == os.getuid():  # only to our own user's processes
                    self.started.set()
                    self._send(conn)

    def _send(self, conn: socket.socket) -> None:
        socket.send_fds(conn, [b"fds"], list(self.fds))

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> "Handover":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _receive(address: str) -> bool:
    """Put the handed stdout/stderr on 1 and 2; False (nothing changed) when none came."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(_TIMEOUT_S)
            sock.connect("\0" + address)
            _, fds, _, _ = socket.recv_fds(sock, 16, 2)
    except OSError:
        return False
    if len(fds) == 2:
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    return len(fds) == 2


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python own_output.py PROGRAM [ARGS]...", file=sys.stderr)
        return 2
    address = os.environ.pop(ENV, None)  # the program does not inherit it
    user_tmp = os.environ.pop(TMPDIR_ENV, None)
    if user_tmp is not None:  # the program's temporary files go where the user's always go
        if user_tmp:
            os.environ["TMPDIR"] = user_tmp
        else:
            os.environ.pop("TMPDIR", None)
    if address is not None and not _receive(address):
        print(FALLBACK_MARKER, file=sys.stderr, flush=True)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"nvtx-trace: cannot run {argv[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
