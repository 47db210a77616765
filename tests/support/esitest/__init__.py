"""Test support shared by the integration tests (tests/integration/harness.py)
and the benchmarks (bench/): ports, bounded waits, child processes, config
templates, and starting NGINX or any server that must answer before it is
used.  Standard library only.

Neither side is a package of its own, so each puts this directory
(tests/support) on sys.path once: harness.py for the tests, bench/running.py
for the benchmarks.
"""

from .bounds import esid_bound_kib, worker_bound_kib
from .net import free_port, tcp_port_answers, unix_socket_answers
from .process import (START_BOUND, STOP_BOUND, Process, descendants,
                      group_members, poll, read_text, worker_pids)
from .resources import (SANITIZER_REPORT, has_tcp_connections, held_socket,
                        memory_kib, nginx_fd_counts, open_fds, sanitized,
                        sanitizer_env, tcp_states)
from .slow_clients import SlowClient, SlowClients
from .servers import (NGINX, DidNotStart, fill, quit_nginx, start_nginx,
                      start_on_port, start_on_socket)

__all__ = [
    "DidNotStart", "NGINX", "Process", "SANITIZER_REPORT", "START_BOUND",
    "STOP_BOUND", "SlowClient", "SlowClients", "descendants", "esid_bound_kib", "fill",
    "free_port", "group_members", "has_tcp_connections", "held_socket",
    "memory_kib", "nginx_fd_counts", "open_fds", "poll", "quit_nginx",
    "read_text", "sanitized", "sanitizer_env", "start_nginx", "start_on_port",
    "start_on_socket", "tcp_port_answers", "tcp_states",
    "unix_socket_answers", "worker_bound_kib", "worker_pids",
]
