
/*
 * Copyright (C) The ESI project authors
 *
 * The worker's connection to esid: connect, handshake, the
 * shared mappings, reconnect, reading esid's ring and dispatching its
 * answers, and what the worker posts to esid outside any stream.
 */


#include "ngx_http_esi.h"


static void ngx_http_esi_connect_denied(ngx_http_esi_daemon_t *d,
    ngx_err_t err);
static ngx_int_t ngx_http_esi_daemon_peer_trusted(ngx_http_esi_daemon_t *d,
    ngx_socket_t s);
static ngx_str_t ngx_http_esi_id_name(u_char *buf, size_t size, ngx_uint_t id,
    ngx_uint_t group);
static void ngx_http_esi_reconnect_handler(ngx_event_t *ev);
static void ngx_http_esi_hello_handler(ngx_event_t *wev);
static void ngx_http_esi_socket_handler(ngx_event_t *rev);
static ngx_int_t ngx_http_esi_read_welcome(ngx_http_esi_daemon_t *d);
static ngx_int_t ngx_http_esi_attach(ngx_http_esi_daemon_t *d);
static ngx_int_t ngx_http_esi_map_arena(ngx_http_esi_daemon_t *d, ngx_fd_t fd,
    uint64_t size);
static ngx_int_t ngx_http_esi_map_pins(ngx_http_esi_daemon_t *d, ngx_fd_t fd,
    uint32_t ring_size);
static ngx_http_esi_mapping_t *ngx_http_esi_map(ngx_http_esi_daemon_t *d,
    ngx_fd_t fd, size_t size, off_t offset, int prot, const char *what);
static void ngx_http_esi_close(ngx_http_esi_daemon_t *d);
static void ngx_http_esi_notify_handler(ngx_event_t *rev);
static ngx_int_t ngx_http_esi_response(ngx_http_esi_daemon_t *d,
    const uint8_t *p, uint32_t len);
static ngx_rbtree_node_t *ngx_http_esi_daemon_find(ngx_rbtree_t *tree,
    uint32_t id);
static ngx_int_t ngx_http_esi_flush_posted(ngx_http_esi_daemon_t *d);
static void ngx_http_esi_daemon_kick_handler(ngx_event_t *ev);
static void ngx_http_esi_daemon_report_handler(ngx_event_t *ev);
static void ngx_http_esi_free_posted(ngx_http_esi_daemon_t *d);


ngx_http_esi_daemon_t  ngx_http_esi_daemon;


ngx_int_t
ngx_http_esi_daemon_init_process(ngx_cycle_t *cycle)
{
    ngx_http_esi_daemon_t     *d;
    ngx_http_conf_ctx_t       *hctx;
    ngx_http_esi_main_conf_t  *emcf;

    if (ngx_process != NGX_PROCESS_WORKER
        && ngx_process != NGX_PROCESS_SINGLE)
    {
        return NGX_OK;
    }

    hctx = (ngx_http_conf_ctx_t *) ngx_get_conf(cycle->conf_ctx,
                                                ngx_http_module);
    if (hctx == NULL) {
        return NGX_OK;
    }

    emcf = hctx->main_conf[ngx_http_esi_module.ctx_index];

    if (!emcf->used) {
        return NGX_OK;
    }

    d = &ngx_http_esi_daemon;

    d->conf = emcf;
    d->purge = hctx->main_conf[ngx_http_esi_purge_module.ctx_index];
    d->log = cycle->log;
    d->daemon_fd = -1;
    d->backoff = NGX_HTTP_ESI_BACKOFF_MIN;

    ngx_queue_init(&d->posted);

    d->reconnect.handler = ngx_http_esi_reconnect_handler;
    d->reconnect.log = cycle->log;
    d->reconnect.data = d;
    d->reconnect.cancelable = 1;

    d->kick_event.handler = ngx_http_esi_daemon_kick_handler;
    d->kick_event.log = cycle->log;
    d->kick_event.data = d;

    d->report_timer.handler = ngx_http_esi_daemon_report_handler;
    d->report_timer.log = cycle->log;
    d->report_timer.data = d;
    d->report_timer.cancelable = 1;

    return NGX_OK;
}


void
ngx_http_esi_daemon_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    if (d->conf == NULL) {
        return;
    }

    ngx_http_esi_close(d);

    if (d->reconnect.timer_set) {
        ngx_del_timer(&d->reconnect);
    }

    if (d->report_timer.timer_set) {
        ngx_del_timer(&d->report_timer);
    }

    if (d->kick_event.posted) {
        ngx_delete_posted_event(&d->kick_event);
    }
}


