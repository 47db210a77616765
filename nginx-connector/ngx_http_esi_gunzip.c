
/*
 * Copyright (C) The ESI project authors
 *
 * Inflating a gzipped body that gunzip did not decode (built only with
 * zlib).
 */


#include "ngx_http_esi.h"


static ngx_int_t ngx_http_esi_gunzip_buf(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_gunzip_out(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_chain_t ***last);
static void ngx_http_esi_gunzip_failed(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, const char *what, int rc);
static void *ngx_http_esi_gunzip_alloc(void *opaque, u_int items, u_int size);
static void ngx_http_esi_gunzip_free(void *opaque, void *address);


/*
 * Inflates a gzipped body as ngx_http_gunzip_filter_module does, into
 * buffers of esi_buffer_size that are held and emitted like any input.
 * Compressed input waits in ctx->zin while there is no room to inflate it:
 * past esi_max_page_size (the page then falls back), and, after a
 * fallback, while NGX_HTTP_ESI_INFLATE_AHEAD buffers are still on their
 * way to the client.  A ratio bomb so costs a few buffers, not its size.
 */

ngx_int_t
ngx_http_esi_gunzip(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in, ngx_chain_t **out)
{
    int            rc;
    ngx_buf_t     *b;
    ngx_chain_t   *cl, **ll;

    *out = NULL;
    ll = out;

    if (in && ngx_chain_add_copy(r->pool, &ctx->zin, in) != NGX_OK) {
        return NGX_ERROR;
    }

    if (!ctx->zstarted) {
        rc = esi_inflate_init(&ctx->gunzip, ngx_http_esi_gunzip_alloc,
                              ngx_http_esi_gunzip_free, r);
        if (rc != Z_OK) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "inflateInit2() failed: %d", rc);
            return NGX_ERROR;
        }

        ctx->zstarted = 1;
    }

    while (ctx->zin) {
        cl = ctx->zin;
        b = cl->buf;

        if (ngx_buf_size(b) && !ngx_buf_in_memory(b)) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: gzipped body not in memory");
            ngx_http_esi_gunzip_failed(r, ctx, NULL, 0);
            return NGX_ERROR;
        }

        while (b->pos < b->last) {

            if (ctx->zbuf == NULL) {
                if (!ngx_http_esi_gunzip_room(r, ctx)) {
                    return NGX_OK;
                }

                if (ngx_http_esi_gunzip_buf(r, ctx) != NGX_OK) {
                    return NGX_ERROR;
                }
            }

            rc = esi_inflate(&ctx->gunzip, &b->pos, b->last,
                             &ctx->zbuf->last, ctx->zbuf->end);

            if (rc == ESI_INFLATE_CORRUPT) {
                ngx_http_esi_gunzip_failed(r, ctx, "corrupt",
                                           ctx->gunzip.rc);
                return NGX_ERROR;
            }

            /* full: zlib may have more for the next buffer */

            if (rc == ESI_INFLATE_FULL
                && ngx_http_esi_gunzip_out(r, ctx, &ll) != NGX_OK)
            {
                return NGX_ERROR;
            }
        }

        if (b->last_buf || b->last_in_chain) {
            ctx->zlast = 1;
        }

        ctx->zin = cl->next;
        ngx_free_chain(r->pool, cl);
    }

    if (ctx->zlast && !esi_inflate_complete(&ctx->gunzip)) {
        ngx_http_esi_gunzip_failed(r, ctx, "truncated", Z_BUF_ERROR);
        return NGX_ERROR;
    }

    /* what is inflated goes on now, as gunzip does at the end of input */

    if (ctx->zbuf && ngx_buf_size(ctx->zbuf)) {
        if (ngx_http_esi_gunzip_out(r, ctx, &ll) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (ctx->zlast) {

        /*
         * the end in a buffer without memory, as gunzip ends: an empty one
         * of ours would be a "zero size buf" to the writer once it goes
         * out as it is, after a fallback
         */

        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->sync = 1;

        if (r == r->main) {
            b->last_buf = 1;

        } else {
            b->last_in_chain = 1;
        }

        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        cl->buf = b;
        cl->next = NULL;
        *ll = cl;

        esi_inflate_end(&ctx->gunzip);
        ctx->zstarted = 0;
        ctx->inflate = 0;
    }

    return NGX_OK;
}


/* whether another buffer may be inflated into now */

ngx_uint_t
ngx_http_esi_gunzip_room(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_loc_conf_t  *elcf;

    if (ctx->zfree) {
        return 1;
    }

    if (ctx->fallen) {
        return ctx->zbufs < NGX_HTTP_ESI_INFLATE_AHEAD;
    }

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    return elcf->max_page_size == 0
           || (off_t) ctx->gunzip.total <= elcf->max_page_size;
}


static ngx_int_t
ngx_http_esi_gunzip_buf(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_esi_loc_conf_t  *elcf;

    if (ctx->zfree) {
        cl = ctx->zfree;
        ctx->zfree = cl->next;

        b = cl->buf;
        ngx_free_chain(r->pool, cl);

        b->pos = b->start;
        b->last = b->start;
        b->last_buf = 0;
        b->last_in_chain = 0;

    } else {
        elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

        b = ngx_create_temp_buf(r->pool, elcf->buffer_size);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->tag = NGX_HTTP_ESI_INFLATED;
        ctx->zbufs++;
    }

    ctx->zbuf = b;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_gunzip_out(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t ***last)
{
    ngx_chain_t  *cl;

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = ctx->zbuf;
    cl->next = NULL;

    **last = cl;
    *last = &cl->next;

    ctx->zbuf = NULL;

    return NGX_OK;
}


/* nothing more of this response goes out, not even a fallback */

static void
ngx_http_esi_gunzip_failed(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    const char *what, int rc)
{
    const char  *msg;

    if (what) {
        msg = esi_inflate_message(&ctx->gunzip);

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: %s gzip body from upstream (inflate() %d%s%s) "
                      "after %uL decoded bytes, response cut off",
                      what, rc, *msg ? ": " : "", msg,
                      ctx->gunzip.total);
    }

    ctx->zerror = 1;
    ctx->status = NGX_HTTP_ESI_STATUS_ABORTED;

    ngx_http_esi_stream_forget(ctx);
}


static void *
ngx_http_esi_gunzip_alloc(void *opaque, u_int items, u_int size)
{
    ngx_http_request_t *r = opaque;

    return ngx_palloc(r->pool, (size_t) items * size);
}


static void
ngx_http_esi_gunzip_free(void *opaque, void *address)
{
    /* the request pool frees it */
}
