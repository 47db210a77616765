
/*
 * Copyright (C) The ESI project authors
 *
 * The output path: the chain of a request's output, its buffers, and
 * where it goes below the ESI filter.  The files that produce output
 * (filter.c, splice.c, include.c) call down to it; it calls none of them.
 */


#include "ngx_http_esi.h"


static ngx_int_t ngx_http_esi_output_capture(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *to, ngx_chain_t *in);
static void ngx_http_esi_output_recycle(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_buf_t *b, ngx_chain_t *cl);


static ngx_http_output_body_filter_pt  ngx_http_esi_output_next_filter;


/* the body filter below the ESI filter's, taken when the filter is placed */

void
ngx_http_esi_output_init(ngx_http_output_body_filter_pt next)
{
    ngx_http_esi_output_next_filter = next;
}


/*
 * Where the output of a request goes when it leaves this filter: down to
 * postpone, or, for an include inside an attempt, into the attempt's held
 * chain.  Postpone is called even then, with no data, so that it wakes
 * the request's own includes in order.
 */

ngx_int_t
ngx_http_esi_output_next(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t *in)
{
    if (ctx && ctx->capture) {
        if (ngx_http_esi_output_capture(r, ctx->capture, in) != NGX_OK) {
            return NGX_ERROR;
        }

        in = NULL;
    }

    return ngx_http_esi_output_next_filter(r, in);
}


/*
 * Copies an include's output into the attempt that holds it: upstream
 * buffers are reused as soon as they are consumed.  The copies live in the
 * request's pool until it ends, so all the page's attempts together may
 * copy esi_max_page_size; past it the attempt fails.  After a fallback the
 * bytes have no place to go.
 */

