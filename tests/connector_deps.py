"""The connector's files call each other one way (ctest: connector.deps).

Counted from the module's built objects with nm: a function defined
(T) in one ngx_http_esi_*.o and undefined (U) in another crosses from the
second file to the first.  The NGINX-free codecs (esi_wire.c, esi_tags.c,
esi_surrogate.c, esi_inflate.c) are leaves every file may call, so they are
not counted.

The gate fails on any circle (two files calling each other, or a longer
round: the files must call each other one way) and on more than
MAX_CROSSING function names crossing files.  Issue 34 aims at 40 names;
MAX_CROSSING is where the code is, lowered as names go, so that none comes
back.

    python3 tests/connector_deps.py OBJDIR            # the check
    python3 tests/connector_deps.py OBJDIR --report   # every crossing name

OBJDIR is where NGINX's build put the module's objects,
BUILD/nginx-connector/nginx/objs/addon/nginx-connector.
"""

import glob
import os
import subprocess
import sys

MAX_CROSSING = 70


def symbols(path):
    """The functions an object defines and the names it leaves undefined."""
    out = subprocess.run(["nm", path], check=True, capture_output=True,
                         text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] == "T":
            defined.add(fields[2])
        elif len(fields) == 2 and fields[0] == "U":
            undefined.add(fields[1])
    return defined, undefined


def graph(objdir):
    """{(caller, callee): sorted names}, by file name without .o."""
    objects = sorted(glob.glob(os.path.join(objdir, "ngx_http_esi*.o")))
    if not objects:
        sys.exit("connector_deps: no ngx_http_esi*.o in %s" % objdir)
    table = {os.path.basename(p)[:-2]: symbols(p) for p in objects}
    owner = {}
    for name, (defined, _) in table.items():
        for sym in defined:
            owner[sym] = name
    edges = {}
    for caller, (_, undefined) in table.items():
        for sym in undefined:
            callee = owner.get(sym)
            if callee and callee != caller:
                edges.setdefault((caller, callee), []).append(sym)
    return {k: sorted(v) for k, v in edges.items()}


def circle(edges):
    """A round of files that call each other, or None."""
    callees = {}
    for caller, callee in edges:
        callees.setdefault(caller, set()).add(callee)
    state, path = {}, []

    def visit(f):
        state[f] = "open"
        path.append(f)
        for g in sorted(callees.get(f, ())):
            if state.get(g) == "open":
                return path[path.index(g):] + [g]
            if g not in state:
                found = visit(g)
                if found:
                    return found
        path.pop()
        state[f] = "done"
        return None

    for f in sorted(callees):
        if f not in state:
            found = visit(f)
            if found:
                return found
    return None


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit(__doc__)
    edges = graph(args[0])
    crossing = sorted({s for names in edges.values() for s in names})
    mutual = sorted((a, b) for (a, b) in edges if a < b and (b, a) in edges)

    if "--report" in sys.argv:
        for (caller, callee), names in sorted(edges.items()):
            print("%s -> %s: %s" % (caller, callee, " ".join(names)))
    for a, b in mutual:
        print("mutual: %s <-> %s (%s | %s)"
              % (a, b, " ".join(edges[(a, b)]), " ".join(edges[(b, a)])))
    round_ = circle(edges)
    if round_:
        print("circle: %s" % " -> ".join(round_))
    print("%d names cross files over %d directed pairs, %d mutual pairs"
          % (len(crossing), len(edges), len(mutual)))

    if round_ or len(crossing) > MAX_CROSSING:
        print("FAIL: the gate allows no circle and at most %d names"
              % MAX_CROSSING)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
