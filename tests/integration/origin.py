"""A real HTTP origin on 127.0.0.1 for the integration tests.

Tests register what each path answers; the origin counts the requests it
sees and records, per tracked path prefix, how many requests were in flight
at the same time.  A *gate* holds requests under a prefix until N of them
are in flight at once (or a generous bound has passed), which is how the
tests prove that fragments are fetched in parallel without a stopwatch.
"""

import gzip as gzip_module
import http.server
import threading
import time


class Route:
    """What the origin answers for one path (or every path under a prefix)."""

    def __init__(self, body, status=200, content_type="text/html",
                 headers=(), gzip=False, length=True, by_header=None):
        self.body = body
        self.by_header = by_header
        self.status = status
        self.content_type = content_type
        self.headers = list(headers)
        self.gzip = gzip
        self.length = length

    def render(self, target, request_headers):
        if self.by_header:
            body = self.body[request_headers.get(self.by_header, "")]
        elif callable(self.body):
            body = self.body(target)
        else:
            body = self.body
        if isinstance(body, str):
            body = body.encode()
        return body


class _Gate:
    """Holds requests until `count` are waiting together, or `bound` passes.

    Once open it stays open, so a sequential client is held once (for the
    bound) and then let through: the test fails on its assertion, it does not
    hang.
    """

    def __init__(self, count, bound):
        self.count = count
        self.bound = bound
        self.deadline = None
        self.open = False


class _Tracker:
    def __init__(self):
        self.in_flight = 0
        self.max_in_flight = 0
        self.gate = None
        self.hold = None


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "esi-test-origin"

    def do_GET(self):
        self.server.origin._serve(self, head=False)

    def do_HEAD(self):
        self.server.origin._serve(self, head=True)

    def _with_body(self):
        """Any other method: its body read and dropped, then served as GET
        (requests() records the method)."""
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.origin._serve(self, head=False)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _with_body

    def log_message(self, fmt, *args):
        self.server.origin._log(
            "%s %s" % (self.address_string(), fmt % args))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


