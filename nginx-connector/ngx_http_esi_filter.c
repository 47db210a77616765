
/*
 * Copyright (C) The ESI project authors
 *
 * The header and body filters: holding input, the fallback, output.
 */


#include "ngx_http_esi.h"


static ngx_int_t ngx_http_esi_header_filter(ngx_http_request_t *r);
static ngx_uint_t ngx_http_esi_encoding(ngx_http_request_t *r);
static ngx_int_t ngx_http_esi_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_esi_feed(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in);
static ngx_int_t ngx_http_esi_hold(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t *in);
static ngx_int_t ngx_http_esi_execute(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_fallback(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_uint_t ngx_http_esi_starved(ngx_http_esi_ctx_t *ctx);
static ngx_uint_t ngx_http_esi_body_in_memory(ngx_chain_t *in);
static ngx_int_t ngx_http_esi_own_held(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_push(ngx_http_request_t *r);


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;


/* filters */

static ngx_int_t
ngx_http_esi_header_filter(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_uint_t                 depth, encoding;
    ngx_http_request_t        *pr;
    ngx_http_esi_ctx_t        *ctx, *pctx;
    ngx_http_esi_plain_t      *plain;
    ngx_http_esi_loc_conf_t   *elcf;

    if (r->content_handler == ngx_http_esi_purge_handler) {
        return ngx_http_next_header_filter(r);
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_esi_module);

    if (ctx
        && (ctx->denied
            || (ctx->fragment
                && r->headers_out.status >= NGX_HTTP_BAD_REQUEST)))
    {
        ctx->discard = 1;
        return ngx_http_next_header_filter(r);
    }

    if (r != r->main) {
        rc = ngx_http_esi_include_header(r, &ctx);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        if (rc == NGX_OK) {
            return ngx_http_next_header_filter(r);
        }
    }

    encoding = ngx_http_esi_encoding(r);

    /*
     * An include of ours that gunzip left encoded: its bytes would be
     * spliced into a plaintext page by postpone, unseen by anyone.
     */

    if (encoding != NGX_HTTP_ESI_IDENTITY && r != r->main) {
        pctx = ngx_http_get_module_ctx(r->parent, ngx_http_esi_module);

        if (pctx && pctx->stream) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: include \"%V\" answered with "
                          "Content-Encoding \"%V\", request refused rather "
                          "than splice encoded bytes into the page; set "
                          "\"gunzip on\" in the fragment's location, or "
                          "\"proxy_set_header Accept-Encoding \"\"\" "
                          "towards its upstream",
                          &r->uri, &r->headers_out.content_encoding->value);

            pctx->status = NGX_HTTP_ESI_STATUS_ABORTED;

            return NGX_ERROR;
        }
    }

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    if (elcf->surrogate_control
        && ngx_http_esi_surrogate_control(r, elcf) != NGX_OK)
    {
        return ngx_http_next_header_filter(r);
    }

    if (!elcf->enable
        || r->header_only
        || (r->method & NGX_HTTP_HEAD)
        || r->headers_out.status == NGX_HTTP_NO_CONTENT
        || r->headers_out.status == NGX_HTTP_NOT_MODIFIED
        || r->headers_out.content_length_n == 0
        || ngx_http_test_content_type(r, &elcf->types) == NULL)
    {
        return ngx_http_next_header_filter(r);
    }

    if (encoding == NGX_HTTP_ESI_ENCODED) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "esi: \"%V\" encoded response left unprocessed: "
                      NGX_HTTP_ESI_DECODES,
                      &r->headers_out.content_encoding->value);
        return ngx_http_next_header_filter(r);
    }

    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_ctx_t));
        if (ctx == NULL) {
            return NGX_ERROR;
        }

        ngx_http_set_ctx(r, ctx, ngx_http_esi_module);
    }

    depth = 0;

    for (pr = r->parent; pr; pr = pr->parent) {
        pctx = ngx_http_get_module_ctx(pr, ngx_http_esi_module);

        if (pctx && pctx->stream) {
            depth++;
        }
    }

    ctx->depth = depth;
    ctx->request = r;
    ctx->memory_above = r->filter_need_in_memory
                        || r->main_filter_need_in_memory;

    if (ngx_http_esi_daemon.state == NGX_HTTP_ESI_IDLE) {

        /*
         * esid may be back before the backoff says so: a Unix socket
         * connect() answers at once, so try now rather than fall back
         */

        if (ngx_http_esi_daemon.reconnect.timer_set) {
            ngx_del_timer(&ngx_http_esi_daemon.reconnect);
        }

        ngx_http_esi_daemon_connect(&ngx_http_esi_daemon);
    }

    if (ngx_http_esi_daemon.state == NGX_HTTP_ESI_IDLE) {

        if (elcf->fallback == NGX_HTTP_ESI_ABORT) {
            ctx->status = NGX_HTTP_ESI_STATUS_ABORTED;
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: esid is not connected, request aborted");
            return NGX_ERROR;
        }

        ctx->status = NGX_HTTP_ESI_STATUS_PASSTHROUGH;
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "esi: esid is not connected, response passed through");

        return ngx_http_next_header_filter(r);
    }

    ngx_http_esi_replay_identify(r, ctx, elcf);

    if (encoding == NGX_HTTP_ESI_GZIP) {

        /* gunzip did not decode it: we do, and gzip may encode the result */

        ctx->inflate = 1;

        r->headers_out.content_encoding->hash = 0;
        r->headers_out.content_encoding = NULL;
    }

