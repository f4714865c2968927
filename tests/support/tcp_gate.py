"""A TCP forwarder on loopback that a test can close and open again: a server that stops answering (connections
refused, the open ones cut) without stopping the server, which other tests of the lane use.

Written here (about 60 lines) rather than taken from a library: toxiproxy is a Go server with a client of its own,
and this is all a test needs.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpGate:
    """Forwards ``127.0.0.1:<port>`` to ``target``; :meth:`close` refuses new connections and cuts the open ones,
    :meth:`open` answers again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener: socket.socket | None = None
        self._pairs: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.port = 0
        self.open()

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        """Refuse connections and cut the open ones (both ends see a reset or EOF)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, set()
        for sock in pairs:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._pairs.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._pairs.discard(source)
                self._pairs.discard(sink)
            source.close()  # the other direction's thread sees the shutdown and closes its own
