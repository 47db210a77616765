"""Child processes, bounded waits, and what /proc says about them."""

import os
import signal
import subprocess
import time

# Hang guards only: nothing asserts on elapsed time, and a process that
# is merely slow (a sanitized build on a machine busy with other work)
# must never reach them.  A process's exit under ASan includes
# LeakSanitizer's scan of its heap, seconds on a loaded 2-core machine.
START_BOUND = 30.0
STOP_BOUND = 60.0


def poll(condition, bound=START_BOUND, interval=0.02):
    """Call `condition` until it returns something true or `bound` passes;
    returns its last value."""
    deadline = time.monotonic() + bound
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def read_text(path):
    """The file's text (undecodable bytes replaced), or "" if unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class Process:
    """A child in its own process group (a session of its own), stopped with
    its whole group; its stdout and stderr go to NAME.stdout and
    NAME.stderr in `logdir`.

    `killed_by_test` is set when its owner SIGKILLs it (kill(), or signal()
    with SIGKILL): the integration harness then asks nothing of its exit
    status.  `sigkilled_by_stop` is set when stop() had to SIGKILL it
    because it did not end within STOP_BOUND of being asked to, and
    `ran_until_stop` says whether it was still running when stop() was
    first called.

    `ask_to_stop(process)` is how stop() asks it to end: SIGTERM to its
    group (terminate_group), unless its starter says otherwise (NGINX:
    servers.quit_nginx); `stop_request` names it in messages."""

    def __init__(self, name, argv, logdir, env=None):
        self.name = name
        self.argv = argv
        self.stdout_path = os.path.join(logdir, name + ".stdout")
        self.stderr_path = os.path.join(logdir, name + ".stderr")
        with open(self.stdout_path, "ab") as out, \
                open(self.stderr_path, "ab") as err:
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, env=env)
        self.pid = self.popen.pid
        self.killed_by_test = False
        self.sigkilled_by_stop = False
        self.ran_until_stop = None
        self.ask_to_stop = terminate_group
        self.stop_request = "SIGTERM"

    def alive(self):
        return self.popen.poll() is None

    def signal(self, sig):
        if self.alive():
            if sig == signal.SIGKILL:
                self.killed_by_test = True
            os.kill(self.pid, sig)

    def stop(self):
        """ask_to_stop (SIGTERM; after a SIGCONT, should it be stopped),
        then SIGKILL after STOP_BOUND, a hang guard; then SIGKILL to
        whatever of its group outlived it (a varnish child, a worker).
        Returns the exit code."""
        if self.ran_until_stop is None:
            self.ran_until_stop = self.alive()
        if self.alive():
            self._signal_group(signal.SIGCONT)
            self.ask_to_stop(self)
            try:
                self.popen.wait(STOP_BOUND)
            except subprocess.TimeoutExpired:
                self.sigkilled_by_stop = True
                self._signal_group(signal.SIGKILL)
                self.popen.wait(STOP_BOUND)
        self._signal_group(signal.SIGKILL)
        return self.popen.returncode

    def kill(self):
        self.killed_by_test = True
        self._signal_group(signal.SIGKILL)
        self.popen.wait(STOP_BOUND)

    def unclean_exit(self):
        """Why this process's end was not a clean exit, or None: a status
        other than 0 that no SIGKILL of its owner's explains, a request to
        stop not obeyed within STOP_BOUND, or an exit before anyone stopped
        it."""
        if self.killed_by_test:
            return None
        code = self.popen.poll()
        if self.sigkilled_by_stop:
            return "did not exit within %ss of %s (SIGKILLed)" % (
                STOP_BOUND, self.stop_request)
        if code == 0:
            return None
        if code is None:
            return "is still running"
        status = ("killed by %s" % signal.Signals(-code).name if code < 0
                  else "exit status %d" % code)
        when = ("after " + self.stop_request if self.ran_until_stop
                else "before it was stopped")
        return "ended %s: %s" % (when, status)

    def _signal_group(self, sig):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stderr(self, last=None):
        """Its stderr so far; with `last`, only its last `last` chars."""
        text = read_text(self.stderr_path)
        return text if last is None else text[-last:]


def terminate_group(proc):
    """Process.stop()'s request by default: SIGTERM to its whole group."""
    proc._signal_group(signal.SIGTERM)


def _stats():
    """(pid, [state, ppid, pgrp, ...]) of every process: the fields of
    /proc/PID/stat after its command's name."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        yield int(entry), stat.rsplit(")", 1)[1].split()


def group_members(pgid):
    """Pids of the processes of process group `pgid`, from /proc."""
    return [pid for pid, fields in _stats() if int(fields[2]) == pgid]


def _parents():
    """{pid: parent pid} of every process, from /proc."""
    return {pid: int(fields[1]) for pid, fields in _stats()}


def descendants(roots):
    """Pids of `roots` and all their descendants, from /proc."""
    children = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def worker_pids(master):
    """Pids of an nginx master's worker processes, sorted."""
    return sorted(pid for pid, ppid in _parents().items()
                  if ppid == master and "worker process" in
                  read_text("/proc/%d/cmdline" % pid))