#if (NGX_ZLIB)

    /* before the open: it tells esid whether the plan may name segments */

    if (r == r->main && ngx_http_esi_stitches(r, elcf)) {
        rc = ngx_http_esi_stitch_start(r, elcf->stitch_level);

        if (rc == NGX_ERROR) {
            return NGX_ERROR;
        }

        ctx->segments = (rc == NGX_OK);
    }

#endif

    if (ctx->identified && !ctx->segments && !ctx->inflate) {
        plain = ngx_http_esi_replay_plain(ctx);

        if (ngx_memcmp(plain->object, ctx->object, NGX_HTTP_ESI_OBJECT_LEN)
            == 0
            && plain->zone == ctx->plan_zone)
        {
            ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                           "esi: no ESI in this object, as its plan said");

            /* the response is the object, Content-Length, ETag and all */

            ctx->status = NGX_HTTP_ESI_STATUS_PROCESSED;
            ngx_http_esi_surrogate_hide(r);

            return ngx_http_next_header_filter(r);
        }
    }

    if (ngx_http_esi_stream_open(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    /* a hit replays the worker's copy of its plan, or esid is asked */

    if (!ctx->identified
        || ngx_http_esi_replay(ctx, ngx_http_esi_plan) != NGX_OK)
    {
        ngx_http_esi_stream_start(ctx);
    }

    ngx_http_clear_content_length(r);
    ngx_http_clear_accept_ranges(r);
    ngx_http_clear_last_modified(r);
    ngx_http_clear_etag(r);

    return ngx_http_next_header_filter(r);
}


static ngx_uint_t
ngx_http_esi_encoding(ngx_http_request_t *r)
{
    ngx_str_t  *ce;

#if !(NGX_HTTP_GZIP)

    /*
     * Without the gzip and gunzip modules an upstream's Content-Encoding
     * is copied as any other header, and r->headers_out.content_encoding
     * is not set: find it, as those modules would have it found
     */

    if (r->headers_out.content_encoding == NULL) {
        r->headers_out.content_encoding =
            ngx_http_esi_surrogate_find_header(&r->headers_out.headers,
                                               "Content-Encoding");
    }
#endif

    if (r->headers_out.content_encoding == NULL
        || r->headers_out.content_encoding->hash == 0)
    {
        return NGX_HTTP_ESI_IDENTITY;
    }

    ce = &r->headers_out.content_encoding->value;

    if (ce->len == 0
        || (ce->len == sizeof("identity") - 1
            && ngx_strncasecmp(ce->data, (u_char *) "identity", ce->len) == 0))
    {
        return NGX_HTTP_ESI_IDENTITY;
    }

#if (NGX_ZLIB)
    if (ce->len == sizeof("gzip") - 1
        && ngx_strncasecmp(ce->data, (u_char *) "gzip", ce->len) == 0)
    {
        return NGX_HTTP_ESI_GZIP;
    }
#endif

    return NGX_HTTP_ESI_ENCODED;
}


static ngx_int_t
ngx_http_esi_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t            rc;
    ngx_chain_t         *cl;
    ngx_http_esi_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_esi_module);

    if (ctx && ctx->discard) {
        for (cl = in; cl; cl = cl->next) {
            cl->buf->pos = cl->buf->last;
            cl->buf->file_pos = cl->buf->file_last;

            /* a parallel include has no alt= nor onerror: it fails here */

            if (cl->buf->last_in_chain && (ctx->oversized || ctx->denied)
                && !r->waited)
            {
                return ngx_http_esi_include_marker(r);
            }
        }

        /*
         * nothing of it goes on; what postpone holds for it (the marker,
         * while another request was active) goes when asked to
         */

        return in ? NGX_OK : ngx_http_esi_output_next(r, NULL, NULL);
    }

    if (ctx && ctx->limited
        && ngx_http_esi_include_limit(r, ctx, &in) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (ctx == NULL || !ctx->stream
        || (ctx->fallen && !ctx->inflate && ctx->out == NULL
            && ctx->busy == NULL && ctx->held == NULL))
    {
        return ngx_http_esi_output_next(r, ctx, in);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "esi body filter \"%V?%V\"", &r->uri, &r->args);

    if (ctx->zerror) {
        return NGX_ERROR;
    }

    for ( ;; ) {
        rc = ngx_http_esi_feed(r, ctx, in);

#if (NGX_ZLIB)
        /*
         * what went out may have made room for more of a gzipped body: as
         * gunzip does, inflate until the client stops taking it
         */

        if (rc != NGX_ERROR && ctx->zin
            && ngx_http_esi_gunzip_room(r, ctx))
        {
            in = NULL;
            continue;
        }
#endif

        return rc;
    }
}