void
ngx_http_esi_daemon_connect(ngx_http_esi_daemon_t *d)
{
    ngx_err_t          err;
    ngx_uint_t         level;
    ngx_socket_t       s;
    ngx_connection_t  *c;
    esi_wire_out_t     hello;
    esi_wire_builder_t  b;

    d->pool = ngx_create_pool(1024, d->log);
    if (d->pool == NULL) {
        goto failed;
    }

    d->cancels = ngx_array_create(d->pool, 16, sizeof(uint32_t));
    if (d->cancels == NULL) {
        goto failed;
    }

    s = ngx_socket(AF_UNIX, SOCK_STREAM, 0);

    if (s == (ngx_socket_t) -1) {
        ngx_log_error(NGX_LOG_ALERT, d->log, ngx_socket_errno,
                      ngx_socket_n " failed");
        goto failed;
    }

    c = ngx_get_connection(s, d->log);

    if (c == NULL) {
        ngx_close_socket(s);
        goto failed;
    }

    d->conn = c;

    if (ngx_nonblocking(s) == -1) {
        ngx_log_error(NGX_LOG_ALERT, d->log, ngx_socket_errno,
                      ngx_nonblocking_n " failed");
        goto failed;
    }

    if (connect(s, d->conf->url.addrs[0].sockaddr,
                d->conf->url.addrs[0].socklen)
        == -1)
    {
        /* AF_UNIX connects at once: EAGAIN means a full backlog */

        err = ngx_socket_errno;
        level = (err == d->last_err) ? NGX_LOG_DEBUG : NGX_LOG_WARN;
        d->last_err = err;

        if ((err == NGX_EACCES || err == NGX_EPERM)
            && level != NGX_LOG_DEBUG)
        {
            ngx_http_esi_connect_denied(d, err);

        } else {
            ngx_log_error(level, d->log, err,
                          "esi: connect() to %V failed", &d->conf->daemon);
        }

        goto failed;
    }

    if (ngx_http_esi_daemon_peer_trusted(d, s) != NGX_OK) {
        goto failed;
    }

    esi_wire_builder_init(&b, d->hello, sizeof(d->hello));

    if (esi_wire_root(&b, ESI_WIRE_HELLO_DATA_WORDS, ESI_WIRE_HELLO_POINTERS,
                      &hello)
        != 0)
    {
        goto failed;
    }

    esi_wire_set_u32(&hello, ESI_WIRE_HELLO_VERSION_OFFSET,
                     ESI_WIRE_PROTOCOL_VERSION);
    esi_wire_set_u16(&hello, ESI_WIRE_HELLO_WHICH_OFFSET,
                     ESI_WIRE_HELLO_ATTACH_WHICH);

    d->hello_sent = 0;
    d->welcome_len = 0;
    d->nfds = 0;
    d->next_id = 1;
    d->state = NGX_HTTP_ESI_CONNECTING;

    c->read->handler = ngx_http_esi_socket_handler;
    c->write->handler = ngx_http_esi_hello_handler;
    c->read->log = d->log;
    c->write->log = d->log;
    c->read->cancelable = 1;
    c->recv = ngx_recv;
    c->send = ngx_send;

    if (esi_wire_finish(&b) != sizeof(d->hello)
        || ngx_handle_read_event(c->read, 0) != NGX_OK)
    {
        goto failed;
    }

    ngx_add_timer(c->read, d->conf->timeout);

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, d->log, 0,
                   "esi: connected to %V", &d->conf->daemon);

    ngx_http_esi_hello_handler(c->write);

    return;

failed:

    ngx_http_esi_daemon_drop(d, NGX_LOG_DEBUG, NULL);
}


/*
 * The worker may not connect to esid's socket: every page passes through
 * unprocessed until an operator acts, so say what to do, once for each
 * time the connection is lost (d->last_err).  The names are looked up
 * here only, when the error is new.
 */

static void
ngx_http_esi_connect_denied(ngx_http_esi_daemon_t *d, ngx_err_t err)
{
    u_char               mode[4];
    u_char               user[64], group[64], owner[64], owner_group[64];
    uid_t                euid;
    gid_t                egid;
    ngx_str_t            worker_user, worker_group, sock_user, sock_group;
    struct stat          sb;
    struct sockaddr_un  *saun;

    saun = (struct sockaddr_un *) d->conf->url.addrs[0].sockaddr;

    euid = geteuid();
    egid = getegid();
    worker_user = ngx_http_esi_id_name(user, sizeof(user), euid, 0);
    worker_group = ngx_http_esi_id_name(group, sizeof(group), egid, 1);

    if (stat(saun->sun_path, &sb) == -1) {

        if (ngx_errno != NGX_EACCES) {
            ngx_log_error(NGX_LOG_ERR, d->log, err,
                          "esi: connect() to %V failed", &d->conf->daemon);
            return;
        }

        ngx_log_error(NGX_LOG_ERR, d->log, err,
                      "esi: connect() to %V failed: this worker, user %V "
                      "(uid %ui) group %V (gid %ui), cannot reach the "
                      "socket: a directory above it is not searchable "
                      "by the worker's user or group",
                      &d->conf->daemon, &worker_user, (ngx_uint_t) euid,
                      &worker_group, (ngx_uint_t) egid);
        return;
    }

    sock_user = ngx_http_esi_id_name(owner, sizeof(owner), sb.st_uid, 0);
    sock_group = ngx_http_esi_id_name(owner_group, sizeof(owner_group),
                                      sb.st_gid, 1);

    mode[0] = (u_char) ('0' + ((sb.st_mode >> 9) & 7));
    mode[1] = (u_char) ('0' + ((sb.st_mode >> 6) & 7));
    mode[2] = (u_char) ('0' + ((sb.st_mode >> 3) & 7));
    mode[3] = (u_char) ('0' + (sb.st_mode & 7));

    ngx_log_error(NGX_LOG_ERR, d->log, err,
                  "esi: connect() to %V failed: the socket is owned by "
                  "%V:%V with mode %*s, and this worker runs as user %V "
                  "(uid %ui) group %V (gid %ui); run esid with "
                  "--socket-group %V (under systemd: SocketGroup=%V in "
                  "esid.socket), or set nginx's \"user\" directive to a "
                  "user in group %V",
                  &d->conf->daemon, &sock_user, &sock_group,
                  (size_t) 4, mode, &worker_user, (ngx_uint_t) euid,
                  &worker_group, (ngx_uint_t) egid, &worker_group,
                  &worker_group, &sock_group);
}


