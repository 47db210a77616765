"""The benchmark's workload: the matrices (their rows and arms) and the pages
and fragments each row serves, with the bytes every target must answer.

Everything here is computed from fixed seeds: the same pages every run.
"""

import gzip
import os
import random

KB = 1024
SHELL_SIZE = 256 * KB
DELAYS = (0, 20, 50)            # ms per fragment at the origin
FRAGMENTS = (1, 8, 32)
COST_SIZES = (16 * KB, 256 * KB, 4096 * KB)
COST_INCLUDES = (0, 16)
COST_KINDS = ("dense", "text")  # one '<' per 11 bytes, per 71 bytes

# Main-matrix arms in the order each round measures them.  "minimal" is the
# README's minimal configuration, `esi on` alone: plans and gzip stitching
# by default.  "esi" parses every hit (`esi_plan off`); "esi-aa" is the same
# target measured again in the same round: the A/A arm.  "esiplan" replays
# plans without stitching (`esi_stitch off`).
# "origin" is one fragment fetched from the origin itself, with the same
# wrk, and "static" the assembled page gzipped ahead of time, sent by an
# NGINX with `gzip_static`: a page costs at least one of each, so the two
# compose the ceiling of a 1-fragment row, which no ESI server can pass.
MAIN_ARMS = ("esi", "esiplan", "minimal", "varnish", "ssi", "noesi",
             "origin", "static", "esi-aa")
# "ssi-filter" is the same page through NGINX's SSI filter (it holds no SSI
# command): NGINX's own in-memory path, the control for the latency tail.
COST_ARMS = ("esi-off", "esi-on", "esi-plan", "ssi-filter", "esi-on-aa")
ARM_LABEL = {
    "esi": "esi_plan off",
    "esiplan": "plans, esi_stitch off",
    "minimal": "esi on (minimal configuration)",
    "esi-plan": "esi on, plans",
    "esi-aa": "esi_plan off (A/A)",
    "varnish": "Varnish 7.1",
    "ssi": "nginx SSI",
    "noesi": "nginx, no ESI",
    "origin": "one fragment from the origin",
    "static": "the assembled page, gzip_static",
    "esi-off": "esi off",
    "esi-on": "esi on, esi_plan off",
    "esi-on-aa": "esi on, esi_plan off (A/A)",
    "ssi-filter": "esi off, ssi on",
    "without": "without",
    "with": "with vars, choose",
    "with-aa": "with (A/A)",
}

# The target each arm is measured on.
TARGET_OF_ARM = {"esi": "esi", "esi-aa": "esi", "esiplan": "esiplan",
                 "minimal": "minimal",
                 "varnish": "varnish", "ssi": "ssi", "noesi": "noesi",
                 "origin": "origin", "static": "static", "esi-off": "noesi", "esi-on": "esi",
                 "esi-plan": "esiplan", "ssi-filter": "ssi",
                 "esi-on-aa": "esi", "without": "esi", "with": "esi",
                 "with-aa": "esi"}


# -- pages ---------------------------------------------------------------------

WORDS = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do "
         "eiusmod tempor incididunt ut labore et dolore magna aliqua enim "
         "minim veniam quis nostrud exercitation ullamco laboris nisi aliquip "
         "commodo consequat duis aute irure reprehenderit voluptate velit "
         "esse cillum fugiat nulla pariatur excepteur sint occaecat cupidatat "
         "proident sunt culpa officia deserunt mollit anim laborum").split()


def fragment_body(uri):
    """What the origin's echo location answers for a fragment URI."""
    return ('<div class="frag">%s</div>\n' % uri).encode()


COST_FRAGMENT = b'<span class="frag">fragment</span>\n'

