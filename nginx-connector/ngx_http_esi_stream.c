
/*
 * Copyright (C) The ESI project authors
 *
 * A response's stream to esid: open, body and end messages, the
 * table of open streams, their timers and wake-ups, and the request
 * variables and cookies an open carries.
 */


#include "ngx_http_esi.h"


static void ngx_http_esi_cancel(ngx_http_esi_daemon_t *d, uint32_t id);
static void ngx_http_esi_timeout_handler(ngx_event_t *ev);
static void ngx_http_esi_resume_handler(ngx_event_t *ev);
static void ngx_http_esi_wake(ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_authority(ngx_http_request_t *r,
    ngx_str_t *host);
static void ngx_http_esi_request_vars(ngx_http_request_t *r, ngx_str_t *vars);
static size_t ngx_http_esi_cookies(ngx_http_request_t *r, ngx_array_t *names,
    u_char *dst);
static void ngx_http_esi_cleanup(void *data);
static ngx_int_t ngx_http_esi_stream_send(ngx_http_esi_daemon_t *d,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_stream_writable(ngx_http_esi_daemon_t *d);
static ngx_int_t ngx_http_esi_stream_failed(ngx_http_esi_daemon_t *d,
    ngx_http_esi_answer_t *a);
static ngx_int_t ngx_http_esi_stream_lost(ngx_http_esi_daemon_t *d);
static void ngx_http_esi_stream_wake_handler(ngx_event_t *ev);


/* filter.c's, which a woken stream runs: the stream is below the filter */
static ngx_http_esi_process_pt  ngx_http_esi_stream_process;


/* the streams' table and queues, and what esid's failures do to them */

ngx_int_t
ngx_http_esi_stream_register(ngx_http_esi_daemon_t *d, ngx_cycle_t *cycle,
    ngx_http_esi_process_pt process)
{
    ngx_http_esi_answer_handler_t  *h;

    ngx_http_esi_stream_process = process;

    ngx_rbtree_init(&d->streams, &d->sentinel, ngx_rbtree_insert_value);
    ngx_queue_init(&d->tx_wait);
    ngx_queue_init(&d->wake);

    d->wake_event.handler = ngx_http_esi_stream_wake_handler;
    d->wake_event.log = cycle->log;
    d->wake_event.data = d;

    h = &d->answers[ESI_WIRE_RESPONSE_FAIL_WHICH];
    h->handler = ngx_http_esi_stream_failed;
    h->table = &d->streams;

    d->writable = ngx_http_esi_stream_writable;
    d->lost[d->nlost++] = ngx_http_esi_stream_lost;

    return NGX_OK;
}


/* the streams waiting for room in the ring write, in order */

static ngx_int_t
ngx_http_esi_stream_writable(ngx_http_esi_daemon_t *d)
{
    ngx_int_t            rc;
    ngx_queue_t         *q;
    ngx_http_esi_ctx_t  *ctx;

    while (!ngx_queue_empty(&d->tx_wait)) {
        q = ngx_queue_head(&d->tx_wait);
        ctx = ngx_queue_data(q, ngx_http_esi_ctx_t, tx_link);

        rc = ngx_http_esi_stream_send(d, ctx);

        if (rc == NGX_AGAIN) {
            return NGX_AGAIN;
        }

        /* ngx_queue_remove() makes the next one the head */
        /* NOLINTNEXTLINE(clang-analyzer-core.NullDereference) */
        ngx_queue_remove(q);
        ctx->tx_queued = 0;

        if (rc == NGX_OK) {
            ngx_http_esi_stream_timer(ctx, 1);

        } else {
            ngx_http_esi_stream_fail(ctx);
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_stream_failed(ngx_http_esi_daemon_t *d, ngx_http_esi_answer_t *a)
{
    size_t               n;
    const char          *reason;
    ngx_http_esi_ctx_t  *ctx;

    ctx = (ngx_http_esi_ctx_t *) a->node;

    if (esi_wire_get_text(a->root, ESI_WIRE_RESPONSE_FAIL_PTR, &reason, &n)
        != 0)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed failure from esid");
        return NGX_ERROR;
    }

    ngx_log_error(NGX_LOG_WARN, ctx->request->connection->log, 0,
                  "esi: esid failed the stream: \"%*s\"",
                  ngx_min(n, 256), (u_char *) reason);

    ngx_http_esi_stream_unlink(ctx);
    ngx_http_esi_stream_fail(ctx);

    return NGX_OK;
}


/* the connection to esid is gone: every stream falls back */

static ngx_int_t
ngx_http_esi_stream_lost(ngx_http_esi_daemon_t *d)
{
    ngx_http_esi_ctx_t  *ctx;

    while (d->streams.root != d->streams.sentinel) {
        ctx = (ngx_http_esi_ctx_t *) ngx_rbtree_min(d->streams.root,
                                                    d->streams.sentinel);

        ngx_http_esi_stream_unlink(ctx);
        ngx_http_esi_stream_fail(ctx);
    }

    return NGX_OK;
}


/*
 * Writes what the stream has for esid: open, body, end.  NGX_AGAIN: the
 * ring is full; NGX_DECLINED: a message can never fit.
 */

static ngx_int_t
ngx_http_esi_stream_send(ngx_http_esi_daemon_t *d, ngx_http_esi_ctx_t *ctx)
{
    off_t                     from;
    size_t                    need, len, n, k, max, room, uri_len,
                              vars_len, cookies_len;
    u_char                   *dst;
    void                     *p;
    ngx_str_t                 host, *zone;
    ngx_str_t                 vars[ESI_WIRE_REQUEST_VARS_POINTERS];
    ngx_uint_t                i;
    ngx_http_request_t       *r;
    ngx_http_esi_held_t      *h;
    esi_wire_out_t            req, open, rv;
    esi_wire_builder_t        b;
    ngx_http_esi_loc_conf_t  *elcf;
    ngx_http_core_srv_conf_t *cscf;

    r = ctx->request;
    max = esi_ring_max_payload(&d->tx);
    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    if (!ctx->open_sent) {
        if (ngx_http_esi_authority(r, &host) != NGX_OK) {
            cscf = ngx_http_get_module_srv_conf(r, ngx_http_core_module);
            host = cscf->server_name;
        }

        uri_len = r->uri.len;
        zone = ctx->identified ? &ctx->plan_zone->name : NULL;

        ngx_http_esi_request_vars(r, vars);

        cookies_len = ngx_http_esi_cookies(r, elcf->cookies, NULL);
        if (cookies_len > NGX_HTTP_ESI_VAR_MAX) {
            cookies_len = 0;
        }

        vars_len = cookies_len ? esi_wire_blob(cookies_len + 1) : 0;

        for (i = 0; i < ESI_WIRE_REQUEST_VARS_POINTERS; i++) {
            if (vars[i].len) {
                vars_len += esi_wire_blob(vars[i].len + 1);
            }
        }

        need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                             + ESI_WIRE_REQUEST_POINTERS
                             + ESI_WIRE_OPEN_DATA_WORDS
                             + ESI_WIRE_OPEN_POINTERS
                             + ESI_WIRE_REQUEST_VARS_DATA_WORDS
                             + ESI_WIRE_REQUEST_VARS_POINTERS,
                             esi_wire_blob(uri_len + 1)
                             + esi_wire_blob(host.len + 1)
                             + vars_len
                             + (zone ? esi_wire_blob(NGX_HTTP_ESI_OBJECT_LEN)
                                       + esi_wire_blob(zone->len + 1)
                                     : 0));

        if (need > max) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: uri and host too long for the ring");
            return NGX_DECLINED;
        }

        p = ngx_http_esi_daemon_reserve(d, need);
        if (p == NULL) {
            return NGX_AGAIN;
        }

        ngx_http_esi_daemon_request(&b, p, need, (uint32_t) ctx->node.key,
                                    ESI_WIRE_REQUEST_OPEN_WHICH, &req);
        (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_OPEN_PTR,
                                   ESI_WIRE_OPEN_DATA_WORDS,
                                   ESI_WIRE_OPEN_POINTERS, &open);
        (void) esi_wire_set_text(&open, ESI_WIRE_OPEN_URI_PTR,
                                 (const char *) r->uri.data, uri_len);
        (void) esi_wire_set_text(&open, ESI_WIRE_OPEN_AUTHORITY_PTR,
                                 (const char *) host.data, host.len);
        esi_wire_set_u32(&open, ESI_WIRE_OPEN_MAX_TAG_BYTES_OFFSET,
                         (uint32_t) elcf->max_tag_size);
        esi_wire_set_u16(&open, ESI_WIRE_OPEN_STATUS_OFFSET,
                         (uint16_t) r->headers_out.status);
        (void) esi_wire_set_struct(&open, ESI_WIRE_OPEN_VARS_PTR,
                                   ESI_WIRE_REQUEST_VARS_DATA_WORDS,
                                   ESI_WIRE_REQUEST_VARS_POINTERS, &rv);

        for (i = 0; i < ESI_WIRE_REQUEST_VARS_POINTERS; i++) {
            if (vars[i].len) {
                (void) esi_wire_set_text(&rv, i, (const char *) vars[i].data,
                                         vars[i].len);
            }
        }

        if (cookies_len) {
            dst = esi_wire_alloc_data(&rv, ESI_WIRE_REQUEST_VARS_COOKIES_PTR,
                                      cookies_len + 1);
            if (dst) {
                (void) ngx_http_esi_cookies(r, elcf->cookies, dst);
                dst[cookies_len] = '\0';
            }
        }

        if (zone) {
            dst = esi_wire_alloc_data(&open, ESI_WIRE_OPEN_OBJECT_PTR,
                                      NGX_HTTP_ESI_OBJECT_LEN);
            if (dst) {
                ngx_memcpy(dst, ctx->object, NGX_HTTP_ESI_OBJECT_LEN);
            }

            (void) esi_wire_set_text(&open, ESI_WIRE_OPEN_PLAN_ZONE_PTR,
                                     (const char *) zone->data, zone->len);
            esi_wire_set_u64(&open, ESI_WIRE_OPEN_PLAN_ZONE_BYTES_OFFSET,
                             (uint64_t) ctx->plan_zone->size);
            esi_wire_set_u64(&open, ESI_WIRE_OPEN_BASE_OFFSET,
                             (uint64_t) ctx->base);
            esi_wire_set_bool(&open, ESI_WIRE_OPEN_PLAN_FAILED_BIT,
                              ctx->plan_failed);
            esi_wire_set_u8(&open, ESI_WIRE_OPEN_STITCH_LEVEL_OFFSET,
                            (uint8_t) (ngx_http_esi_stitches(r, elcf)
                                       ? elcf->stitch_level : 0));
            esi_wire_set_bool(&open, ESI_WIRE_OPEN_SEGMENTS_BIT,
                              ctx->segments);

            if (!ctx->plan_failed) {

                /* esid answers with the plan, or says "send the body" */

                ctx->plan_wait = 1;
                ctx->awaiting++;
            }
        }

        ngx_http_esi_daemon_commit(d, esi_wire_finish(&b));
        ctx->open_sent = 1;
    }

    if (ctx->plan_wait) {
        return NGX_OK;
    }

    room = (max - esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                                + ESI_WIRE_REQUEST_POINTERS, 0))
           & ~(size_t) 7;
    room = ngx_min(room, elcf->buffer_size);

    while (ctx->sent < ctx->received) {
        len = ngx_min((size_t) (ctx->received - ctx->sent), room);

        need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                             + ESI_WIRE_REQUEST_POINTERS,
                             esi_wire_blob(len));

        p = ngx_http_esi_daemon_reserve(d, need);
        if (p == NULL) {
            return NGX_AGAIN;
        }

        ngx_http_esi_daemon_request(&b, p, need, (uint32_t) ctx->node.key,
                                    ESI_WIRE_REQUEST_BODY_WHICH, &req);
        dst = esi_wire_alloc_data(&req, ESI_WIRE_REQUEST_BODY_PTR, len);

        /* the one copy of the page: into the ring */

        h = ctx->send_held;

        for (n = 0; n < len; n += k) {
            from = ctx->sent + (off_t) n;
            k = ngx_min(len - n, (size_t) (h->end - from));

            ngx_memcpy(dst + n, h->start + (from - h->offset), k);

            if (from + (off_t) k == h->end) {
                h = h->next;
            }
        }

        ctx->send_held = h;
        ctx->sent += (off_t) len;
        ctx->awaiting++;

        ngx_http_esi_daemon_commit(d, esi_wire_finish(&b));
    }

    if (ctx->input_done && !ctx->end_sent) {
        if (ngx_http_esi_daemon_send_short(d, (uint32_t) ctx->node.key,
                                           ESI_WIRE_REQUEST_END_WHICH)
            != NGX_OK)
        {
            return NGX_AGAIN;
        }

        ctx->end_sent = 1;
        ctx->awaiting++;
    }

    return NGX_OK;
}


