"""An HTTP/3 client: Debian's ngtcp2-client (gtlsclient: ngtcp2 and
nghttp3 over GnuTLS), since neither Python's standard library nor Debian
12's curl has one.  It speaks QUIC to NGINX's `listen PORT quic` and takes
any certificate, so a self-signed one made for the test will do.

gtlsclient sends no request fields but the pseudo-headers and user-agent,
and prints what it receives only as a debug trace; h3shim.c, preloaded into
it, adds the fields a test asks for (a name twice is two fields, as
browsers send cookies over HTTP/3) and writes the response as
"HTTP/3 STATUS", its fields and a blank line, then the body byte for byte.
The shim is built once per process with the system's cc (libnghttp3-dev).
"""

import atexit
import collections
import os
import shutil
import subprocess
import tempfile

from .h2 import split_head

GTLSCLIENT = shutil.which("gtlsclient") or "/usr/bin/gtlsclient"
CC = shutil.which("cc") or "/usr/bin/cc"
SHIM_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "h3shim.c")

# The stream's HTTP/3 error code when it closed cleanly (RFC 9114, 8.1).
H3_NO_ERROR = 0x100

# As h2.H2Reply: status (None when no head came), headers (an
# http.client.HTTPMessage), body, complete, error (what the client or the
# shim said) and timed_out.
H3Reply = collections.namedtuple(
    "H3Reply", "status headers body complete error timed_out")

_shim = None


def available():
    """None when the client can run, else why not."""
    for path, package in ((GTLSCLIENT, "ngtcp2-client"),
                          ("/usr/include/nghttp3/nghttp3.h",
                           "libnghttp3-dev")):
        if not os.path.exists(path):
            return "%s not found (packaging/deps.sh installs %s)" % (
                path, package)
    return None


def shim():
    """The path of the built h3shim.so (built on first use)."""
    global _shim
    if _shim is None:
        tmp = tempfile.mkdtemp(prefix="esi-h3shim-")
        atexit.register(shutil.rmtree, tmp, True)
        path = os.path.join(tmp, "h3shim.so")
        subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", path,
                        SHIM_SOURCE, "-ldl"], stdin=subprocess.DEVNULL,
                       capture_output=True, check=True)
        _shim = path
    return _shim


def _fields(headers):
    """ESI_H3_HEADERS: "name: value" lines, names in lower case as HTTP/3
    wants them; headers is a dict or (name, value) pairs."""
    pairs = headers.items() if hasattr(headers, "items") else headers or ()
    lines = []
    for name, value in pairs:
        if "\n" in name + value or "\r" in name + value:
            raise ValueError("a field with CR or LF: %r" % name)
        lines.append("%s: %s" % (name.lower(), value))
    return "\n".join(lines)


def request(url, method="GET", headers=None, timeout=30.0, workdir=None):
    """One request on a new QUIC connection to an https url
    ("https://host:port/path?args": its host:port is the :authority);
    never raises for a bad reply.  workdir holds the response's files
    (default: a temporary directory)."""
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="esi-h3-")
    out = tempfile.mktemp(prefix="h3.", dir=workdir)
    hostport = url.split("/")[2]
    host, _, port = hostport.rpartition(":")
    env = dict(os.environ, LD_PRELOAD=shim(), ESI_H3_OUTPUT=out,
               ESI_H3_HEADERS=_fields(headers))
    argv = [GTLSCLIENT, "--quiet", "--exit-on-all-streams-close",
            "--timeout=%ds" % max(1, int(timeout)), "--http-method", method,
            host.strip("[]"), port, url]
    timed_out = False
    try:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout,
                              check=False)
        returncode, stderr = done.returncode, done.stderr
    except subprocess.TimeoutExpired as e:
        returncode, stderr, timed_out = None, e.stderr or b"", True
    try:
        data = _read(out)
        end = _read(out + ".end").strip()
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    status, hdrs, body = split_head(data)
    closed = int(end) if end.isdigit() else None
    complete = returncode == 0 and status is not None \
        and closed == H3_NO_ERROR
    error = stderr.decode(errors="replace").strip() or None
    if not complete and error is None:
        error = "exit %r, stream closed with %r" % (returncode, closed)
    return H3Reply(status, hdrs, body, complete, error, timed_out)


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""
