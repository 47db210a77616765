"""The documentation against the code (ctest: docs.reference, docs.troubleshoot).

Reference: every directive of the module's ngx_command_t tables
(nginx-connector/*.c) and every esid setting and flag (the table kSettings,
daemon/esid/settings.cc, and the flags that are no setting, main.cc) has its
row in docs/reference.md, with the table's default, and every row there
names one that still exists.

Troubleshoot: every line the module logs at warn or above
(ngx_log_error/ngx_conf_log_error at NGX_LOG_EMERG, ALERT, CRIT, ERR, WARN)
and every line esid logs with spdlog::warn, error or critical appears in
docs/troubleshoot.md: its fixed text, in order, on one line of the page.

Pages: README.md is at most 250 lines and links every docs/ page, and every
relative link of the README, docs/, bench/ and the tests' and protocol's
READMEs names a file (and heading) that exists.

    python3 tests/docs_test.py              # all
    python3 tests/docs_test.py Reference    # one
"""

import glob
import os
import re
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def read_abs(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------- reference

def module_directives():
    """Names of every ngx_command_t table's entries, by file."""
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "nginx-connector", "*.c"))):
        text = read_abs(path)
        for table in re.finditer(
                r"ngx_command_t\s+\w+\[\]\s*=\s*\{(.*?)ngx_null_command", text, re.S):
            for name in re.findall(r'\{\s*ngx_string\("([^"]+)"\)', table.group(1)):
                found[name] = os.path.relpath(path, ROOT)
    return found


def esid_setting_rows():
    """The rows of esid's table of settings (kSettings, settings.cc): for
    each key, its flag and its default ("" for none)."""
    text = read("daemon/esid/settings.cc")
    table = re.search(r"SettingSpec kSettingTable\[\] = \{(.*?)\n\};", text, re.S).group(1)
    rows = {}
    for row in re.split(r"\bsetting<", table)[1:]:
        fields = dict(re.findall(r'\.(key|flag|value) = "([^"]*)"', row))
        rows[fields["key"]] = (fields.get("flag", ""), fields.get("value", ""))
    return rows


def esid_settings():
    """The settings file's keys and esid's flags: the table's, and main.cc's
    that are no setting (--config, --version)."""
    rows = esid_setting_rows()
    main = read("daemon/esid/main.cc")
    flags = set(re.findall(r'add_(?:option|flag)\(\s*"(--[a-z-]+)', main))
    flags |= set(re.findall(r'set_version_flag\(\s*"(--[a-z-]+)', main))
    flags |= {flag for flag, _ in rows.values() if flag}
    return set(rows), flags


def documented():
    """First-column names of docs/reference.md's tables: directives before
    the heading "esid settings and flags", settings (with their default
    column) and flags after it."""
    directives, settings, flags = set(), {}, set()
    part = directives
    for line in read("docs/reference.md").splitlines():
        if line.startswith("#"):
            part = settings if "esid settings" in line.lower() else part
            continue
        if not line.startswith("| `") and not line.startswith("| --"):
            continue
        cells = re.split(r"(?<!\\)\|", line)
        for code in re.findall(r"`([^`]+)`", cells[1]):
            name = code.split()[0]
            if name.startswith("--"):
                flags.add(name)
            elif part is settings:
                settings[name] = cells[2].strip()
            else:
                part.add(name)
    return directives, settings, flags


class Reference(unittest.TestCase):
    def setUp(self):
        self.doc_directives, self.doc_settings, self.doc_flags = documented()

    def test_tables_found(self):
        # A parser that finds nothing would pass every other test.
        self.assertGreater(len(module_directives()), 30)
        keys, flags = esid_settings()
        self.assertGreater(len(keys), 15)
        self.assertGreater(len(flags), 10)
        defaults = [value for _, value in esid_setting_rows().values() if value]
        self.assertGreater(len(defaults), 8)

    def test_every_directive_documented(self):
        code = module_directives()
        missing = sorted("%s (%s)" % (n, f) for n, f in code.items()
                         if n not in self.doc_directives)
        self.assertEqual(missing, [], "directives without a row in docs/reference.md")

    def test_every_documented_directive_exists(self):
        gone = sorted(set(self.doc_directives) - set(module_directives()))
        self.assertEqual(gone, [], "rows of docs/reference.md naming no directive of the code")

    def test_every_setting_documented(self):
        keys, flags = esid_settings()
        self.assertEqual(sorted(keys - set(self.doc_settings)), [],
                         "esid settings (kSettings) without a row in docs/reference.md")
        self.assertEqual(sorted(flags - self.doc_flags), [],
                         "esid flags without a row in docs/reference.md")

    def test_every_setting_documented_with_its_default(self):
        wrong = sorted("%s: the table says %s, the page %s" % (key, value, self.doc_settings[key])
                       for key, (_, value) in esid_setting_rows().items()
                       if value and key in self.doc_settings
                       and "`%s`" % value != self.doc_settings[key])
        self.assertEqual(wrong, [], "esid defaults that docs/reference.md does not give")

    def test_every_documented_setting_exists(self):
        keys, flags = esid_settings()
        self.assertEqual(sorted(set(self.doc_settings) - keys), [],
                         "settings in docs/reference.md that esid no longer reads")
        self.assertEqual(sorted(self.doc_flags - flags), [],
                         "flags in docs/reference.md that esid no longer takes")


# -------------------------------------------------------------------- pages

README_MOST_LINES = 250
LINKED = ["README.md", "docs/*.md", "bench/README.md", "bench/history/*.md",
          "tests/README.md", "tests/integration/README.md", "proto/README.md"]