class Origin:
    """ThreadingHTTPServer on 127.0.0.1:<free port>."""

    HOLD_BOUND = 20.0

    def __init__(self, log_path=None):
        self._lock = threading.Condition()
        self._routes = {}
        self._prefix_routes = []
        self._hits = {}
        self._requests = []
        self._trackers = {}
        self._pauses = {}
        self._log_file = open(log_path, "a") if log_path else None
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.origin = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
            daemon=True)
        self._thread.start()

    # -- registering what to serve -------------------------------------

    def route(self, path, body, status=200, content_type="text/html",
              headers=(), gzip=False, length=True, by_header=None):
        """Answer requests for exactly `path` (with or without its query).

        `body` is bytes, str, or a callable taking the request target;
        with `by_header`, a dict from that request header's value to the
        body (the variants of a `Vary: by_header` object).
        `length=False`: no Content-Length, the body ends when the
        connection closes (HTTP/1.0).
        """
        with self._lock:
            self._routes[path] = Route(body, status, content_type, headers,
                                       gzip, length, by_header)

    def prefix(self, prefix, body, status=200, content_type="text/html",
               headers=(), gzip=False):
        """Answer every request whose path starts with `prefix`."""
        with self._lock:
            self._prefix_routes.append(
                (prefix, Route(body, status, content_type, headers, gzip)))
            self._prefix_routes.sort(key=lambda pr: -len(pr[0]))

    def track(self, prefix):
        """Record the maximum number of requests in flight under `prefix`."""
        with self._lock:
            self._trackers.setdefault(prefix, _Tracker())

    def gate(self, prefix, count, bound=20.0):
        """Hold requests under `prefix` until `count` are in flight at once.

        After `bound` seconds from the first held request the gate opens
        anyway, so a client that fetches one at a time is slow, not stuck.
        """
        with self._lock:
            self._trackers.setdefault(prefix, _Tracker()).gate = \
                _Gate(count, bound)

    def hold(self, prefix):
        """Hold requests under `prefix` until the returned event is set.

        Bounded by HOLD_BOUND seconds so a forgotten hold cannot hang a run.
        """
        event = threading.Event()
        with self._lock:
            self._trackers.setdefault(prefix, _Tracker()).hold = event
        return event

    def pause(self, path, offset):
        """Send the first `offset` bytes of `path`'s body, then hold the
        rest until the returned event is set: a page that stops midway
        for as long as the test wants (bounded by HOLD_BOUND)."""
        event = threading.Event()
        with self._lock:
            self._pauses[path] = (offset, event)
        return event

    # -- what it saw -----------------------------------------------------

    def hits(self, target):
        """How many requests named exactly `target` (path and query)."""
        with self._lock:
            return self._hits.get(target, 0)

    def hits_under(self, prefix):
        with self._lock:
            return sum(n for t, n in self._hits.items()
                       if t.startswith(prefix))

    def requests(self):
        with self._lock:
            return list(self._requests)

    def max_in_flight(self, prefix):
        with self._lock:
            return self._trackers[prefix].max_in_flight

    def wait_for_hits(self, target, count=1, timeout=20.0):
        """Block until the origin has seen `count` requests for `target`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._hits.get(target, 0) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def close(self):
        with self._lock:
            for tracker in self._trackers.values():
                if tracker.hold is not None:
                    tracker.hold.set()
                if tracker.gate is not None:
                    tracker.gate.open = True
            for _, event in self._pauses.values():
                event.set()
            self._lock.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        if self._log_file:
            self._log_file.close()

    # -- serving ---------------------------------------------------------

    def _log(self, line):
        if self._log_file:
            with self._lock:
                self._log_file.write(line + "\n")
                self._log_file.flush()

    def _lookup(self, target):
        path = target.split("?", 1)[0]
        with self._lock:
            route = self._routes.get(target) or self._routes.get(path)
            if route is None:
                for prefix, candidate in self._prefix_routes:
                    if path.startswith(prefix):
                        route = candidate
                        break
        return route

    def _trackers_for(self, path):
        return [t for p, t in self._trackers.items() if path.startswith(p)]

    def _enter(self, path):
        with self._lock:
            trackers = self._trackers_for(path)
            for t in trackers:
                t.in_flight += 1
                t.max_in_flight = max(t.max_in_flight, t.in_flight)
                gate = t.gate
                if gate is not None and not gate.open:
                    if gate.deadline is None:
                        gate.deadline = time.monotonic() + gate.bound
                    if t.in_flight >= gate.count:
                        gate.open = True
            self._lock.notify_all()
            for t in trackers:
                gate = t.gate
                while gate is not None and not gate.open:
                    left = gate.deadline - time.monotonic()
                    if left <= 0:
                        gate.open = True
                        self._lock.notify_all()
                        break
                    self._lock.wait(left)
            holds = [t.hold for t in trackers if t.hold is not None]
        for event in holds:
            event.wait(self.HOLD_BOUND)
        return trackers

    def _leave(self, trackers):
        with self._lock:
            for t in trackers:
                t.in_flight -= 1
            self._lock.notify_all()

    def _serve(self, handler, head):
        target = handler.path
        path = target.split("?", 1)[0]
        with self._lock:
            self._hits[target] = self._hits.get(target, 0) + 1
            self._requests.append((handler.command, target,
                                   dict(handler.headers.items())))
            self._lock.notify_all()
        trackers = self._enter(path)
        with self._lock:
            offset, resume = self._pauses.get(path, (None, None))
        try:
            route = self._lookup(target)
            if route is None:
                route = Route(b"no route for " + target.encode() + b"\n",
                              status=404, content_type="text/plain")
            body = route.render(target, handler.headers)
            if route.gzip:
                body = gzip_module.compress(body, mtime=0)
            handler.send_response(route.status)
            if route.content_type:
                handler.send_header("Content-Type", route.content_type)
            if route.gzip:
                handler.send_header("Content-Encoding", "gzip")
            for name, value in route.headers:
                handler.send_header(name, value)
            if route.length:
                handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            if not head and resume is not None:
                handler.wfile.write(body[:offset])
                handler.wfile.flush()
                resume.wait(self.HOLD_BOUND)
                body = body[offset:]
            if not head:
                handler.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self._leave(trackers)
