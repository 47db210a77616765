"""Slow and vanishing HTTP clients: many connections, each asking for one
path and reading its answer through a small receive buffer, a little at a
time, and hanging up after a quota of bytes (tests/integration/
test_slow_clients.py and bench/slow_clients.py)."""

import selectors
import socket
import time

HEAD = 1024


class SlowClient:
    """One connection: `quota` bytes read at most (None: the whole answer;
    0: it hangs up as soon as its request is sent)."""

    def __init__(self, path, headers=(), quota=None):
        self.path = path
        self.headers = list(headers)
        self.quota = quota
        self.sock = None
        self.received = 0
        self.head = b""         # the first HEAD bytes: status, headers
        self.complete = False   # nginx ended the answer (EOF)
        self.error = None

    def request(self):
        lines = ["GET %s HTTP/1.1" % self.path, "Host: localhost",
                 "Connection: close"] + ["%s: %s" % h for h in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def left(self):
        return None if self.quota is None else self.quota - self.received


class SlowClients:
    """Opens every client's connection to 127.0.0.1:port with SO_RCVBUF
    `rcvbuf` (set before connect, so that the window is small from the
    first segment) and sends its request; read() then reads them."""

    def __init__(self, port, clients, rcvbuf=4096, timeout=30.0):
        self.port = port
        self.clients = list(clients)
        self.rcvbuf = rcvbuf
        self.timeout = timeout
        self.selector = selectors.DefaultSelector()
        self.open = 0

    def connect(self):
        for c in self.clients:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            s.settimeout(self.timeout)
            s.connect(("127.0.0.1", self.port))
            s.sendall(c.request())
            if c.quota == 0:
                s.close()
                continue
            s.setblocking(False)
            c.sock = s
            self.selector.register(s, selectors.EVENT_READ, c)
            self.open += 1

    def _close(self, c):
        self.selector.unregister(c.sock)
        c.sock.close()
        c.sock = None
        self.open -= 1

    def read(self, chunk, until=None, rate=None, interval=0.1, every=None):
        """Reads until every connection is closed (its quota reached, or
        nginx ended the answer) or until() says so: `chunk` bytes at most
        per connection and pass or, with `rate`, `rate` bytes a second per
        connection in passes `interval` apart.  every(), if given, is
        called after each pass."""
        budget = chunk if rate is None else max(1, int(rate * interval))
        while self.open and not (until and until()):
            started = time.monotonic()
            for key, _ in self.selector.select(timeout=interval):
                c = key.data
                want = budget if c.quota is None else min(budget, c.left())
                try:
                    data = c.sock.recv(want)
                except BlockingIOError:
                    continue
                except OSError as e:
                    c.error = e
                    self._close(c)
                    continue
                if not data:
                    c.complete = True
                    self._close(c)
                    continue
                if len(c.head) < HEAD:
                    c.head += data[:HEAD - len(c.head)]
                c.received += len(data)
                if c.left() == 0:
                    self._close(c)
            if every:
                every()
            if rate is not None:
                time.sleep(max(0.0, started + interval - time.monotonic()))

    def close(self):
        for c in self.clients:
            if c.sock is not None:
                self._close(c)
        self.selector.close()