static ngx_int_t
ngx_http_esi_feed(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in)
{
    ngx_int_t                 rc;
    ngx_chain_t              *cl, *zin;
    ngx_http_esi_loc_conf_t  *elcf;

    zin = NULL;

    if (ctx->bodiless && !ctx->segments && ctx->received == 0
        && ngx_http_esi_body_in_memory(in))
    {
        /* a filter below ESI asked for it in memory after all: it is read */

        ctx->bodiless = 0;
    }

    if (ctx->bodiless) {

        /*
         * the cache file's buffers: counted, not read; a plain client's
         * runs go as ranges of the file (see splice_verbatim)
         */

        for (cl = in; cl; cl = cl->next) {

            if (!ctx->segments && ngx_buf_size(cl->buf)) {

                if (ctx->body_file == NULL) {
                    ctx->body_file = cl->buf->file;
                    ctx->body_start = cl->buf->file_pos;
                }

                if (ngx_buf_in_memory(cl->buf)
                    || cl->buf->file != ctx->body_file
                    || cl->buf->file_pos != ctx->body_start + ctx->received)
                {
                    ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                                  "esi: a cache body not in one file");
                    return NGX_ERROR;
                }
            }

            ctx->received += ngx_buf_size(cl->buf);

            if (cl->buf->last_buf) {
                ctx->input_done = 1;
            }

            cl->buf->pos = cl->buf->last;
            cl->buf->file_pos = cl->buf->file_last;
        }

        if (ctx->planned && ngx_http_esi_plan_run(ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        return ngx_http_esi_filter_process(r, ctx, NULL);
    }

#if (NGX_ZLIB)
    if (ctx->inflate) {

        /* from here on "in" is plaintext, in buffers of our own */

        if (ngx_http_esi_gunzip(r, ctx, in, &zin) != NGX_OK) {
            return NGX_ERROR;
        }

        in = zin;
    }
#endif

    if (!ctx->failed && !ctx->fallen) {
        for (cl = in; cl; cl = cl->next) {
            if (ngx_buf_size(cl->buf) && !ngx_buf_in_memory(cl->buf)) {
                ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                              "esi: body not in memory");
                ngx_http_esi_stream_fail(ctx);
                break;
            }
        }
    }

    if (!ctx->failed && !ctx->fallen) {
        if (ngx_http_esi_hold(r, ctx, in) != NGX_OK) {
            return NGX_ERROR;
        }

        elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

        if (elcf->max_page_size && ctx->received > elcf->max_page_size) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: \"%V\" is larger than esi_max_page_size "
                          "%O, esi_fallback applies", &r->uri,
                          elcf->max_page_size);
            ngx_http_esi_stream_fail(ctx);
        }

        if (ctx->planned && ngx_http_esi_plan_run(ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        if (in && !ctx->tx_queued && ctx->in_table) {
            ngx_queue_insert_tail(&ngx_http_esi_daemon.tx_wait,
                                  &ctx->tx_link);
            ctx->tx_queued = 1;

            ngx_http_esi_daemon_flush(&ngx_http_esi_daemon);
            ngx_http_esi_stream_timer(ctx, 0);
        }

        in = NULL;
    }

    rc = ngx_http_esi_filter_process(r, ctx, in);

    /* the links, not the buffers: those are held or went out */

    while (zin) {
        cl = zin;
        zin = cl->next;
        ngx_free_chain(r->pool, cl);
    }

    return rc;
}


