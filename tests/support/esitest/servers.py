"""Config templates, and starting a server that must answer before it is
used: NGINX with a config of its own, or anything on a port or a socket."""

import os
import re
import signal

from .net import free_port, tcp_port_answers, unix_socket_answers
from .process import group_members, poll, read_text

NGINX = os.environ.get("ESI_NGINX", "/usr/sbin/nginx")


def fill(template, values, strict=True):
    """`template` with every @@NAME@@ replaced by str(values[NAME]), in the
    order of `values` (so a value may hold a later @@NAME@@).  Strict: no
    @@NAME@@ may be left over."""
    for key, value in values.items():
        template = template.replace("@@%s@@" % key, str(value))
    leftover = re.search(r"@@[A-Z_]+@@", template)
    assert not strict or leftover is None, leftover.group(0)
    return template


class DidNotStart(Exception):
    """A server that did not come up: `proc` (stopped) and `log`, what it
    or its error log said."""

    def __init__(self, proc, log):
        super().__init__("%s did not start" % proc.name)
        self.proc = proc
        self.log = log


def start_on_port(start, attempts=3, retry=lambda proc: True):
    """start(port) -> Process, on a free port, until it answers there
    (bounded).  A try that does not answer is stopped, and another port
    tried (up to `attempts`) when retry(proc) says so: someone may have
    taken the port in between.  Returns (process, port); raises
    DidNotStart with its stderr."""
    for attempt in range(attempts):
        port = free_port()
        proc = start(port)
        up = poll(lambda: not proc.alive() or tcp_port_answers(port))
        if proc.alive() and up:
            return proc, port
        proc.stop()
        if attempt + 1 < attempts and retry(proc):
            continue
        raise DidNotStart(proc, proc.stderr())


def start_on_socket(spawn, name, argv, path):
    """spawn(name, argv) -> Process, until it answers on the Unix socket
    at `path` (bounded).  Returns the process; raises DidNotStart with its
    stderr (the process left running, for its owner to stop)."""
    proc = spawn(name, argv)
    ready = poll(lambda: not proc.alive() or unix_socket_answers(path))
    if not proc.alive() or not ready:
        raise DidNotStart(proc, proc.stderr())
    return proc


def quit_nginx(proc):
    """How Process.stop() ends an NGINX (its ask_to_stop): SIGQUIT to the
    master, SIGTERM to the rest of its group, the workers and cache
    processes, which then close their connections and exit at once, as
    under SIGTERM.

    Not SIGTERM to the master: a master told to terminate SIGKILLs the
    workers that have not exited about 3 s later (ngx_master_process_cycle:
    its timer doubles from 50 ms, SIGKILL once `delay > 1000`) and logs
    `[alert] ... exited on signal 9`, and a worker's exit takes longer
    than that where it is sanitized (freeing every pool allocation,
    LeakSanitizer's scan of its heap) on a busy machine.  A master told to
    quit waits for its processes however long they take, and respawns
    none; the SIGTERMs reach the workers after the SIGQUIT is pending at
    the master.  A new master of a binary upgrade (same group, "master
    process" too) is told to quit like the first."""
    _signal(proc.pid, signal.SIGQUIT)
    for pid in group_members(proc.pid):
        if pid != proc.pid:
            master = "master process" in read_text("/proc/%d/cmdline" % pid)
            _signal(pid, signal.SIGQUIT if master else signal.SIGTERM)


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def start_nginx(spawn, name, prefix, conf, env=None, binary=NGINX):
    """An nginx in the foreground with `prefix` as its prefix (-p) and
    PREFIX/error.log as its error log (-e), on a free port: conf(port) is
    the text of PREFIX/nginx.conf.  spawn(name, argv, env) -> Process.
    Another port is tried when the error log says "Address already in
    use".  Returns (process, port); raises DidNotStart with the error
    log."""
    path = os.path.join(prefix, "nginx.conf")
    errors = os.path.join(prefix, "error.log")

    def start(port):
        with open(path, "w") as f:
            f.write(conf(port))
        proc = spawn(name, [binary, "-p", prefix + "/", "-e", errors,
                            "-c", path, "-g", "daemon off;"], env)
        proc.ask_to_stop = quit_nginx
        proc.stop_request = "SIGQUIT (its workers SIGTERM)"
        return proc

    try:
        return start_on_port(
            start, retry=lambda proc: "Address already in use" in
            read_text(errors))
    except DidNotStart as e:
        raise DidNotStart(e.proc, read_text(errors)) from None
