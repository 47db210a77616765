"""What a process holds, from /proc: its open fds, its TCP connections and
its memory (tests/integration/test_resources.py, test_slow_clients.py and
the soak and slow-client benchmarks read them the same way)."""

import ctypes
import os
import re
import socket

from .process import descendants, read_text, worker_pids

TCP_LISTEN = "0A"
TCP_ESTABLISHED = "01"
SYS_PIDFD_GETFD = 438       # the same number on every architecture
LIBC = ctypes.CDLL(None, use_errno=True)


def fds(pid):
    """fd number -> what it is (readlink of /proc/PID/fd/N); empty once
    `pid` is gone."""
    fd_dir = "/proc/%d/fd" % pid
    targets = {}
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return targets
    for name in names:
        try:
            targets[int(name)] = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            pass  # closed meanwhile
    return targets


def open_fds(pid):
    """What each open fd of `pid` is; empty once it is gone."""
    return list(fds(pid).values())


def tcp_states():
    """inode -> state (hex, /proc/net/tcp) of every TCP socket here."""
    states = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in read_text(name).splitlines()[1:]:
            fields = line.split()
            states[fields[9]] = fields[3]
    return states


def held_socket(pids, port, peer_port):
    """A copy (pidfd_getfd) of the descriptor one of `pids` holds for the
    established connection from 127.0.0.1:peer_port to 127.0.0.1:port, as
    a socket; None if none holds it.  OSError if the kernel refuses the
    copy."""
    ends = ["0100007F:%04X" % port, "0100007F:%04X" % peer_port]
    # an earlier connection from the same port may linger in TIME_WAIT,
    # with no inode
    inodes = {"socket:[%s]" % fields[9]
              for fields in map(str.split,
                                read_text("/proc/net/tcp").splitlines()[1:])
              if fields[1:3] == ends and fields[3] == TCP_ESTABLISHED}
    for pid in pids:
        for fd, target in fds(pid).items():
            if target not in inodes:
                continue
            pidfd = os.pidfd_open(pid)
            try:
                copy = LIBC.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
            finally:
                os.close(pidfd)
            if copy < 0:
                errno = ctypes.get_errno()
                raise OSError(errno, "pidfd_getfd: " + os.strerror(errno))
            return socket.socket(fileno=copy)
    return None


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


# What a sanitizer's report says, wherever it went.
SANITIZER_REPORT = re.compile(
    r"ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:")


def sanitizer_env(log_path, suppressions):
    """os.environ with ASan's (LSan's with it) and UBSan's reports going
    to log_path.PID, and each tool's suppressions from
    suppressions/TOOL.supp where there is one."""
    env = dict(os.environ)
    log = "log_path=" + log_path
    for tool in ("asan", "lsan", "ubsan"):
        name = tool.upper() + "_OPTIONS"
        options = [env.get(name), log if tool != "lsan" else None]
        supp = os.path.join(suppressions, tool + ".supp")
        if os.path.exists(supp):
            options += ["suppressions=" + supp, "print_suppressions=0"]
        env[name] = ":".join(filter(None, options))
    return env


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