static void
ngx_http_esi_cancel(ngx_http_esi_daemon_t *d, uint32_t id)
{
    uint32_t  *p;

    if (d->state != NGX_HTTP_ESI_READY) {
        return;
    }

    p = ngx_array_push(d->cancels);

    if (p == NULL) {
        ngx_http_esi_daemon_drop(d, NGX_LOG_ALERT, "esi: out of memory");
        return;
    }

    *p = id;

    ngx_http_esi_daemon_flush(d);
}


/* the stream leaves the table: esid will say nothing more about it */

void
ngx_http_esi_stream_unlink(ngx_http_esi_ctx_t *ctx)
{
    if (ctx->in_table) {
        ngx_rbtree_delete(&ngx_http_esi_daemon.streams, &ctx->node);
        ctx->in_table = 0;
    }

    if (ctx->tx_queued) {
        ngx_queue_remove(&ctx->tx_link);
        ctx->tx_queued = 0;
    }

    ngx_http_esi_stream_timer(ctx, 0);
}


void
ngx_http_esi_stream_fail(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_stream_forget(ctx);

    ctx->failed = 1;
    ctx->planned = 0;

    ngx_http_esi_stream_schedule(ctx);
}


/* as unlink, telling esid to drop the stream when it knows about it */

void
ngx_http_esi_stream_forget(ngx_http_esi_ctx_t *ctx)
{
    uint32_t  id;

    id = (uint32_t) ctx->node.key;

    if (ctx->in_table && ctx->open_sent) {
        ngx_http_esi_stream_unlink(ctx);
        ngx_http_esi_cancel(&ngx_http_esi_daemon, id);
        return;
    }

    ngx_http_esi_stream_unlink(ctx);
}