# The ESI-language matrix (issue #9): a page with 16 variable references
# and 4 choose blocks against the same page with their outcome written in,
# both through esi on, for one client whose request the page reads.  The
# page without them starts with one <esi:comment>, so that it is a planned
# page too: a page with no ESI at all goes out as with esi off once a worker
# has its one-run plan, and the ratio would then be that of esid's round
# trip, not of evaluating the variables and tests.
LANG_BASELINE_MARK = b'<esi:comment text="a planned page"/>'
LANG_SIZES = (16 * KB, 256 * KB)
LANG_ARMS = ("without", "with", "with-aa")
LANG_QUERY = "?q=shoes&page=2"
LANG_HEADERS = (
    "Host: shop.example",
    "Cookie: user=alice; theme=dark; session=secret",
    "Accept-Language: en-GB,en;q=0.8,fr;q=0.5",
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 "
    "Firefox/120.0",
)
# (markup, what it yields for LANG_HEADERS and LANG_QUERY)
LANG_VARS = (
    ("$(HTTP_COOKIE{user})", "alice"),
    ("$(HTTP_COOKIE{theme})", "dark"),
    ("$(HTTP_COOKIE{session}|anonymous)", "anonymous"),  # not esi_cookies'
    ("$(QUERY_STRING{q})", "shoes"),
    ("$(QUERY_STRING{page})", "2"),
    ("$(QUERY_STRING{sort}|price)", "price"),
    ("$(HTTP_ACCEPT_LANGUAGE{en})", "true"),
    ("$(HTTP_ACCEPT_LANGUAGE{de})", "false"),
    ("$(HTTP_USER_AGENT{browser})", "MOZILLA"),
    ("$(HTTP_USER_AGENT{os})", "UNIX"),
    ("$(HTTP_USER_AGENT{version})", "5.0"),
    ("$(HTTP_HOST)", "shop.example"),
    ("$(HTTP_REFERER|direct)", "direct"),
    ("$(HTTP_COOKIE{user})", "alice"),
    ("$(QUERY_STRING{q})", "shoes"),
    ("$(HTTP_COOKIE{missing}|none)", "none"),
)
LANG_CHOOSES = (
    ("<esi:choose><esi:when test=\"$(HTTP_COOKIE{theme}) == 'dark'\">"
     "<p>dark theme</p></esi:when><esi:otherwise><p>light theme</p>"
     "</esi:otherwise></esi:choose>", "<p>dark theme</p>"),
    ("<esi:choose><esi:when test=\"$(QUERY_STRING{page}) > 1\">"
     "<a>previous page</a></esi:when><esi:otherwise></esi:otherwise>"
     "</esi:choose>", "<a>previous page</a>"),
    ("<esi:choose><esi:when test=\"$(HTTP_ACCEPT_LANGUAGE{de})\">"
     "<p>Hallo</p></esi:when><esi:when test=\"$(HTTP_ACCEPT_LANGUAGE{en})\">"
     "<p>Hello</p></esi:when><esi:otherwise><p>Hi</p></esi:otherwise>"
     "</esi:choose>", "<p>Hello</p>"),
    ("<esi:choose><esi:when test=\"$(HTTP_USER_AGENT{browser}) == 'MSIE'\">"
     "<p>old browser</p></esi:when><esi:otherwise><p>modern browser</p>"
     "</esi:otherwise></esi:choose>", "<p>modern browser</p>"),
)


def esi_tag(uri):
    return ('<esi:include src="%s"/>' % uri).encode()


def ssi_tag(uri):
    return ('<!--# include virtual="%s" -->' % uri).encode()


def shell_filler(size, rng):
    """`size` bytes of product-listing HTML, in whole lines but the last."""
    out = []
    n = 0
    i = 0
    while n < size:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
        line = ('<li class="item"><a href="/p/%d">%s</a> <span class="price">'
                '%d.%02d</span></li>\n' % (
                    i, words, rng.randint(1, 999), rng.randint(0, 99)))
        out.append(line.encode())
        n += len(line)
        i += 1
    return b"".join(out)[:size]


def cost_filler(size, kind, rng):
    """`size` bytes with one '<' every 11 (dense) or 71 (text) bytes."""
    gap = 11 if kind == "dense" else 71
    out = []
    n = 0
    closing = False
    while n < size:
        tag = b"</b>" if closing else b"<b>"
        closing = not closing
        text = []
        room = gap - len(tag)
        while room > 0:
            w = rng.choice(WORDS)
            text.append((w + " ")[:room])
            room -= len(text[-1])
        unit = tag + "".join(text).encode()
        out.append(unit)
        n += len(unit)
    return b"".join(out)[:size]