/*
 * Whatever listens at esi_daemon's path gets every page and says which
 * cache files a purge removes, so before anything is sent to it, it must
 * be esid: a process running as root, as the owner of the socket's
 * directory (the socket file's owner is whoever bound it), or as
 * esi_daemon_user.  SO_PEERCRED names the process that called listen():
 * under socket activation that is systemd, root.  A refusal is logged as
 * a failed connect() is, once for each time the connection is lost
 * (d->last_err), and the pages pass through as with esid down.
 */

#if !(NGX_LINUX)
#error "ngx_http_esi_module checks esid's credentials with SO_PEERCRED (Linux)"
#endif

static ngx_int_t
ngx_http_esi_daemon_peer_trusted(ngx_http_esi_daemon_t *d, ngx_socket_t s)
{
    u_char               *slash;
    u_char                dir[NGX_UNIX_ADDRSTRLEN];
    u_char                peer[64], owner[64], allowed[64], owner_text[128];
    ngx_err_t             err;
    ngx_str_t             peer_name, owner_user, owner_name, allowed_name;
    socklen_t             len;
    struct stat           sb;
    struct ucred          cred;
    struct sockaddr_un   *saun;

    len = sizeof(struct ucred);

    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) == -1) {
        ngx_log_error(NGX_LOG_ALERT, d->log, ngx_socket_errno,
                      "esi: getsockopt(SO_PEERCRED) on %V failed",
                      &d->conf->daemon);
        return NGX_ERROR;
    }

    if (cred.uid == 0 || cred.uid == d->conf->daemon_user) {
        return NGX_OK;
    }

    saun = (struct sockaddr_un *) d->conf->url.addrs[0].sockaddr;

    ngx_cpystrn(dir, (u_char *) saun->sun_path, sizeof(dir));
    slash = (u_char *) strrchr((char *) dir, '/');

    if (slash == NULL) {
        ngx_cpystrn(dir, (u_char *) ".", sizeof(dir));

    } else {
        slash[slash == dir ? 1 : 0] = '\0';
    }

    err = 0;

    if (stat((char *) dir, &sb) == -1) {
        err = ngx_errno;

    } else if (sb.st_uid == cred.uid) {
        return NGX_OK;
    }

    if (d->last_err == NGX_HTTP_ESI_UNTRUSTED) {
        ngx_log_debug2(NGX_LOG_DEBUG_HTTP, d->log, 0,
                       "esi: %V refused again: uid %ui", &d->conf->daemon,
                       (ngx_uint_t) cred.uid);
        return NGX_DECLINED;
    }

    d->last_err = NGX_HTTP_ESI_UNTRUSTED;

    peer_name = ngx_http_esi_id_name(peer, sizeof(peer), cred.uid, 0);

    if (err) {
        ngx_str_set(&owner_name, "owner unknown");

    } else {
        owner_user = ngx_http_esi_id_name(owner, sizeof(owner), sb.st_uid, 0);
        owner_name.data = owner_text;
        owner_name.len = ngx_slprintf(owner_text,
                                      owner_text + sizeof(owner_text),
                                      "user %V, uid %ui", &owner_user,
                                      (ngx_uint_t) sb.st_uid)
                         - owner_text;
    }

    if (d->conf->daemon_user == (ngx_uid_t) NGX_CONF_UNSET_UINT) {
        ngx_str_set(&allowed_name, "not set");

    } else {
        allowed_name = ngx_http_esi_id_name(allowed, sizeof(allowed),
                                            d->conf->daemon_user, 0);
    }

    ngx_log_error(NGX_LOG_ERR, d->log, err,
                  "esi: connect() to %V refused: the process listening "
                  "there, pid %P, runs as user %V (uid %ui), but esid must "
                  "run as root, as the owner of the socket's directory "
                  "%s (%V) or as \"esi_daemon_user\" (%V); nothing was "
                  "sent to it and esi streams fall back: stop that process "
                  "and run esid as one of those, or if it is your esid, "
                  "set \"esi_daemon_user %V;\" in nginx's http block",
                  &d->conf->daemon, (ngx_pid_t) cred.pid, &peer_name,
                  (ngx_uint_t) cred.uid, dir, &owner_name, &allowed_name,
                  &peer_name);

    return NGX_DECLINED;
}


/* a user's (or with group set, a group's) name, else its number */

static ngx_str_t
ngx_http_esi_id_name(u_char *buf, size_t size, ngx_uint_t id,
    ngx_uint_t group)
{
    char           *name, lookup[4096];
    ngx_str_t       s;
    struct group    gr, *grp;
    struct passwd   pw, *pwp;

    name = NULL;

    if (group) {
        if (getgrgid_r((gid_t) id, &gr, lookup, sizeof(lookup), &grp) == 0
            && grp != NULL)
        {
            name = gr.gr_name;
        }

    } else if (getpwuid_r((uid_t) id, &pw, lookup, sizeof(lookup), &pwp)
               == 0
               && pwp != NULL)
    {
        name = pw.pw_name;
    }

    s.data = buf;

    if (name) {
        s.len = ngx_slprintf(buf, buf + size, "%s", name) - buf;

    } else {
        s.len = ngx_slprintf(buf, buf + size, "%ui", id) - buf;
    }

    return s;
}