void
ngx_http_esi_stream_schedule(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    if (!ctx->wake_queued) {
        ngx_queue_insert_tail(&d->wake, &ctx->wake_link);
        ctx->wake_queued = 1;
    }

    if (!d->wake_event.posted) {
        ngx_post_event(&d->wake_event, &ngx_posted_events);
    }
}


/*
 * Armed from the open until esid's last splice, re-armed by each answer
 * and by each message written to esid.  "awaiting" counts the messages
 * esid has not finished answering (a splice marked "answered" ends one),
 * so when the timer expires it tells whether the silence is esid's.
 */

void
ngx_http_esi_stream_timer(ngx_http_esi_ctx_t *ctx, ngx_uint_t reset)
{
    if (ctx->in_table) {
        if (reset || !ctx->timer.timer_set) {
            ngx_add_timer(&ctx->timer, ngx_http_esi_daemon.conf->timeout);
        }

        return;
    }

    if (ctx->timer.timer_set) {
        ngx_del_timer(&ctx->timer);
    }
}


static void
ngx_http_esi_timeout_handler(ngx_event_t *ev)
{
    ngx_http_esi_ctx_t  *ctx;

    ctx = ev->data;

    if (!ctx->tx_queued && !ctx->end_sent && ctx->awaiting == 0) {

        /* esid is even with us: the page's upstream is the slow one */

        ngx_add_timer(ev, ngx_http_esi_daemon.conf->timeout);
        return;
    }

    ngx_log_error(NGX_LOG_ERR, ev->log, 0,
                  "esi: esid did not answer stream %uD in time",
                  (uint32_t) ctx->node.key);

    ngx_http_esi_daemon_drop(&ngx_http_esi_daemon, NGX_LOG_ERR,
                             "esi: dropping the connection to esid");
}


