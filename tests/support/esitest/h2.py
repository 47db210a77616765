"""An HTTP/2 client: Debian's curl (libcurl with nghttp2), since Python's
standard library has none.  h2c with prior knowledge on a plain listener
(what `listen PORT http2` is in NGINX 1.22), h2 over TLS by ALPN.

curl writes the response head (`-D -`) and then the body (`-o -`) to its
stdout, so one pipe gives both, the body byte for byte."""

import collections
import http.client
import io
import shutil
import subprocess

CURL = shutil.which("curl") or "/usr/bin/curl"

# curl's exit status (curl(1), EXIT CODES) for "operation timed out".
CURL_TIMEOUT = 28


# status (None when no head came), headers (an http.client.HTTPMessage,
# names case-insensitive), body, complete, error (curl's message) and
# timed_out (curl's --max-time passed).
H2Reply = collections.namedtuple(
    "H2Reply", "status headers body complete error timed_out")


def _argv(url, method, headers, timeout, tls):
    argv = [CURL, "--silent", "--show-error", "--max-time", str(timeout),
            "--dump-header", "-", "--output", "-"]
    argv += ["--http2", "--insecure"] if tls else ["--http2-prior-knowledge"]
    if method == "HEAD":
        argv.append("--head")
    elif method != "GET":
        argv += ["--request", method]
    # a dict, or (name, value) pairs to send one name more than once
    pairs = headers.items() if hasattr(headers, "items") else headers or ()
    for name, value in pairs:
        # "Name;" is curl's way to send a header with an empty value;
        # "Name:" would remove it.
        argv += ["--header", "%s: %s" % (name, value) if value != ""
                 else "%s;" % name]
    return argv + [url]


def split_head(data):
    """(status, HTTPMessage, body) from curl's head-then-body output; a
    head starts with "HTTP/2 "."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/"):
        return None, None, data
    status_line, _, fields = head.partition(b"\r\n")
    status = int(status_line.split()[1])
    headers = http.client.parse_headers(io.BytesIO(fields + b"\r\n\r\n"))
    return status, headers, body


def request(url, method="GET", headers=None, timeout=30.0, tls=False):
    """One request on a new HTTP/2 connection; never raises for a bad
    reply."""
    done = subprocess.run(_argv(url, method, headers, timeout, tls),
                          stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=timeout + 10, check=False)
    status, hdrs, body = split_head(done.stdout)
    return H2Reply(status, hdrs, body,
                   done.returncode == 0 and status is not None,
                   done.stderr.decode(errors="replace").strip() or None,
                   done.returncode == CURL_TIMEOUT)


def start_multiplexed(url, count, outdir, timeout=60.0):
    """curl started on `count` GETs of an https url at once, as streams of
    one HTTP/2 connection (curl --parallel multiplexes over the connection
    it shares), each body to a file of outdir; returns (Popen, the files).
    TLS only: with h2c prior knowledge curl 7.88.1 fails every stream but
    one ("Error in the HTTP2 framing layer") against any server."""
    argv = [CURL, "--silent", "--show-error", "--max-time", str(timeout),
            "--http2", "--insecure", "--parallel", "--parallel-max",
            str(count), "--fail"]
    names = ["%s/body.%d" % (outdir, i) for i in range(count)]
    for name in names:
        argv += ["--output", name, url]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE), names


def fetch_multiplexed(url, count, outdir, timeout=60.0):
    """start_multiplexed, waited for: (curl's exit status, its stderr, the
    bodies, None for one not written)."""
    curl, names = start_multiplexed(url, count, outdir, timeout)
    err = curl.communicate(timeout=timeout + 10)[1]
    bodies = []
    for name in names:
        try:
            with open(name, "rb") as f:
                bodies.append(f.read())
        except OSError:
            bodies.append(None)
    return curl.returncode, err.decode(errors="replace"), bodies