static void
ngx_http_esi_reconnect_handler(ngx_event_t *ev)
{
    if (ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    ngx_http_esi_daemon_connect(ev->data);
}


static void
ngx_http_esi_hello_handler(ngx_event_t *wev)
{
    ssize_t                 n;
    ngx_connection_t       *c;
    ngx_http_esi_daemon_t  *d;

    c = wev->data;
    d = &ngx_http_esi_daemon;

    if (d->state != NGX_HTTP_ESI_CONNECTING
        || d->hello_sent == sizeof(d->hello))
    {
        return;
    }

    n = c->send(c, (u_char *) d->hello + d->hello_sent,
                sizeof(d->hello) - d->hello_sent);

    if (n == NGX_ERROR) {
        ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                                 "esi: cannot send hello to esid");
        return;
    }

    if (n > 0) {
        d->hello_sent += n;
    }

    if (d->hello_sent < sizeof(d->hello)
        && ngx_handle_write_event(wev, 0) != NGX_OK)
    {
        ngx_http_esi_daemon_drop(d, NGX_LOG_ERR, "esi: cannot wait to write");
    }
}


static void
ngx_http_esi_socket_handler(ngx_event_t *rev)
{
    u_char                  byte;
    ssize_t                 n;
    ngx_err_t               err;
    ngx_connection_t       *c;
    ngx_http_esi_daemon_t  *d;

    c = rev->data;
    d = &ngx_http_esi_daemon;

    if (rev->timedout) {
        ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                                 "esi: esid did not answer hello in time");
        return;
    }

    if (d->state == NGX_HTTP_ESI_CONNECTING) {

        switch (ngx_http_esi_read_welcome(d)) {

        case NGX_AGAIN:
            if (ngx_handle_read_event(rev, 0) != NGX_OK) {
                ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                                         "esi: cannot wait to read");
            }
            return;

        case NGX_OK:
            if (ngx_http_esi_attach(d) == NGX_OK) {
                return;
            }

            /* fall through */

        default:
            ngx_http_esi_daemon_drop(d, NGX_LOG_ERR, NULL);
            return;
        }
    }

    /* nothing but EOF travels on the socket once attached */

    n = recv(c->fd, &byte, 1, 0);

    if (n == -1) {
        err = ngx_socket_errno;

        if (err == NGX_EAGAIN || err == NGX_EINTR) {
            if (ngx_handle_read_event(rev, 0) != NGX_OK) {
                ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                                         "esi: cannot wait to read");
            }
            return;
        }

        ngx_log_error(NGX_LOG_ERR, d->log, err, "esi: recv() failed");
        ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                                 "esi: connection to esid failed");
        return;
    }

    ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                             n == 0 ? "esi: esid closed the connection"
                             : "esi: esid sent data on the socket");
}


static ngx_int_t
ngx_http_esi_read_welcome(ngx_http_esi_daemon_t *d)
{
    int             *fd;
    size_t           total;
    ssize_t          n;
    uint32_t         table[2];
    ngx_err_t        err;
    ngx_uint_t       i, nfd;
    struct iovec     iov;
    struct msghdr    msg;
    struct cmsghdr  *cmsg;
    union {
        struct cmsghdr  cm;
        u_char          space[CMSG_SPACE(5 * sizeof(int))];
    } cmsgbuf;

    for ( ;; ) {
        iov.iov_base = (u_char *) d->welcome + d->welcome_len;
        iov.iov_len = sizeof(d->welcome) - d->welcome_len;

        ngx_memzero(&msg, sizeof(struct msghdr));
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = &cmsgbuf;
        msg.msg_controllen = sizeof(cmsgbuf);

        n = recvmsg(d->conn->fd, &msg, MSG_CMSG_CLOEXEC);

        if (n == -1) {
            err = ngx_socket_errno;

            if (err == NGX_EAGAIN) {
                return NGX_AGAIN;
            }

            if (err == NGX_EINTR) {
                continue;
            }

            ngx_log_error(NGX_LOG_ERR, d->log, err, "esi: recvmsg() failed");
            return NGX_ERROR;
        }

        for (cmsg = CMSG_FIRSTHDR(&msg);
             cmsg != NULL;
             cmsg = CMSG_NXTHDR(&msg, cmsg))
        {
            if (cmsg->cmsg_level != SOL_SOCKET
                || cmsg->cmsg_type != SCM_RIGHTS)
            {
                continue;
            }

            fd = (int *) CMSG_DATA(cmsg);
            nfd = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);

            for (i = 0; i < nfd; i++) {
                if (d->nfds < 4) {
                    d->fds[d->nfds++] = fd[i];

                } else {
                    close(fd[i]);
                    d->nfds++;
                }
            }
        }

        if (msg.msg_flags & MSG_CTRUNC) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: welcome carried too many descriptors");
            return NGX_ERROR;
        }

        if (n == 0) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: esid closed the connection before welcome");
            return NGX_ERROR;
        }

        d->welcome_len += n;

        if (d->welcome_len < 8) {
            continue;
        }

        ngx_memcpy(table, d->welcome, 8);

        if (table[0] != 0 || table[1] >= NGX_HTTP_ESI_WELCOME_WORDS) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: malformed welcome from esid");
            return NGX_ERROR;
        }

        total = 8 + (size_t) table[1] * 8;

        if (d->welcome_len > total) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: esid sent more than a welcome");
            return NGX_ERROR;
        }

        if (d->welcome_len == total) {
            return NGX_OK;
        }
    }
}


