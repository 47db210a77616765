#!/usr/bin/env python3
"""Writes the seeds of the header and request parsers' targets into corpus/:
fuzz_purge_tags, fuzz_tag_join, fuzz_surrogate_control,
fuzz_metrics_request and fuzz_fleet_entry (README.md says each format).
Run once by hand; its outputs are committed."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("latin-1")
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def magento(*tags):
    return "|".join("((^|,)%s(,|$))" % t for t in tags)


# A purge request's tag header value, split and read as Magento's pattern.
purge_tags = {
    "surrogate-key": "product-42 category-7 homepage",
    "xkey-comma": "a,b,,c",
    "cache-tags": "t1, t2,\tt3 ",
    "only-separators": " ,\t, ",
    "empty": "",
    "one-tag": "x",
    # Magento 2's PurgeCache sends these (Magento\CacheInvalidate).
    "magento-one": magento("cat_p_42"),
    "magento-product": magento("cat_p_1", "cat_p", "cat_c_p_1"),
    "magento-cms": magento("cms_p_2", "cms_b_footer_links_block"),
    "magento-flush": ".*",
    "magento-trailing-bar": magento("cat_p_1") + "|",
    "magento-empty-tag": "((^|,)(,|$))",
    "magento-regex-tag": magento("cat_p_.*"),
    "magento-nul-tag": magento("cat\0p"),
    "magento-cut": magento("cat_p_1")[:-1],
    "other-regex": "^cat_p_[0-9]+$",
}
for name, value in purge_tags.items():
    write("fuzz_purge_tags", name, value)

# Byte 0 the cut's limit, then an upstream's tag header values, "\n" apart.
tag_join = {
    "one-header": (255, ["product-42 category-7 homepage"]),
    "three-headers": (255, ["a b", "xkey,c", "\t d ,e"]),
    "cut-inside-tag": (10, ["alpha beta gamma"]),
    "cut-at-space": (10, ["alpha beta gamma delta"]),
    "cut-first-too-long": (3, ["alphabet b"]),
    "empty-headers": (255, ["", " ", ","]),
    "magento-x-tags": (64, ["cat_p_1,cat_p,cat_c_p_1,cms_b_footer",
                            "store,cms_p_2"]),
}
for name, (limit, values) in tag_join.items():
    write("fuzz_tag_join", name, bytes([limit]) + "\n".join(values).encode())

# Byte 0 the name's length, the name, the values "\n" apart.  The
# directives of the W3C Edge Architecture Specification 1.0 (2.2: no-store,
# no-store-remote, max-age=N+M, content; 2.3: ";target"), as CDNs send
# them, and malformed ones.
surrogate = {
    "w3c-content": ("", ['content="ESI/1.0 ESI-INLINE/1.0"']),
    "w3c-max-age-stale": ("", ['max-age=30+60, content="ESI/1.0"']),
    "w3c-no-store-targeted": ("abc", ["no-store;abc"]),
    "w3c-targeted-max-age": ("abc", ["max-age=3600+600;abc, no-store"]),
    "w3c-other-target": ("abc", ["max-age=600, no-store;def"]),
    "w3c-no-store-remote": ("", ["no-store-remote, max-age=60"]),
    "fastly-stale": ("", ["max-age=86400, stale-while-revalidate=60"]),
    "akamai": ("akamai", ['content="ESI/1.0",max-age=300;akamai']),
    "two-headers": ("edge", ["max-age=10", 'content="ESI/1.0"; edge ']),
    "quoted-comma": ("", ['content="ESI/1.0, x", max-age=5']),
    "max-age-overflow": ("", ["max-age=9223372036854775808"]),
    "max-age-largest": ("", ["max-age=9223372036854775807"]),
    "max-age-bad": ("", ["max-age=-1, max-age=1x, max-age=, max-age=+5"]),
    "unclosed-quote": ("", ['content="ESI/1.0']),
    "empty-target": ("", ["no-store;"]),
}
for name, (target, values) in surrogate.items():
    write("fuzz_surrogate_control", name,
          bytes([len(target)]) + target.encode() + "\n".join(values).encode())

# What a scraper sends esid's metrics endpoint.
PROMETHEUS = (
    "GET /metrics HTTP/1.1\r\n"
    "Host: 127.0.0.1:9145\r\n"
    "User-Agent: Prometheus/2.45.0\r\n"
    "Accept: application/openmetrics-text;version=1.0.0,"
    "application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n"
    "Accept-Encoding: gzip\r\n"
    "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n")
metrics = {
    "prometheus": PROMETHEUS,
    "curl": "GET /metrics HTTP/1.1\r\nHost: localhost:9145\r\n"
            "User-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n",
    "http10": "GET /metrics HTTP/1.0\r\n\r\n",
    "query": "GET /metrics?name[]=esi_up HTTP/1.1\r\n\r\n",
    "head": "HEAD /metrics HTTP/1.1\r\n\r\n",
    "post": "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "other-path": "GET /metrics/ HTTP/1.1\r\n\r\n",
    "http2-preface": "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "no-version": "GET /metrics\r\n\r\n",
    "two-spaces": "GET  /metrics HTTP/1.1\r\n\r\n",
    "no-crlf-crlf": "GET /metrics HTTP/1.1\r\n",
    "lf-only": "GET /metrics HTTP/1.1\n\n\r\n\r\n",
}
for name, request in metrics.items():
    write("fuzz_metrics_request", name, request)


def fields(*pairs):
    out = b""
    for name, value in pairs:
        for text in (name, value):
            text = text.encode("latin-1")
            out += struct.pack("<H", len(text)) + text
    return out


# As encodeEntry writes them (XADD esi-purges * v 1 node ... uid ...).
BASE = [("v", "1"), ("node", "web-1.example.com"), ("zone", "pages"),
        ("kind", "key"), ("value", "httpexample.com/index.html"),
        ("uid", "web-1.example.com:1733388000123:7")]
fleet = {
    "key": BASE,
    "prefix-empty": BASE[:3] + [("kind", "prefix"), ("value", "")] + BASE[5:],
    "tag-soft": BASE[:3] + [("kind", "tag"), ("value", "product-42")]
                + BASE[5:] + [("soft", "1")],
    "pattern-ack": BASE[:3] + [("kind", "pattern"), ("value", "^cat_p_.*")]
                   + BASE[5:] + [("ack", "1")],
    "version-2": [("v", "2")] + BASE[1:],
    "repeated": BASE + [("zone", "other")],
    "missing-uid": BASE[:5],
    "unknown-field": BASE + [("extra", "x")],
    "nul-in-value": BASE[:4] + [("value", "a\0b")] + BASE[5:],
    "bad-node": BASE[:1] + [("node", "web 1")] + BASE[2:],
    "ack-not-1": BASE + [("ack", "yes")],
    "stream-ids": [("id", "1733388000123-0"), ("last", "0-0"),
                   ("big", "18446744073709551615-1"), ("bad", "1-2-3")],
}
for name, pairs in fleet.items():
    write("fuzz_fleet_entry", name, fields(*pairs))