static ngx_int_t
ngx_http_esi_output_capture(ngx_http_request_t *r, ngx_http_esi_ctx_t *to,
    ngx_chain_t *in)
{
    off_t                     size;
    u_char                   *p;
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_esi_loc_conf_t  *elcf;

    elcf = ngx_http_get_module_loc_conf(to->request, ngx_http_esi_module);

    for ( /* void */ ; in; in = in->next) {
        size = ngx_buf_size(in->buf);

        if (size == 0) {
            continue;
        }

        if (to->attempts == 0 || to->fallen) {
            /* void */

        } else if (!ngx_buf_in_memory(in->buf)) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: include \"%V\" in an attempt is not in "
                          "memory", &r->uri);
            ngx_http_esi_try_failed(to);

        } else if (elcf->max_page_size
                   && to->captured + size > elcf->max_page_size)
        {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: includes held by an attempt exceed "
                          "esi_max_page_size %O, the attempt fails",
                          elcf->max_page_size);
            ngx_http_esi_try_failed(to);

        } else {
            p = ngx_pnalloc(r->pool, (size_t) size);
            if (p == NULL) {
                return NGX_ERROR;
            }

            cl = ngx_http_esi_output_link(to->request, to);
            if (cl == NULL) {
                return NGX_ERROR;
            }

            b = cl->buf;
            b->memory = 1;
            b->pos = p;
            b->last = ngx_cpymem(p, in->buf->pos, (size_t) size);

            to->captured += size;
        }

        in->buf->pos = in->buf->last;
        in->buf->file_pos = in->buf->file_last;
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_esi_output_final(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    cl = ngx_http_esi_output_link(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;
    b->sync = 1;

    if (r == r->main) {
        b->last_buf = 1;

    } else {
        b->last_in_chain = 1;
    }

    ctx->done = 1;

    return NGX_OK;
}


ngx_chain_t *
ngx_http_esi_output_link(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_buf_t    *b;
    ngx_uint_t    i;
    ngx_chain_t  *cl;

    if (ctx->free == NULL) {
        b = ngx_palloc(r->pool, NGX_HTTP_ESI_BATCH * sizeof(ngx_buf_t));
        cl = ngx_palloc(r->pool, NGX_HTTP_ESI_BATCH * sizeof(ngx_chain_t));

        if (b == NULL || cl == NULL) {
            return NULL;
        }

        for (i = 0; i < NGX_HTTP_ESI_BATCH; i++) {
            cl[i].buf = &b[i];
            cl[i].next = ctx->free;
            ctx->free = &cl[i];
        }
    }

    cl = ctx->free;
    ctx->free = cl->next;
    b = cl->buf;
    ngx_memzero(b, sizeof(ngx_buf_t));

    b->tag = (ngx_buf_tag_t) &ngx_http_esi_module;
    cl->next = NULL;

    *ctx->last_out = cl;
    ctx->last_out = &cl->next;

    ctx->flushed = 0;

    return cl;
}


/*
 * Small pieces of output (a value, the tags between a construct's values)
 * are copied one after another into a buffer of their own: linked apart,
 * each would cost a buf in every filter and an iovec in writev, more than
 * copying its few bytes.  A larger piece (an attempt's) gets a buffer of
 * its size.
 */

ngx_int_t
ngx_http_esi_output_pack(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    u_char *data, size_t len)
{
    size_t        size;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    b = ctx->pack;

    if (b == NULL || ctx->last_out != ctx->pack_next
        || (size_t) (b->end - b->last) < len)
    {
        cl = ngx_http_esi_output_link(r, ctx);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        b = cl->buf;

        size = ngx_max(len, NGX_HTTP_ESI_PACK_SIZE);

        b->start = ngx_pnalloc(r->pool, size);
        if (b->start == NULL) {
            return NGX_ERROR;
        }

        b->pos = b->start;
        b->last = b->start;
        b->end = b->start + size;
        b->temporary = 1;

        ctx->pack = b;
        ctx->pack_next = &cl->next;
    }

    b->last = ngx_cpymem(b->last, data, len);

    return NGX_OK;
}


ngx_int_t
ngx_http_esi_output(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_int_t             rc;
    ngx_buf_t            *b;
    ngx_chain_t          *cl;
    ngx_http_esi_held_t  *h;

    if (ctx->attempts) {

        /* held until the attempt's outcome is known */

        rc = ngx_http_esi_output_next(r, ctx, NULL);

    } else {
        rc = ngx_http_esi_output_next(r, ctx, ctx->out);

        if (ctx->busy == NULL) {
            ctx->busy = ctx->out;

        } else {
            for (cl = ctx->busy; cl->next; cl = cl->next) { /* void */ }
            cl->next = ctx->out;
        }

        ctx->out = NULL;
        ctx->last_out = &ctx->out;
        ctx->pack = NULL;
    }

    while (ctx->busy) {

        cl = ctx->busy;
        b = cl->buf;

        if (ngx_buf_size(b) != 0) {
            break;
        }

        ctx->busy = cl->next;

        if (b->tag == NGX_HTTP_ESI_INFLATED) {

            /* one that went out as it is, after a fallback */

            ngx_http_esi_output_recycle(r, ctx, b, cl);
            continue;
        }

        if (b->tag != (ngx_buf_tag_t) &ngx_http_esi_module) {
            ngx_free_chain(r->pool, cl);
            continue;
        }

        if (b->shadow) {
            for (h = ctx->held; h; h = h->next) {
                if (h->buf == b->shadow && h->refs) {
                    h->refs--;
                    break;
                }
            }
        }

        if (ngx_buf_in_memory(b)) {
            cl->next = ctx->free;
            ctx->free = cl;
        }
    }

    ngx_http_esi_output_release(ctx);

    return rc;
}


/* input is consumed once esid released it and its output went out */

void
ngx_http_esi_output_release(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_request_t   *r;
    ngx_http_esi_held_t  *h;

    while (ctx->held) {
        h = ctx->held;

        if (h->refs || h->end > ctx->released) {
            break;
        }

        h->buf->pos = h->buf->last;

        if (h->buf->tag == NGX_HTTP_ESI_INFLATED) {
            ngx_http_esi_output_recycle(ctx->request, ctx, h->buf, NULL);
        }

        ctx->held = h->next;
        h->next = ctx->free_held;
        ctx->free_held = h;
    }

    if (ctx->held == NULL) {
        ctx->last_held = &ctx->held;
    }

    r = ctx->request;

    /* output waiting further down is not ours to report */

    if (ctx->out || ctx->zin || (!ctx->done && !ctx->fallen)) {
        r->buffered |= NGX_HTTP_ESI_BUFFERED;

    } else {
        r->buffered &= ~NGX_HTTP_ESI_BUFFERED;
    }
}


/*
 * Output that points into the body's buffers goes out now, however small:
 * the write filter would hold it back (postpone_output) until more output
 * came, that is, until more body was read.  Not while an attempt holds
 * the output: the attempt's start flushed what came before it.
 */

ngx_int_t
ngx_http_esi_output_flush_held(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_chain_t          *cl;
    ngx_http_esi_held_t  *h;

    if (ctx->flushed || ctx->attempts) {
        return NGX_OK;
    }

    for (h = ctx->held; h; h = h->next) {
        if (h->refs && h->buf->tag != ctx
            && h->buf->tag != NGX_HTTP_ESI_INFLATED)
        {
            break;
        }
    }

    if (h == NULL) {
        return NGX_OK;
    }

    cl = ngx_http_esi_output_link(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf->flush = 1;
    ctx->flushed = 1;

    return NGX_OK;
}


/* an inflated buffer nothing refers to any more */

static void
ngx_http_esi_output_recycle(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_buf_t *b, ngx_chain_t *cl)
{
    if (cl == NULL) {
        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return;
        }
    }

    cl->buf = b;
    cl->next = ctx->zfree;
    ctx->zfree = cl;
}