static ngx_int_t
ngx_http_esi_attach(ngx_http_esi_daemon_t *d)
{
    int                 seals;
    u_char             *shm;
    uint32_t            version, ring_size, pid;
    uint64_t            arena_size;
    ngx_connection_t   *c;
    esi_shm_header_t   *hdr;
    esi_wire_msg_t      msg;
    esi_wire_struct_t   root;
    struct stat         st;

    if (esi_wire_open(&msg, d->welcome, d->welcome_len, &root) != 0) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed welcome from esid");
        return NGX_ERROR;
    }

    version = esi_wire_u32(&root, ESI_WIRE_WELCOME_VERSION_OFFSET);
    ring_size = esi_wire_u32(&root, ESI_WIRE_WELCOME_RING_SIZE_OFFSET);
    pid = esi_wire_u32(&root, ESI_WIRE_WELCOME_DAEMON_PID_OFFSET);
    arena_size = esi_wire_u64(&root, ESI_WIRE_WELCOME_ARENA_SIZE_OFFSET);

    if (version != ESI_WIRE_PROTOCOL_VERSION) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: esid speaks protocol %uD, we speak %uD",
                      version, (uint32_t) ESI_WIRE_PROTOCOL_VERSION);
        return NGX_ERROR;
    }

    if (d->nfds != 4 || !esi_ring_size_valid(ring_size)) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: invalid welcome from esid: %ui descriptors, "
                      "ring size %uD", d->nfds, ring_size);
        return NGX_ERROR;
    }

    seals = fcntl(d->fds[0], F_GET_SEALS);

    if (seals == -1
        || (seals & (F_SEAL_SHRINK|F_SEAL_GROW))
           != (F_SEAL_SHRINK|F_SEAL_GROW))
    {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: the shared memory from esid is not sealed");
        return NGX_ERROR;
    }

    if (fstat(d->fds[0], &st) == -1
        || (size_t) st.st_size != esi_shm_size(ring_size))
    {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: the shared memory from esid has the wrong size");
        return NGX_ERROR;
    }

    d->shm_size = esi_shm_size(ring_size);

    shm = mmap(NULL, d->shm_size, PROT_READ|PROT_WRITE, MAP_SHARED,
               d->fds[0], 0);

    if (shm == MAP_FAILED) {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: mmap() of the shared memory failed");
        return NGX_ERROR;
    }

    d->shm = shm;
    hdr = (esi_shm_header_t *) shm;

    if (hdr->magic != ESI_SHM_MAGIC
        || hdr->version != ESI_WIRE_PROTOCOL_VERSION
        || hdr->ring_size != ring_size)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: corrupt shared memory header from esid");
        return NGX_ERROR;
    }

    esi_ring_attach(&d->tx, &hdr->to_daemon, shm + ESI_SHM_HEADER_SIZE,
                    ring_size);
    esi_ring_attach(&d->rx, &hdr->to_worker,
                    shm + ESI_SHM_HEADER_SIZE + ring_size, ring_size);

    if (ngx_http_esi_map_pins(d, d->fds[0], ring_size) != NGX_OK) {
        return NGX_ERROR;
    }

    close(d->fds[0]);
    d->fds[0] = -1;

    if (ngx_http_esi_map_arena(d, d->fds[3], arena_size) != NGX_OK) {
        return NGX_ERROR;
    }

    close(d->fds[3]);
    d->fds[3] = -1;

    c = ngx_get_connection(d->fds[1], d->log);
    if (c == NULL) {
        return NGX_ERROR;
    }

    d->notify = c;
    d->fds[1] = -1;
    d->daemon_fd = d->fds[2];
    d->fds[2] = -1;
    d->nfds = 0;

    if (ngx_nonblocking(c->fd) == -1 || ngx_nonblocking(d->daemon_fd) == -1) {
        ngx_log_error(NGX_LOG_ALERT, d->log, ngx_errno,
                      ngx_nonblocking_n " failed");
        return NGX_ERROR;
    }

    c->read->handler = ngx_http_esi_notify_handler;
    c->read->log = d->log;
    c->write->log = d->log;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        return NGX_ERROR;
    }

    if (d->conn->read->timer_set) {
        ngx_del_timer(d->conn->read);
    }

    d->state = NGX_HTTP_ESI_READY;
    d->backoff = NGX_HTTP_ESI_BACKOFF_MIN;
    d->last_err = 0;

    ngx_log_error(NGX_LOG_INFO, d->log, 0,
                  "esi: attached to esid pid %uD, ring %uD bytes",
                  pid, ring_size);

    if (d->attached && d->attached(d) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_esi_daemon_flush(d);

    /* esid may have written before we watched the eventfd */
    ngx_post_event(c->read, &ngx_posted_events);

    return NGX_OK;
}


/*
 * The segment arena: sealed so that it can neither be written through a
 * new mapping nor change size (a send from it would fault), mapped
 * read-only.  An empty one means esid stitches nothing.
 */

static ngx_int_t
ngx_http_esi_map_arena(ngx_http_esi_daemon_t *d, ngx_fd_t fd, uint64_t size)
{
    int           seals, need;
    struct stat   st;

    if (size == 0) {
        return NGX_OK;
    }

    need = F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_FUTURE_WRITE;
    seals = fcntl(fd, F_GET_SEALS);

    if (seals == -1 || (seals & need) != need) {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: the segment arena from esid is not sealed");
        return NGX_ERROR;
    }

    if (fstat(fd, &st) == -1
        || size > (uint64_t) NGX_MAX_SIZE_T_VALUE
        || (uint64_t) st.st_size != size)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: the segment arena from esid has the wrong size");
        return NGX_ERROR;
    }

    d->arena = ngx_http_esi_map(d, fd, (size_t) size, 0, PROT_READ,
                                "the segment arena");

    return d->arena ? NGX_OK : NGX_ERROR;
}


static ngx_int_t
ngx_http_esi_map_pins(ngx_http_esi_daemon_t *d, ngx_fd_t fd,
    uint32_t ring_size)
{
    d->pins = ngx_http_esi_map(d, fd, ESI_PIN_SLOTS * sizeof(uint32_t),
                               (off_t) esi_shm_pins_offset(ring_size),
                               PROT_READ|PROT_WRITE, "the pin table");

    return d->pins ? NGX_OK : NGX_ERROR;
}