static void
ngx_http_esi_stream_wake_handler(ngx_event_t *ev)
{
    ngx_queue_t            *q;
    ngx_http_esi_ctx_t     *ctx;
    ngx_http_esi_daemon_t  *d;

    d = ev->data;

    while (!ngx_queue_empty(&d->wake)) {
        q = ngx_queue_head(&d->wake);
        ngx_queue_remove(q);

        ctx = ngx_queue_data(q, ngx_http_esi_ctx_t, wake_link);
        ctx->wake_queued = 0;

        ngx_http_esi_wake(ctx);
    }
}


static void
ngx_http_esi_resume_handler(ngx_event_t *ev)
{
    ngx_http_esi_wake(ev->data);
}


/* runs a request's output after async work, then its own write path */

static void
ngx_http_esi_wake(ngx_http_esi_ctx_t *ctx)
{
    ngx_int_t            rc;
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = ctx->request;
    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "esi wake \"%V?%V\"", &r->uri, &r->args);

    rc = ngx_http_esi_stream_process(r, ctx, NULL);

    if (rc == NGX_ERROR || ngx_http_post_request(r, NULL) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_ERROR);
    }

    ngx_http_run_posted_requests(c);
}


/*
 * The authority the client named, host and port as it sent them: the Host
 * header, else the request target's (an absolute URI in HTTP/1.x, HTTP/3's
 * ":authority", which NGINX keeps in the main request's host_start and
 * host_end without making a Host header of it, as HTTP/2 does).
 * NGX_DECLINED: it named none.
 */