def slugs(path):
    """The anchors GitHub gives a page's headings."""
    out, fence = set(), False
    for line in read_abs(path).splitlines():
        if line.startswith("```"):
            fence = not fence
        m = re.match(r"#{1,6} (.*)", line)
        if m and not fence:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


class Pages(unittest.TestCase):
    def test_readme_short(self):
        n = len(read("README.md").splitlines())
        self.assertLessEqual(n, README_MOST_LINES, "README.md has %d lines: move "
                             "what is not the overview to docs/" % n)

    def test_readme_lists_every_page(self):
        readme = read("README.md")
        unlisted = [os.path.relpath(p, ROOT)
                    for p in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
                    if "(%s)" % os.path.relpath(p, ROOT) not in readme]
        self.assertEqual(unlisted, [], "docs/ pages the README's table does not link")

    def test_links_resolve(self):
        broken = []
        for pattern in LINKED:
            for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
                for link in re.findall(r"\]\(([^)\s]+)\)", read_abs(path)):
                    if re.match(r"[a-z]+:", link):
                        continue
                    target, _, anchor = link.partition("#")
                    target = os.path.normpath(os.path.join(os.path.dirname(path), target)) \
                        if target else path
                    where = "%s: %s" % (os.path.relpath(path, ROOT), link)
                    if not os.path.exists(target):
                        broken.append(where)
                    elif anchor and target.endswith(".md") and anchor not in slugs(target):
                        broken.append(where + " (no such heading)")
        self.assertEqual(broken, [], "links to files or headings that do not exist")


# ------------------------------------------------------------- troubleshoot

LEVELS = "EMERG|ALERT|CRIT|ERR|WARN"


def c_string_literals(text):
    """The concatenated text of a run of adjacent C string literals."""
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', text))


def scan(text, i, depth):
    """From text[i], the index where depth (parentheses, strings skipped)
    reaches 0 at a ")", or at a "," when it starts at 0."""
    start_depth = depth
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0 and start_depth:
                return i
        elif c == "," and depth == 0 and not start_depth:
            return i
        i += 1
    return i


def c_format(args):
    """The format argument of a logging call: its literals joined, any macro
    between them (ngx_socket_n, NGINX_VER) read as a conversion."""
    start = args.find('"')
    if start < 0:
        return ""
    expr = args[start:scan(args, start, 0)]
    # a macro just before the first literal is part of the format too
    lead = re.search(r"(\w+)\s*$", args[:start])
    parts = ["%s"] if lead and not lead.group(1).startswith("NGX_LOG") else []
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"|(\w+)', expr):
        parts.append(m.group(1) if m.group(1) is not None else "%s")
    return "".join(parts)


def call_args(text, start):
    """The text from `start` (just after an opening parenthesis) to its
    matching closing parenthesis, strings respected."""
    return text[start:scan(text, start, 1)]


def template(fmt, printf):
    """A format as it reads (… for each conversion) and as a pattern: its
    fixed text, any text for each conversion."""
    conversion = r"%[-+ #0-9.*]*[uxX]?[a-zA-Z]" if printf else r"\{[^}]*\}"
    fixed = re.split(conversion, fmt)
    fixed = [normalise(p.replace('\\"', '"').replace("\\\\", "\\").replace("\\n", " "))
             for p in fixed]
    return "…".join(fixed), ".*?".join(re.escape(p) for p in fixed)


def logged_messages():
    """(where, (text, pattern)) of every warn-or-worse line of the code: its fixed
    text in order, any text where it fills something in."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "nginx-connector", "*.c"))):
        text = read_abs(path)
        for m in re.finditer(r"\bngx_(?:conf_)?log_error\s*\(", text):
            args = call_args(text, m.end())
            if not re.match(r"\s*NGX_LOG_(%s)\b" % LEVELS, args):
                continue
            line = text.count("\n", 0, m.start()) + 1
            out.append(("%s:%d" % (os.path.relpath(path, ROOT), line),
                        template(c_format(args), printf=True)))
    for path in sorted(glob.glob(os.path.join(ROOT, "daemon", "**", "*.cc"), recursive=True)):
        if path.endswith("-test.cc"):
            continue
        text = read_abs(path)
        for m in re.finditer(r"\bspdlog::(?:warn|error|critical)\s*\(", text):
            args = call_args(text, m.end())
            # The format is the leading run of literals; a message built
            # elsewhere ("{}", what) is documented where it is built.
            lead = re.match(r'\s*((?:"(?:[^"\\]|\\.)*"\s*)+)', args)
            if not lead:
                continue
            fmt = c_string_literals(lead.group(1))
            if not re.sub(r"\{[^}]*\}", "", fmt).strip():
                continue  # "{}": the message is built elsewhere
            line = text.count("\n", 0, m.start()) + 1
            out.append(("%s:%d" % (os.path.relpath(path, ROOT), line),
                        template(fmt, printf=False)))
    return out


def normalise(text):
    return re.sub(r"\s+", " ", text)


class Troubleshoot(unittest.TestCase):
    def test_messages_found(self):
        self.assertGreater(len(logged_messages()), 100)

    def test_every_message_documented(self):
        lines = [normalise(l) for l in read("docs/troubleshoot.md").splitlines()]
        missing = ["%s: %s" % (where, shown) for where, (shown, pattern) in logged_messages()
                   if not any(re.search(pattern, l) for l in lines)]
        self.assertEqual(missing, [], "lines the code logs that docs/troubleshoot.md "
                         "does not have (their fixed text, in order, on one line)")


if __name__ == "__main__":
    unittest.main()