static ngx_http_esi_mapping_t *
ngx_http_esi_map(ngx_http_esi_daemon_t *d, ngx_fd_t fd, size_t size,
    off_t offset, int prot, const char *what)
{
    u_char                  *start;
    ngx_http_esi_mapping_t  *m;

    m = ngx_alloc(sizeof(ngx_http_esi_mapping_t), d->log);
    if (m == NULL) {
        return NULL;
    }

    start = mmap(NULL, size, prot, MAP_SHARED, fd, offset);

    if (start == MAP_FAILED) {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: mmap() of %s failed", what);
        ngx_free(m);
        return NULL;
    }

    m->start = start;
    m->size = size;
    m->refs = 1;

    return m;
}


void
ngx_http_esi_daemon_unmap(ngx_http_esi_mapping_t *m)
{
    if (--m->refs) {
        return;
    }

    munmap(m->start, m->size);
    ngx_free(m);
}


/* the request is over, or never used the plan: its pin goes */

void
ngx_http_esi_daemon_unpin(ngx_http_esi_mapping_t *pins, uint32_t pin)
{
    uint32_t  *counts;

    counts = (uint32_t *) pins->start;

    (void) __atomic_fetch_sub(&counts[pin - 1], 1, __ATOMIC_RELEASE);
}


void
ngx_http_esi_daemon_drop(ngx_http_esi_daemon_t *d, ngx_uint_t level,
    const char *reason)
{
    ngx_uint_t  i;

    if (reason) {
        ngx_log_error(level, d->log, 0, "%s, esi streams fall back", reason);
    }

    ngx_http_esi_close(d);

    for (i = 0; i < d->nlost; i++) {
        (void) d->lost[i](d);
    }

    if (!ngx_exiting && !ngx_terminate && !ngx_quit) {
        ngx_add_timer(&d->reconnect, d->backoff);
        d->backoff = ngx_min(d->backoff * 2, NGX_HTTP_ESI_BACKOFF_MAX);
    }
}


static void
ngx_http_esi_close(ngx_http_esi_daemon_t *d)
{
    ngx_uint_t  i;

    d->state = NGX_HTTP_ESI_IDLE;

    if (d->conn) {
        ngx_close_connection(d->conn);
        d->conn = NULL;
    }

    if (d->notify) {
        ngx_close_connection(d->notify);
        d->notify = NULL;
    }

    if (d->daemon_fd != -1) {
        close(d->daemon_fd);
        d->daemon_fd = -1;
    }

    for (i = 0; i < ngx_min(d->nfds, 4); i++) {
        if (d->fds[i] != -1) {
            close(d->fds[i]);
        }
    }

    d->nfds = 0;

    if (d->shm) {
        munmap(d->shm, d->shm_size);
        d->shm = NULL;
    }

    if (d->closed) {
        (void) d->closed(d);
    }

    if (d->report_timer.timer_set) {
        ngx_del_timer(&d->report_timer);
    }

    if (d->pins) {
        ngx_http_esi_daemon_unmap(d->pins);
        d->pins = NULL;
    }

    if (d->arena) {
        ngx_http_esi_daemon_unmap(d->arena);
        d->arena = NULL;
    }

    if (d->pool) {
        ngx_destroy_pool(d->pool);
        d->pool = NULL;
        d->cancels = NULL;
    }

    ngx_http_esi_free_posted(d);
}


static void
ngx_http_esi_notify_handler(ngx_event_t *rev)
{
    uint64_t                value;
    uint32_t                len;
    ngx_uint_t              n;
    const uint8_t          *p;
    ngx_connection_t       *c;
    ngx_http_esi_daemon_t  *d;

    c = rev->data;
    d = &ngx_http_esi_daemon;

    while (read(c->fd, &value, sizeof(uint64_t)) == sizeof(uint64_t)) {
        /* void */
    }

    if (d->state != NGX_HTTP_ESI_READY) {
        return;
    }

    for (n = 0; n < NGX_HTTP_ESI_DRAIN_BATCH; n++) {

        switch (esi_ring_peek(&d->rx, &p, &len)) {

        case ESI_RING_EMPTY:
            if (esi_ring_wait_data(&d->rx)) {
                goto drained;
            }
            continue;

        case ESI_RING_OK:
            break;

        default:
            ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                                     "esi: the ring from esid is corrupt");
            return;
        }

        if (ngx_http_esi_response(d, p, len) != NGX_OK) {
            ngx_http_esi_daemon_drop(d, NGX_LOG_ERR, NULL);
            return;
        }

        if (d->state != NGX_HTTP_ESI_READY) {

            /* an answer led to dropping the connection: the ring is gone */
            return;
        }

        if (esi_ring_release(&d->rx)) {
            d->kick = 1;
        }
    }

    /* esid keeps writing: let other events run, then carry on */
    ngx_post_event(rev, &ngx_posted_events);

drained:

    ngx_http_esi_daemon_flush(d);

    if (ngx_handle_read_event(rev, 0) != NGX_OK) {
        ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                                 "esi: cannot watch the eventfd");
    }
}