static ngx_int_t
ngx_http_esi_authority(ngx_http_request_t *r, ngx_str_t *host)
{
    ngx_http_request_t  *mr;

    mr = r->main;

    if (mr->headers_in.host) {
        *host = mr->headers_in.host->value;
        return NGX_OK;
    }

    if (mr->host_start && mr->host_end) {
        host->data = mr->host_start;
        host->len = mr->host_end - mr->host_start;
        return NGX_OK;
    }

    return NGX_DECLINED;
}


/*
 * What ESI variables may read of the client's request (r->main's, also for
 * a fragment page), indexed by RequestVars pointer; cookies are apart.  The
 * values point into the request: nothing is allocated.
 */

static void
ngx_http_esi_request_vars(ngx_http_request_t *r, ngx_str_t *vars)
{
    ngx_str_t             host;
    ngx_uint_t            i;
    ngx_table_elt_t      *h[ESI_WIRE_REQUEST_VARS_POINTERS];
    ngx_http_request_t   *mr;

    mr = r->main;

    ngx_memzero(h, sizeof(h));

    h[ESI_WIRE_REQUEST_VARS_USER_AGENT_PTR] = mr->headers_in.user_agent;
    h[ESI_WIRE_REQUEST_VARS_REFERER_PTR] = mr->headers_in.referer;
    h[ESI_WIRE_REQUEST_VARS_ACCEPT_LANGUAGE_PTR] =
        ngx_http_esi_surrogate_find_header(&mr->headers_in.headers,
                                           "Accept-Language");

    for (i = 0; i < ESI_WIRE_REQUEST_VARS_POINTERS; i++) {
        if (h[i] && h[i]->value.len <= NGX_HTTP_ESI_VAR_MAX) {
            vars[i] = h[i]->value;

        } else {
            ngx_str_null(&vars[i]);
        }
    }

    if (ngx_http_esi_authority(r, &host) == NGX_OK
        && host.len <= NGX_HTTP_ESI_VAR_MAX)
    {
        vars[ESI_WIRE_REQUEST_VARS_HOST_PTR] = host;
    }

    if (mr->args.len <= NGX_HTTP_ESI_VAR_MAX) {
        vars[ESI_WIRE_REQUEST_VARS_QUERY_STRING_PTR] = mr->args;
    }
}


/*
 * The client's cookies that esi_cookies names ("*": all), as "a=1; b=2";
 * returns the length and, when dst is set, writes them there.
 */

