"""What a process holds, from /proc: its open fds, its TCP connections and
its memory (tests/integration/test_resources.py, test_slow_clients.py and
the soak and slow-client benchmarks read them the same way)."""

import os
import re

from .process import descendants, read_text, worker_pids

TCP_LISTEN = "0A"


def open_fds(pid):
    """What each open fd of `pid` is (readlink of /proc/PID/fd/N); empty
    once it is gone."""
    fd_dir = "/proc/%d/fd" % pid
    targets = []
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return targets
    for name in names:
        try:
            targets.append(os.readlink(os.path.join(fd_dir, name)))
        except OSError:
            pass  # closed meanwhile
    return targets


def tcp_states():
    """inode -> state (hex, /proc/net/tcp) of every TCP socket here."""
    states = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in read_text(name).splitlines()[1:]:
            fields = line.split()
            states[fields[9]] = fields[3]
    return states


def has_tcp_connections(pid, states):
    """True while `pid` holds a TCP socket that is not listening."""
    for target in open_fds(pid):
        m = re.match(r"socket:\[(\d+)\]$", target)
        if m and states.get(m.group(1), TCP_LISTEN) != TCP_LISTEN:
            return True
    return False


def memory_kib(pid):
    """VmRSS, RssAnon and RssShmem of `pid`, in KiB (0 once it is gone)."""
    values = dict.fromkeys(("VmRSS", "RssAnon", "RssShmem"), 0)
    for line in read_text("/proc/%d/status" % pid).splitlines():
        name, _, rest = line.partition(":")
        if name in values:
            values[name] = int(rest.split()[0])
    return values


def sanitized(path):
    """True for a binary built with AddressSanitizer (tests/run.sh's second
    suite), whose memory says nothing about the program's own."""
    try:
        with open(path, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


def nginx_fd_counts(master, esid=None):
    """Open fds of an nginx master, of each of its workers (sorted) and of
    esid (when given); less the channels NGINX keeps to its other
    processes (two in the master, one in each worker, for each), which
    change when the cache loader exits, a minute after NGINX started."""
    others = len(descendants([master])) - 1
    counts = {"master": len(open_fds(master)) - 2 * others,
              "workers": sorted(len(open_fds(w)) - others
                                for w in worker_pids(master))}
    if esid is not None:
        counts["esid"] = len(open_fds(esid))
    return counts