static ngx_int_t
ngx_http_esi_response(ngx_http_esi_daemon_t *d, const uint8_t *p,
    uint32_t len)
{
    uint16_t                        which;
    esi_wire_msg_t                  msg;
    esi_wire_struct_t               root;
    ngx_http_esi_answer_t           a;
    ngx_http_esi_answer_handler_t  *h;

    if (esi_wire_open(&msg, p, len, &root) != 0) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed response from esid");
        return NGX_ERROR;
    }

    which = esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET);

    if (which >= NGX_HTTP_ESI_ANSWERS || d->answers[which].handler == NULL) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: unknown response %ud from esid", which);
        return NGX_ERROR;
    }

    h = &d->answers[which];

    a.id = esi_wire_u32(&root, ESI_WIRE_RESPONSE_STREAM_OFFSET);
    a.node = NULL;
    a.root = &root;
    a.message = p;
    a.len = len;

    if (h->table == NULL) {
        return h->handler(d, &a);
    }

    a.node = ngx_http_esi_daemon_find(h->table, a.id);

    if (a.node) {
        return h->handler(d, &a);
    }

    if (a.id == 0 || a.id >= d->next_id) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: response for stream %uD never opened", a.id);
        return NGX_ERROR;
    }

    /* a stream we cancelled or failed, a purge that is over */

    return h->stale ? h->stale(d, &a) : NGX_OK;
}


/* streams and purges share one id space, in tables of their own */

static ngx_rbtree_node_t *
ngx_http_esi_daemon_find(ngx_rbtree_t *tree, uint32_t id)
{
    ngx_rbtree_node_t  *node, *sentinel;

    node = tree->root;
    sentinel = tree->sentinel;

    while (node != sentinel) {

        if (id < node->key) {
            node = node->left;
            continue;
        }

        if (id > node->key) {
            node = node->right;
            continue;
        }

        return node;
    }

    return NULL;
}


void
ngx_http_esi_daemon_flush(ngx_http_esi_daemon_t *d)
{
    uint32_t    *id;
    ngx_int_t    rc;
    ngx_uint_t   i;

    if (d->state != NGX_HTTP_ESI_READY) {
        return;
    }

    for ( ;; ) {

        rc = ngx_http_esi_flush_posted(d);

        if (rc == NGX_AGAIN) {
            goto wait;
        }

        id = d->cancels->elts;

        for (i = 0; i < d->cancels->nelts; i++) {
            if (ngx_http_esi_daemon_send_short(d, id[i],
                                               ESI_WIRE_REQUEST_CANCEL_WHICH)
                != NGX_OK)
            {
                break;
            }
        }

        if (i < d->cancels->nelts) {
            ngx_memmove(id, &id[i], (d->cancels->nelts - i) * sizeof(uint32_t));
            d->cancels->nelts -= i;
            rc = NGX_AGAIN;
            goto wait;
        }

        d->cancels->nelts = 0;
        rc = d->writable ? d->writable(d) : NGX_OK;

    wait:

        if (rc != NGX_AGAIN || esi_ring_wait_space(&d->tx, d->need)) {
            break;
        }
    }

    /*
     * esid is woken once the events of this loop iteration have run: the
     * messages of every request they served share one eventfd write
     */

    if (d->kick && !d->kick_event.posted) {
        ngx_post_event(&d->kick_event, &ngx_posted_events);
    }
}


static void
ngx_http_esi_daemon_kick_handler(ngx_event_t *ev)
{
    uint64_t                one;
    ngx_http_esi_daemon_t  *d;

    d = ev->data;

    if (!d->kick || d->state != NGX_HTTP_ESI_READY) {
        return;
    }

    d->kick = 0;
    one = 1;

    if (write(d->daemon_fd, &one, sizeof(uint64_t)) == -1
        && ngx_errno != NGX_EAGAIN)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, ngx_errno,
                      "esi: write() to esid's eventfd failed");
    }
}


/*
 * Writes a message that waits for no answer (zone, stored) or whose answer
 * finds its purge by id: into the ring when nothing waits before it, into
 * the queue otherwise, in order.  NGX_DECLINED: esid is not connected, or
 * the message cannot be queued (the connection is then dropped).
 */

ngx_int_t
ngx_http_esi_daemon_post(ngx_http_esi_daemon_t *d, void *buf, size_t len)
{
    void  *p;

    if (d->state == NGX_HTTP_ESI_IDLE) {
        return NGX_DECLINED;
    }

    if (d->state == NGX_HTTP_ESI_READY && ngx_queue_empty(&d->posted)) {

        if (len > esi_ring_max_payload(&d->tx)) {
            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: a %uz byte message does not fit the ring",
                          len);
            return NGX_DECLINED;
        }

        p = ngx_http_esi_daemon_reserve(d, len);

        if (p) {
            ngx_memcpy(p, buf, len);
            ngx_http_esi_daemon_commit(d, len);
            ngx_http_esi_daemon_flush(d);
            return NGX_OK;
        }
    }

    if (d->posted_size + len > NGX_HTTP_ESI_POSTED_MAX) {
        ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                           "esi: too many messages wait for room in the ring");
        return NGX_DECLINED;
    }

    if (ngx_http_esi_daemon_enqueue(d, buf, len, ngx_queue_sentinel(&d->posted))
        != NGX_OK)
    {
        ngx_http_esi_daemon_drop(d, NGX_LOG_ERR, "esi: out of memory");
        return NGX_DECLINED;
    }

    /* asks esid to wake us when it frees room */
    ngx_http_esi_daemon_flush(d);

    return NGX_OK;
}


/*
 * Writes a report that esid need not read at once (a hit replayed from the
 * worker's copy, for its counts and trace) without waking esid: it reads
 * it with the next message that does, when the ring is a quarter full, or
 * NGX_HTTP_ESI_REPORT_DELAY later; and before it answers esictl.  A busy
 * worker's hits then cost esid no wake-up each.
 */