/* whether the first buffer of the body that has bytes is in memory */

static ngx_uint_t
ngx_http_esi_body_in_memory(ngx_chain_t *in)
{
    for ( /* void */ ; in; in = in->next) {
        if (ngx_buf_size(in->buf)) {
            return ngx_buf_in_memory(in->buf) || !in->buf->in_file;
        }
    }

    return 0;
}


static ngx_int_t
ngx_http_esi_hold(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in)
{
    off_t                 size;
    ngx_buf_t            *b, *nb;
    ngx_http_esi_held_t  *h;

    for ( /* void */ ; in; in = in->next) {
        b = in->buf;

        if (b->last_buf || b->last_in_chain) {
            ctx->input_done = 1;
        }

        size = ngx_buf_size(b);

        if (size == 0) {
            continue;
        }

        /*
         * An unbuffered upstream reuses its one buffer, and signals the end
         * of the body only once that buffer is consumed; esid may keep the
         * last bytes until the end: hold a copy, so neither waits for the
         * other.
         */

        if (r->upstream && !r->upstream->buffering && b->tag != ctx
            && b->tag != NGX_HTTP_ESI_INFLATED)
        {
            nb = ngx_create_temp_buf(r->pool, (size_t) size);
            if (nb == NULL) {
                return NGX_ERROR;
            }

            nb->last = ngx_cpymem(nb->pos, b->pos, (size_t) size);
            nb->tag = ctx;
            b->pos = b->last;
            b = nb;
        }

        if (ctx->free_held) {
            h = ctx->free_held;
            ctx->free_held = h->next;

        } else {
            h = ngx_palloc(r->pool, sizeof(ngx_http_esi_held_t));
            if (h == NULL) {
                return NGX_ERROR;
            }
        }

        h->buf = b;
        h->start = b->pos;
        h->offset = ctx->received;
        h->end = ctx->received + size;
        h->refs = 0;
        h->next = NULL;

        *ctx->last_held = h;
        ctx->last_held = &h->next;

        if (ctx->send_held == NULL && !ctx->planned) {
            ctx->send_held = h;
        }

        ctx->received = h->end;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_esi_filter_process(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in)
{
    off_t         size;
    ngx_int_t     rc;
    ngx_uint_t    starved;
    ngx_chain_t  *cl;

    if (ctx->zerror) {
        return NGX_ERROR;
    }

    if (!ctx->fallen && !ctx->failed) {
        if (ngx_http_esi_execute(r, ctx) == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    if (ctx->failed && !ctx->fallen) {
        if (ngx_http_esi_fallback(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    /* after a fallback, later input goes out as it came */

    for ( /* void */ ; in; in = in->next) {

        if (ctx->passed) {
            size = ngx_min(ctx->passed, ngx_buf_size(in->buf));
            in->buf->pos += size;
            ctx->passed -= size;

            if (ngx_buf_size(in->buf) == 0 && !in->buf->last_buf
                && !in->buf->last_in_chain && !in->buf->flush)
            {
                continue;
            }
        }

        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        cl->buf = in->buf;
        cl->next = NULL;
        *ctx->last_out = cl;
        ctx->last_out = &cl->next;
    }

    /*
     * postpone may still hold our output behind an include, last_buf too;
     * and the filters below may hold what we gave them (gzip's copy, the
     * writer's): only the writer's call through us lets them go on
     */

    starved = ngx_http_esi_starved(ctx);

    if (starved && ngx_http_esi_output_flush_held(r, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ctx->out == NULL && ctx->busy == NULL && r->postponed == NULL
        && !r->connection->buffered)
    {
        ngx_http_esi_output_release(ctx);
        rc = NGX_OK;

    } else {
        rc = ngx_http_esi_output(r, ctx);
    }

    if (starved && rc != NGX_ERROR && ngx_http_esi_own_held(r, ctx) != NGX_OK)
    {
        return NGX_ERROR;
    }

    return rc;
}


/* the instructions esid sent, then a plan's next batch once they ran */

static ngx_int_t
ngx_http_esi_execute(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_int_t  rc;

    for ( ;; ) {
        rc = ngx_http_esi_splice_execute(r, ctx);

        if (rc != NGX_OK || ctx->failed || ctx->insns || ctx->wait
            || !ctx->plan_more)
        {
            return rc;
        }

        if (ngx_http_esi_plan_run(ctx) != NGX_OK) {
            return NGX_ERROR;
        }
    }
}


static ngx_int_t
ngx_http_esi_fallback(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    off_t                     cut;
    ngx_int_t                 rc;
    ngx_http_esi_loc_conf_t  *elcf;

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    ctx->fallen = 1;
    ctx->insns = NULL;
    ctx->last_insn = &ctx->insns;
    ctx->wait = NULL;

    /* what open attempts hold goes out as it is, before the rest */

    while (ctx->attempts) {
        while (!ctx->tries[ctx->ntries - 1].attempt) {
            ctx->ntries--;
        }

        ngx_http_esi_splice_try_close(ctx, 1);
        ctx->ntries--;
    }

    ctx->ntries = 0;
    ctx->skip = 0;

    if (ctx->done) {
        return NGX_OK;
    }

    if (elcf->fallback == NGX_HTTP_ESI_ABORT) {
        ctx->status = NGX_HTTP_ESI_STATUS_ABORTED;
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: processing failed, request aborted");
        return NGX_ERROR;
    }

    ctx->status = NGX_HTTP_ESI_STATUS_PASSTHROUGH;
    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "esi: processing failed, rest of the body passed through "
                  "from offset %O", ngx_max(ctx->released, ctx->verbatim_end));

    /* what esid had not covered yet goes out unprocessed */

    cut = ngx_max(ctx->released, ctx->verbatim_end);

    if (cut < ctx->received) {
        rc = ngx_http_esi_splice_verbatim(r, ctx, cut, ctx->received);
        if (rc != NGX_OK) {
            return NGX_ERROR;
        }

    } else {

        /* a segment went out for bytes still to come: they must not */

        ctx->passed = cut - ctx->received;
    }

    ctx->released = NGX_MAX_OFF_T_VALUE;
    ctx->send_held = NULL;

    if (ctx->input_done) {
        return ngx_http_esi_output_final(r, ctx);
    }

    return NGX_OK;
}


/*
 * Whether the stream can go on only with more of the body: esid answered
 * all of it that it has, or the plan runs past what arrived, and every
 * instruction has run.  The body's buffers it holds must then go back to
 * whoever reads the body, who may have no other (output_buffers 1, or a
 * construct longer than a buffer) and would read no more.
 */

static ngx_uint_t
ngx_http_esi_starved(ngx_http_esi_ctx_t *ctx)
{
    if (ctx->input_done || ctx->failed || ctx->fallen || ctx->insns
        || ctx->wait)
    {
        return 0;
    }

    if (ctx->planned) {
        return ctx->plan_starved;
    }

    return !ctx->plan_wait && ctx->awaiting == 0
           && ctx->sent == ctx->received;
}


/*
 * A starved stream holds copies of the bytes it has not released yet
 * rather than the body's buffers they are in (those output still points
 * into go back once it went out).
 */

static ngx_int_t
ngx_http_esi_own_held(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    off_t                 from;
    size_t                size;
    ngx_buf_t            *b, *nb;
    ngx_http_esi_held_t  *h;

    for (h = ctx->held; h; h = h->next) {
        b = h->buf;
        from = ngx_max(h->offset, ctx->released);

        if (h->refs || from >= h->end || b->tag == ctx
            || b->tag == NGX_HTTP_ESI_INFLATED)
        {
            continue;
        }

        size = (size_t) (h->end - from);

        nb = ngx_create_temp_buf(r->pool, size);
        if (nb == NULL) {
            return NGX_ERROR;
        }

        nb->last = ngx_cpymem(nb->pos, h->start + (from - h->offset), size);
        nb->tag = ctx;

        /* no later instruction reads below "released" */

        b->pos = b->last;

        h->buf = nb;
        h->start = nb->pos;
        h->offset = from;
    }

    return NGX_OK;
}


/*
 * A response that mixed memory with ranges of a file (a plain client's
 * hit replayed from its plan, an include served from a file) went out
 * corked, with tcp_nopush.  On Linux NGINX uncorks a keepalive connection
 * but leaves Nagle's algorithm on, and the response's last short segment
 * then waits for the client's delayed ACK, 40 ms a request (an earlier
 * short one, where memory and file met, is unacknowledged): once the
 * whole response is with the kernel, TCP_NODELAY, as tcp_nodelay asks,
 * sends it at once, and NGINX turns it off again before it next corks.
 * An include whose location has tcp_nopush off marks the connection so
 * while it is corked, and NGINX would never uncork it: it is uncorked
 * here (a Unix socket's connection is marked so from the start).
 */

static ngx_int_t
ngx_http_esi_push(ngx_http_request_t *r)
{
    ngx_connection_t          *c;
    ngx_http_core_loc_conf_t  *clcf;

    c = r->connection;

    if (ngx_http_get_module_ctx(r, ngx_http_esi_module) == NULL) {
        return NGX_OK;
    }

#if (NGX_HTTP_V2)
    if (r->stream) {
        return NGX_OK;
    }
#endif

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    switch (c->tcp_nopush) {

    case NGX_TCP_NOPUSH_SET:
        if (clcf->tcp_nodelay) {
            (void) ngx_tcp_nodelay(c);
        }

        break;

    case NGX_TCP_NOPUSH_DISABLED:
        if (clcf->tcp_nopush && c->tcp_nodelay != NGX_TCP_NODELAY_DISABLED
            && ngx_tcp_push(c->fd) == -1)
        {
            ngx_connection_error(c, ngx_socket_errno,
                                 ngx_tcp_push_n " failed");
        }

        break;

    default: /* NGX_TCP_NOPUSH_UNSET */
        break;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_esi_filter_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_REWRITE_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_esi_surrogate_capability;

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_esi_push;

    /* esi_include_access: subrequests pass the access phase by */

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_esi_include_access;

    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_esi_header_filter;

    ngx_http_esi_output_init(ngx_http_top_body_filter);
    ngx_http_top_body_filter = ngx_http_esi_body_filter;

    return NGX_OK;
}
