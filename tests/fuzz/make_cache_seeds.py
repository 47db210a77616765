#!/usr/bin/env python3
"""Writes the seeds of fuzz_cache_file into tests/fuzz/corpus/fuzz_cache_file/
(run once by hand, outputs committed; README.md).

The cache files are written by a real NGINX (Debian's, or ESI_NGINX):
proxy_cache in front of a Python origin whose responses carry what esid
reads: Surrogate-Key and xkey lines in every spelling, a Vary that makes a
variant, a long key, a key of another proxy_cache_key.  Beside them, each
one's file name (32 hex digits) and a few names that are not.

fuzz_cache_file input: the head of a cache file (its first 32 bytes also
read as a file name).
"""

import glob
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request

corpus = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "support"))
from esitest import NGINX, free_port, poll, tcp_port_answers  # noqa: E402

# path -> (request headers, response headers)
PAGES = {
    "/tags": ({}, [("Surrogate-Key", "product-1 cat-2"), ("xkey", "home")]),
    "/tags-spelling": ({}, [("surrogate-key", " a,b\tc ,, d "),
                            ("XKey", "e"), ("XKEY", "f,g"),
                            ("Surrogate-Key-Not", "h")]),
    "/vary": ({"Accept-Encoding": "gzip"},
              [("Vary", "Accept-Encoding"), ("Surrogate-Key", "v")]),
    "/vary-two": ({"Accept-Language": "de", "X-Tenant": "t1"},
                  [("Vary", "Accept-Language, X-Tenant")]),
    "/long-key?" + "q=" + "k" * 900: ({}, [("Surrogate-Key", "long")]),
    "/plain": ({}, []),
    "/other-key": ({"X-Tenant": "t2"}, [("xkey", "tenant")]),
}

NGINX_CONF = """\
%(user)s
worker_processes 1;
pid %(tmp)s/nginx.pid;
error_log %(tmp)s/error.log info;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %(tmp)s/client_body;
    proxy_temp_path %(tmp)s/proxy_temp;
    fastcgi_temp_path %(tmp)s/fastcgi_temp;
    uwsgi_temp_path %(tmp)s/uwsgi_temp;
    scgi_temp_path %(tmp)s/scgi_temp;
    proxy_cache_path %(tmp)s/cache levels=1:2 keys_zone=pages:1m;
    server {
        listen 127.0.0.1:%(port)d;
        proxy_cache pages;
        proxy_cache_valid 200 10m;
        location / { proxy_pass http://127.0.0.1:%(origin)d; }
        location /other-key {
            proxy_pass http://127.0.0.1:%(origin)d;
            proxy_cache_key "$http_x_tenant|$host$request_uri";
        }
    }
}
"""


class Origin(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        _, headers = PAGES[self.path]
        body = b"<html><esi:include src=\"/frag\"/>" + self.path.encode()[:40] + b"</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def write(name, data):
    with open(os.path.join(corpus, "fuzz_cache_file", name), "wb") as f:
        f.write(data)


def main():
    os.makedirs(os.path.join(corpus, "fuzz_cache_file"), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="esi-cache-seeds.")
    origin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    port = free_port()
    with open(os.path.join(tmp, "nginx.conf"), "w") as f:
        # as root, workers run as root too: the cache is in our temp dir
        user = "user root;" if os.geteuid() == 0 else ""
        f.write(NGINX_CONF % {"user": user, "tmp": tmp, "port": port,
                              "origin": origin.server_address[1]})
    nginx = subprocess.Popen([NGINX, "-p", tmp + "/", "-e", tmp + "/error.log",
                              "-c", tmp + "/nginx.conf", "-g", "daemon off;"])
    try:
        if not poll(lambda: tcp_port_answers(port)):
            sys.exit("make_cache_seeds: nginx did not answer")
        for path, (headers, _) in PAGES.items():
            request = urllib.request.Request(
                "http://127.0.0.1:%d%s" % (port, path), headers=headers)
            urllib.request.urlopen(request).read()
        files = lambda: [p for p in glob.glob(tmp + "/cache/*/*/*")
                         if os.path.isfile(p)]
        if not poll(lambda: len(files()) == len(PAGES)):
            sys.exit("make_cache_seeds: no cache file for every page")
    finally:
        nginx.terminate()
        nginx.wait()
        origin.shutdown()

    for path in sorted(files()):
        with open(path, "rb") as f:
            data = f.read()
        key = data[data.index(b"\nKEY: ") + 6:].split(b"\n", 1)[0]
        page = key.split(b"/", 3)[-1].split(b"?")[0].decode() or "root"
        name = os.path.basename(path)
        write("nginx-" + page, data)
        write("name-" + page, name.encode())
        if page == "tags":
            # what a scan meets besides whole files of this NGINX version
            write("cut-in-key", data[:data.index(b"\nKEY: ") + 12])
            write("cut-in-header", data[:200])
            write("version-4", b"\x04" + data[1:])
    shutil.rmtree(tmp)

    # Names a cache directory holds besides cache files.
    write("name-upper", b"5BF0639767F3E9EAAD729B54037A7E2A")
    write("name-short", b"5bf0639767f3e9eaad729b54037a7e2")
    write("name-temp", b"0000000001")


main()
