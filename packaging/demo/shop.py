#!/usr/bin/env python3
"""The demo origin: a small shop whose page is assembled from ESI fragments.

    /               the page shell (cacheable; carries <esi:include> tags)
    /esi/header     site header
    /esi/cart       the visitor's cart: changes on every request
    /esi/recommend  a list that uses alt= and onerror="continue"
    /esi/footer     site footer
"""

import argparse
import http.server
import itertools
import threading
import time

PAGE = """<!doctype html>
<html>
<head><meta charset="utf-8"><title>ESI demo shop</title></head>
<body>
<esi:include src="/esi/header"/>
<main>
  <h2>Today's coffee</h2>
  <ul>
    <li>Ethiopia Yirgacheffe, 250 g: 9.50</li>
    <li>Colombia Huila, 250 g: 8.90</li>
    <li>Kenya AA, 250 g: 11.20</li>
  </ul>
  <aside><esi:include src="/esi/cart"/></aside>
  <esi:include src="/esi/missing" alt="/esi/recommend"/>
  <esi:include src="/esi/broken" onerror="continue"/>
  <esi:remove><p>You see this only without ESI.</p></esi:remove>
  <p>Page shell rendered by the origin at %(rendered)s (cached by nginx).</p>
</main>
<esi:include src="/esi/footer"/>
</body>
</html>
"""

FRAGMENTS = {
    "/esi/header": "<header><h1>ESI demo shop</h1></header>",
    "/esi/recommend": "<section><h3>You may also like</h3>"
                      "<p>Guatemala Antigua</p></section>",
    "/esi/footer": "<footer>Assembled by nginx + esid.</footer>",
}

_carts = itertools.count(1)
_lock = threading.Lock()


class Shop(http.server.BaseHTTPRequestHandler):
    server_version = "esi-demo-shop"

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        status, ctype = 200, "text/html; charset=utf-8"
        if path == "/":
            body = PAGE % {"rendered": time.strftime("%H:%M:%S")}
        elif path == "/esi/cart":
            with _lock:
                n = next(_carts)
            body = ("<div class=\"cart\">Cart: %d item%s (request %d)</div>"
                    % (n % 5, "" if n % 5 == 1 else "s", n))
        elif path in FRAGMENTS:
            body = FRAGMENTS[path]
        elif path == "/esi/broken":
            status, body = 500, "broken"
        else:
            status, ctype, body = 404, "text/plain", "not found\n"
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=8081)
    args = ap.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Shop)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