void
ngx_http_esi_daemon_report(ngx_http_esi_daemon_t *d, void *buf, size_t len)
{
    void  *p;

    if (d->state != NGX_HTTP_ESI_READY || !ngx_queue_empty(&d->posted)
        || len > esi_ring_max_payload(&d->tx)
        || (p = esi_ring_reserve(&d->tx, len)) == NULL)
    {
        (void) ngx_http_esi_daemon_post(d, buf, len);
        return;
    }

    ngx_memcpy(p, buf, len);
    esi_ring_commit_quiet(&d->tx, len);

    if (esi_ring_used(&d->tx) > d->tx.size / 4) {
        ngx_http_esi_daemon_report_handler(&d->report_timer);
        return;
    }

    if (!d->report_timer.timer_set) {
        ngx_add_timer(&d->report_timer, NGX_HTTP_ESI_REPORT_DELAY);
    }
}


static void
ngx_http_esi_daemon_report_handler(ngx_event_t *ev)
{
    ngx_http_esi_daemon_t  *d;

    d = ev->data;

    if (ev->timer_set) {
        ngx_del_timer(ev);
    }

    if (d->state == NGX_HTTP_ESI_READY && esi_ring_wake_due(&d->tx)) {
        d->kick = 1;

        if (!d->kick_event.posted) {
            ngx_post_event(&d->kick_event, &ngx_posted_events);
        }
    }
}


/* queues a copy of the message before "before" (the sentinel: at the end) */

ngx_int_t
ngx_http_esi_daemon_enqueue(ngx_http_esi_daemon_t *d, void *buf, size_t len,
    ngx_queue_t *before)
{
    ngx_http_esi_msg_t  *m;

    /*
     * Freed one by one as the ring takes them, in any order of size, so
     * they cannot live in a pool.
     */

    m = ngx_alloc(offsetof(ngx_http_esi_msg_t, data) + len, d->log);
    if (m == NULL) {
        return NGX_ERROR;
    }

    m->len = len;
    ngx_memcpy(m->data, buf, len);

    ngx_queue_insert_tail(before, &m->link);
    d->posted_size += len;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_flush_posted(ngx_http_esi_daemon_t *d)
{
    void                *p;
    ngx_queue_t         *q;
    ngx_http_esi_msg_t  *m;

    while (!ngx_queue_empty(&d->posted)) {
        q = ngx_queue_head(&d->posted);
        m = ngx_queue_data(q, ngx_http_esi_msg_t, link);

        /* not freed: ngx_queue_remove() made the next one the head */
        /* NOLINTNEXTLINE(clang-analyzer-unix.Malloc) */
        if (m->len > esi_ring_max_payload(&d->tx)) {

            /* queued while connecting, before the ring size was known */

            ngx_log_error(NGX_LOG_ERR, d->log, 0,
                          "esi: a %uz byte message does not fit the ring, "
                          "dropped", m->len);

            d->lost_reports = 1;

        } else {
            p = ngx_http_esi_daemon_reserve(d, m->len);
            if (p == NULL) {
                return NGX_AGAIN;
            }

            ngx_memcpy(p, m->data, m->len);
            ngx_http_esi_daemon_commit(d, m->len);
        }

        ngx_queue_remove(q);
        d->posted_size -= m->len;
        ngx_free(m);
    }

    return NGX_OK;
}


static void
ngx_http_esi_free_posted(ngx_http_esi_daemon_t *d)
{
    ngx_queue_t  *q;

    /* reports may be among them */

    if (!ngx_queue_empty(&d->posted)) {
        d->lost_reports = 1;
    }

    while (!ngx_queue_empty(&d->posted)) {
        q = ngx_queue_head(&d->posted);

        /* as in ngx_http_esi_flush_posted(), the next one, not freed */
        /* NOLINTNEXTLINE(clang-analyzer-unix.Malloc) */
        ngx_queue_remove(q);
        ngx_free(ngx_queue_data(q, ngx_http_esi_msg_t, link));
    }

    d->posted_size = 0;
}


void *
ngx_http_esi_daemon_reserve(ngx_http_esi_daemon_t *d, size_t need)
{
    void  *p;

    p = esi_ring_reserve(&d->tx, need);

    if (p == NULL) {
        d->need = need;
    }

    return p;
}


void
ngx_http_esi_daemon_commit(ngx_http_esi_daemon_t *d, size_t len)
{
    if (esi_ring_commit(&d->tx, len)) {
        d->kick = 1;
    }
}


/*
 * Every Request to esid starts so, in a buffer of "len" bytes: its root,
 * the stream or purge it is about (0: none) and which it is; the caller
 * sets that member in "req".
 */

void
ngx_http_esi_daemon_request(esi_wire_builder_t *b, void *buf, size_t len,
    uint32_t id, uint16_t which, esi_wire_out_t *req)
{
    esi_wire_builder_init(b, buf, len);

    (void) esi_wire_root(b, ESI_WIRE_REQUEST_DATA_WORDS,
                         ESI_WIRE_REQUEST_POINTERS, req);
    esi_wire_set_u32(req, ESI_WIRE_REQUEST_STREAM_OFFSET, id);
    esi_wire_set_u16(req, ESI_WIRE_REQUEST_WHICH_OFFSET, which);
}


ngx_int_t
ngx_http_esi_daemon_send_short(ngx_http_esi_daemon_t *d, uint32_t id,
    uint16_t which)
{
    size_t               need;
    void                *p;
    esi_wire_out_t       req;
    esi_wire_builder_t   b;

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS, 0);

    p = ngx_http_esi_daemon_reserve(d, need);
    if (p == NULL) {
        return NGX_AGAIN;
    }

    ngx_http_esi_daemon_request(&b, p, need, id, which, &req);

    ngx_http_esi_daemon_commit(d, esi_wire_finish(&b));

    return NGX_OK;
}
