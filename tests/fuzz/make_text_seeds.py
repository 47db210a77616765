#!/usr/bin/env python3
"""Writes the hand-written seeds of fuzz_parser and fuzz_include_uri into
tests/fuzz/corpus/ (run once by hand, outputs committed; README.md).

fuzz_parser input: 8 header bytes (byte 0: limits and byte-by-byte bit,
bytes 1-7: seed of the chunk sizes), then the page.
fuzz_include_uri input: page path length, authority length, page path,
authority, src.
"""

import os
import sys

corpus = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus")

PAGES = {
    "include-self-closing": b'<p>a<esi:include src="/cart"/>b</p>',
    "include-end-tag": b'<esi:include src="frag?x=1&amp;y=2" alt="/alt" '
                       b'onerror="continue"></esi:include>',
    "include-quotes": b"<esi:include src='/q' alt=/unquoted onerror='abort'/>",
    "include-entities": b'<esi:include src="/&#x41;&#66;&lt;&gt;&quot;&apos;&bogus;&#0;"/>',
    "include-malformed": b'<esi:include src="/a" src="/b"/><esi:include/>'
                         b'<esi:include src=/>x<esi:include ="/c"/>',
    "remove-nested": b"a<esi:remove>b<esi:remove>c</esi:remove>d</esi:remove>e"
                     b"<esi:remove/></esi:remove>",
    "esi-comment": b"a<!--esi <esi:include src=\"/in\"/> b --->c<!--esi x",
    "html-comment-cdata": b"<!-- <esi:include src=\"/no\"/> --><![CDATA[ "
                          b"<esi:remove> ]]>]]><!-- open",
    "vars-comment-unknown": b"<esi:vars>$(HTTP_HOST)</esi:vars></esi:vars>"
                            b"<esi:comment text=\"c\"/><esi:try><esi:attempt>"
                            b"</esi:attempt></esi:try></esi:unknown>",
    "lt-inside-tag": b"<esi:include src=\"/a\" <b>x</b> <esi:incl",
    "long-tag": b"<esi:include src=\"/" + b"a" * 600 + b"\"/>tail",
    "unclosed-remove": b"x<esi:remove>y<esi:include src=\"/z\"/>",
    "html-page": b"<!DOCTYPE html><html><head><title>t</title></head><body>"
                 b"<h1>Shop</h1><esi:include src=\"/header\" "
                 b"onerror=\"continue\"/><ul><li>1</li></ul>"
                 b"<esi:remove><a href=\"/nojs\">x</a></esi:remove>"
                 b"<!--esi <p><esi:include src=\"/cart\"/></p> -->"
                 b"</body></html>\n",
    "vars-references": b"<esi:vars>$(HTTP_COOKIE{a)b}|'x)\\'y') $(document) "
                       b"$(A<b>$$(QUERY_STRING{q}|bare)<!--esi $(HTTP_HOST) -->"
                       b"$(A|'" + b"x" * 40 + b"')</esi:vars>$(HTTP_HOST)",
    "vars-when-try": b"<esi:choose>x<esi:when test=\"$(HTTP_COOKIE{g})=='a' &amp; 1\">"
                     b"<esi:try><esi:attempt><esi:include src=\"/$(QUERY_STRING{p})\"/>"
                     b"</esi:attempt><esi:except>e</esi:except></esi:try></esi:when>"
                     b"<esi:otherwise/><esi:when test>w</esi:choose></esi:attempt>"
                     b"<esi:try><esi:except>1<esi:attempt>2",
}

# byte 0: limits (bits 0-1) and byte by byte (bit 2); bytes 1-7: chunk seed
HEADERS = [b"\x00\x01\x02\x03\x04\x05\x06\x07", b"\x01\x9c\x1f\x00\x00\x00\x00\x2a",
           b"\x04\x00\x00\x00\x00\x00\x00\x00"]

URIS = [
    # (page path, authority, src)
    (b"/shop/index.html", b"example.com", b"cart?x=1&y=2"),
    (b"/shop/index.html", b"example.com", b"../a/./b/../c"),
    (b"/shop/", b"example.com", b"?only=args"),
    (b"/", b"example.com", b"http://example.com:80/x"),
    (b"/", b"example.com:443", b"HTTPS://EXAMPLE.COM/x#frag"),
    (b"/", b"example.com", b"//evil.example/x"),
    (b"/", b"example.com", b"http://127.0.0.1@example.com/x"),
    (b"/", b"example.com", b"/\\evil.example/x"),
    (b"/", b"example.com", b"http:\\\\evil.example/x"),
    (b"/", b"example.com", b"http://%65vil.example/x"),
    (b"/", b"example.com", b"http://[::1]/x"),
    (b"/", b"[::1]:8080", b"http://[::1]:8080/x"),
    (b"/", b"example.com", b"/a%0d%0aX-Injected:%201"),
    (b"/", b"example.com", b"/a?b\r\nX-Injected: 1"),
    (b"/", b"example.com", b"/a%00b"),
    (b"/a/b/", b"example.com", b"../../../etc/passwd"),
    (b"/a/b/", b"example.com", b"%2e%2e/%2e%2e/%2e%2e/etc/passwd"),
    (b"/", b"example.com", b"/a/%2F%2Fevil"),
    (b"/", b"example.com", b"javascript:alert(1)"),
    (b"/", b"example.com", b"file:///etc/passwd"),
]


def write(target, name, data):
    os.makedirs(os.path.join(corpus, target), exist_ok=True)
    with open(os.path.join(corpus, target, name), "wb") as f:
        f.write(data)


for i, (name, page) in enumerate(sorted(PAGES.items())):
    write("fuzz_parser", name, HEADERS[i % len(HEADERS)] + page)

for i, (page, authority, src) in enumerate(URIS):
    write("fuzz_include_uri", "uri-%02d" % i,
          bytes([len(page), len(authority)]) + page + authority + src)