static size_t
ngx_http_esi_cookies(ngx_http_request_t *r, ngx_array_t *names, u_char *dst)
{
    u_char            *p, *end, *start, *name_end;
    size_t             len;
    ngx_str_t         *name;
    ngx_uint_t         k, all;
    ngx_table_elt_t   *h;
#if (nginx_version < 1023000)
    ngx_uint_t         i;
    ngx_table_elt_t  **cookies;
#endif

    if (names == NULL) {
        return 0;
    }

    name = names->elts;
    all = (name[0].len == 1 && name[0].data[0] == '*');
    len = 0;

#if (nginx_version >= 1023000)

    /* NGINX 1.23.0 links the Cookie fields in a list, headers_in.cookie */

    for (h = r->main->headers_in.cookie; h; h = h->next) {

#else

    cookies = r->main->headers_in.cookies.elts;

    for (i = 0; i < r->main->headers_in.cookies.nelts; i++) {
        h = cookies[i];

#endif

        p = h->value.data;
        end = p + h->value.len;

        while (p < end) {

            while (p < end && (*p == ' ' || *p == '\t' || *p == ';')) {
                p++;
            }

            start = p;

            while (p < end && *p != ';') {
                p++;
            }

            while (p > start && (p[-1] == ' ' || p[-1] == '\t')) {
                p--;
            }

            if (p == start) {
                break;
            }

            name_end = ngx_strlchr(start, p, '=');
            if (name_end == NULL) {
                name_end = p;
            }

            for (k = 0; !all && k < names->nelts; k++) {
                if (name[k].len == (size_t) (name_end - start)
                    && ngx_strncmp(name[k].data, start, name[k].len) == 0)
                {
                    break;
                }
            }

            if (all || k < names->nelts) {
                if (len) {
                    if (dst) {
                        ngx_memcpy(dst + len, "; ", 2);
                    }

                    len += 2;
                }

                if (dst) {
                    ngx_memcpy(dst + len, start, p - start);
                }

                len += p - start;
            }

            while (p < end && *p != ';') {
                p++;
            }
        }
    }

    return len;
}


ngx_int_t
ngx_http_esi_stream_open(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_pool_cleanup_t  *cln;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_esi_cleanup;
    cln->data = ctx;

    ngx_http_esi_surrogate_hide(r);

    r->filter_need_in_memory = 1;

    if (r == r->main) {
        r->preserve_body = 1;
    }

    ctx->stream = 1;
    ctx->status = NGX_HTTP_ESI_STATUS_PROCESSED;
    ctx->last_held = &ctx->held;
    ctx->last_insn = &ctx->insns;
    ctx->last_out = &ctx->out;

    ctx->timer.handler = ngx_http_esi_timeout_handler;
    ctx->timer.data = ctx;
    ctx->timer.log = r->connection->log;

    ctx->resume.handler = ngx_http_esi_resume_handler;
    ctx->resume.data = ctx;
    ctx->resume.log = r->connection->log;

    return NGX_OK;
}


/* the stream takes an id and goes to esid, from its start or its plan's */

void
ngx_http_esi_stream_start(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    ctx->node.key = d->next_id++;
    ngx_rbtree_insert(&d->streams, &ctx->node);
    ctx->in_table = 1;

    ngx_queue_insert_tail(&d->tx_wait, &ctx->tx_link);
    ctx->tx_queued = 1;

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "esi stream %ui depth %ui", ctx->node.key, ctx->depth);

    ngx_http_esi_daemon_flush(d);
    ngx_http_esi_stream_timer(ctx, 0);
}


static void
ngx_http_esi_cleanup(void *data)
{
    ngx_http_esi_ctx_t  *ctx = data;

    ngx_http_esi_stream_forget(ctx);

    /* nothing of the request is on its way to the client any more */

    if (ctx->pins) {
        ngx_http_esi_daemon_unpin(ctx->pins, ctx->pin);
        ngx_http_esi_daemon_unmap(ctx->pins);
        ctx->pins = NULL;
    }

    if (ctx->arena) {
        ngx_http_esi_daemon_unmap(ctx->arena);
        ctx->arena = NULL;
    }

    if (ctx->wake_queued) {
        ngx_queue_remove(&ctx->wake_link);
        ctx->wake_queued = 0;
    }

    if (ctx->resume.posted) {
        ngx_delete_posted_event(&ctx->resume);
    }
}