def split_at_lines(data, parts):
    """`data` cut into `parts` pieces of about equal size, at newlines."""
    cuts = [0]
    for k in range(1, parts):
        at = data.find(b"\n", len(data) * k // parts)
        at = len(data) if at < 0 else at + 1
        cuts.append(max(at, cuts[-1]))
    cuts.append(len(data))
    return [data[cuts[k]:cuts[k + 1]] for k in range(parts)]


def split_even(data, parts, boundary=b"<"):
    """`data` cut into `parts` pieces of about equal size, before a '<'."""
    cuts = [0]
    for k in range(1, parts):
        at = data.find(boundary, len(data) * k // parts)
        at = len(data) if at < 0 else at
        cuts.append(max(at, cuts[-1]))
    cuts.append(len(data))
    return [data[cuts[k]:cuts[k + 1]] for k in range(parts)]


HEAD = (b'<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        b'<title>bench</title></head>\n<body><ul class="listing">\n')
TAIL = b"</ul></body></html>\n"


def main_pages(n, d):
    """(ESI shell, SSI shell, assembled page) for N fragments, D ms."""
    uris = ["/f%d/%d" % (d, i) for i in range(n)]
    tags = sum(len(esi_tag(u)) for u in uris)
    rng = random.Random(1000 * n + d)
    filler = shell_filler(SHELL_SIZE - len(HEAD) - len(TAIL) - tags, rng)
    pieces = split_at_lines(filler, n + 1)

    def join(make):
        out = [HEAD, pieces[0]]
        for uri, piece in zip(uris, pieces[1:]):
            out += [make(uri), piece]
        out.append(TAIL)
        return b"".join(out)

    return join(esi_tag), join(ssi_tag), join(fragment_body)


def cost_pages(size, kind, includes):
    """(ESI page, assembled page) for the cost matrix."""
    uris = ["/cf/%d" % i for i in range(includes)]
    tags = sum(len(esi_tag(u)) for u in uris)
    rng = random.Random(size + includes + (7 if kind == "dense" else 0))
    filler = cost_filler(size - tags, kind, rng)
    pieces = split_even(filler, includes + 1)
    page = [pieces[0]]
    assembled = [pieces[0]]
    for uri, piece in zip(uris, pieces[1:]):
        page += [esi_tag(uri), piece]
        assembled += [COST_FRAGMENT, piece]
    return b"".join(page), b"".join(assembled)


def lang_pages(size):
    """(page with the variables and choose blocks, the same page with
    their outcome written in) for the language matrix."""
    rng = random.Random(size + 9)
    pieces = split_even(cost_filler(size, "text", rng), 8)
    marked, plain = [], []
    for i, piece in enumerate(pieces):
        marked.append(piece)
        plain.append(piece)
        if i % 2 == 0 and i // 2 < len(LANG_CHOOSES):
            markup, outcome = LANG_CHOOSES[i // 2]
            marked.append(markup.encode())
            plain.append(outcome.encode())
        elif i % 2 == 1:
            refs = LANG_VARS[(i // 2) * 4:(i // 2) * 4 + 4]
            marked.append(("<esi:vars><ul>%s</ul></esi:vars>" % "".join(
                "<li>%s</li>" % m for m, _ in refs)).encode())
            plain.append(("<ul>%s</ul>" % "".join(
                "<li>%s</li>" % v for _, v in refs)).encode())
    return b"".join(marked), b"".join(plain)


def size_label(size):
    return "%d MB" % (size // (1024 * KB)) if size >= 1024 * KB else \
        "%d KB" % (size // KB)


def row_label(row):
    if row[0] == "lang":
        return "%s plans %s" % (size_label(row[1]), row[2])
    if len(row) == 2:
        return "N=%d D=%dms" % row
    return "%s %s %d includes" % (size_label(row[0]), row[1], row[2])


# -- on disk ---------------------------------------------------------------------

def write_pages(www):
    """Writes every page of every matrix under `www` (the origin's root);
    returns (expected, urls): (matrix, row[, on|off]) -> the bytes a target
    must answer, (matrix, row, target) -> the path it is asked for."""
    expected = {}   # (matrix, row) -> expected bytes
    urls = {}       # (matrix, row, target) -> path
    for n in FRAGMENTS:
        for d in DELAYS:
            esi, ssi, flat = main_pages(n, d)
            name = "n%d-d%d.html" % (n, d)
            for sub, data in (("esi", esi), ("ssi", ssi), ("flat", flat),
                              ("static", flat)):
                os.makedirs(os.path.join(www, sub), exist_ok=True)
                with open(os.path.join(www, sub, name), "wb") as f:
                    f.write(data)
            with open(os.path.join(www, "static", name + ".gz"), "wb") as f:
                f.write(gzip.compress(flat, compresslevel=6, mtime=0))
            row = (n, d)
            expected[("main", row)] = flat
            urls[("main", row, "esi")] = "/esi/" + name
            urls[("main", row, "esiplan")] = "/esi/" + name
            urls[("main", row, "minimal")] = "/esi/" + name
            urls[("main", row, "varnish")] = "/esi/" + name
            urls[("main", row, "ssi")] = "/ssi/" + name
            urls[("main", row, "noesi")] = "/flat/" + name
            urls[("main", row, "origin")] = "/f%d/0" % d
            urls[("main", row, "static")] = "/static/" + name
    os.makedirs(os.path.join(www, "cost"), exist_ok=True)
    for size in COST_SIZES:
        for kind in COST_KINDS:
            for inc in COST_INCLUDES:
                page, assembled = cost_pages(size, kind, inc)
                name = "%d-%s-%d.html" % (size // KB, kind, inc)
                with open(os.path.join(www, "cost", name), "wb") as f:
                    f.write(page)
                row = (size, kind, inc)
                expected[("cost", row, "on")] = assembled
                expected[("cost", row, "off")] = page
                urls[("cost", row)] = "/cost/" + name
                # NGINX's SSI filter drops a '<' that ends a body (it may
                # start a command): its copy ends with a newline instead
                os.makedirs(os.path.join(www, "ssi"), exist_ok=True)
                with open(os.path.join(www, "ssi", "cost-" + name),
                          "wb") as f:
                    f.write(page + b"\n")
                expected[("cost", row, "ssi")] = page + b"\n"
                urls[("cost", row, "ssi")] = "/ssi/cost-" + name
    os.makedirs(os.path.join(www, "lang"), exist_ok=True)
    for size in LANG_SIZES:
        marked, plain = lang_pages(size)
        for arm, data in (("with", marked),
                          ("without", LANG_BASELINE_MARK + plain)):
            name = "%d-%s.html" % (size // KB, arm)
            with open(os.path.join(www, "lang", name), "wb") as f:
                f.write(data)
            urls[("lang", size, arm)] = "/lang/" + name + LANG_QUERY
        expected[("lang", size)] = plain
    return expected, urls
