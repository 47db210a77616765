
/*
 * Copyright (C) The ESI project authors
 *
 * The second filter of esi_stitch, below postpone, where the page's own
 * output and its fragments' meet in order: it writes the gzip response.
 * A segment (a verbatim run esid deflated once, ended with Z_FULL_FLUSH)
 * goes out as it is, after a full flush of what was deflated live before
 * it; everything else (fragments, literals, runs without a segment, a page
 * that fell back) is deflated here.  The trailer's CRC-32 folds in each
 * segment's with crc32_combine().  proto/README.md, "Stitching".
 */


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <zlib.h>

#include "ngx_http_esi_stitch.h"


#define NGX_HTTP_ESI_STITCH_BUFS       8
#define NGX_HTTP_ESI_STITCH_BUF_SIZE   16384


typedef struct {
    z_stream                   zstream;
    ngx_uint_t                 level;
    uLong                      crc;
    uint32_t                   size;        /* plaintext bytes, mod 2^32 */

    ngx_chain_t               *in;          /* not woven in yet */
    ngx_chain_t               *out;
    ngx_chain_t              **last_out;
    ngx_chain_t               *free;
    ngx_chain_t               *busy;
    ngx_buf_t                 *zbuf;        /* deflate writes here */
    ngx_uint_t                 bufs;        /* zbufs allocated */

    unsigned                   started:1;   /* the gzip header is out */
    unsigned                   zinit:1;
    unsigned                   live:1;      /* deflated since a full flush */
    unsigned                   done:1;
} ngx_http_esi_stitch_ctx_t;


static ngx_int_t ngx_http_esi_stitch_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_int_t ngx_http_esi_stitch_weave(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx);
static ngx_int_t ngx_http_esi_stitch_deflate(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, int flush);
static ngx_int_t ngx_http_esi_stitch_finish(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx);
static ngx_int_t ngx_http_esi_stitch_link(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, ngx_buf_t *b);
static ngx_int_t ngx_http_esi_stitch_zbuf_out(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx);
static void *ngx_http_esi_stitch_alloc(void *opaque, u_int items,
    u_int size);
static void ngx_http_esi_stitch_free(void *opaque, void *address);
static ngx_int_t ngx_http_esi_stitch_init(ngx_conf_t *cf);


static ngx_http_module_t  ngx_http_esi_stitch_filter_module_ctx = {
    NULL,                                  /* preconfiguration */
    ngx_http_esi_stitch_init,              /* postconfiguration */

    NULL,                                  /* create main configuration */
    NULL,                                  /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    NULL,                                  /* create location configuration */
    NULL                                   /* merge location configuration */
};


ngx_module_t  ngx_http_esi_stitch_filter_module = {
    NGX_MODULE_V1,
    &ngx_http_esi_stitch_filter_module_ctx, /* module context */
    NULL,                                  /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    NULL,                                  /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    NULL,                                  /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* our own deflate output; segments carry the module's address instead */
#define NGX_HTTP_ESI_STITCH_ZBUF                                              \
    (ngx_buf_tag_t) &ngx_http_esi_stitch_filter_module_ctx

static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;

/* deflate, no name, no time, unknown OS */
static u_char  ngx_http_esi_stitch_header[10] =
    { 0x1f, 0x8b, Z_DEFLATED, 0, 0, 0, 0, 0, 0, 3 };

/* a final block of fixed codes holding nothing */
static u_char  ngx_http_esi_stitch_empty_end[2] = { 0x03, 0x00 };


ngx_int_t
ngx_http_esi_stitch_start(ngx_http_request_t *r, ngx_uint_t level)
{
#if (NGX_HTTP_GZIP)
    ngx_table_elt_t            *h;
    ngx_http_esi_stitch_ctx_t  *ctx;

    if (r != r->main
        || (r->headers_out.status != NGX_HTTP_OK
            && r->headers_out.status != NGX_HTTP_FORBIDDEN
            && r->headers_out.status != NGX_HTTP_NOT_FOUND))
    {
        return NGX_DECLINED;
    }

    /* Vary: Accept-Encoding follows gzip_vary, as for the gzip filter */

    r->gzip_vary = 1;

    if (!r->gzip_tested) {
        if (ngx_http_gzip_ok(r) != NGX_OK) {
            return NGX_DECLINED;
        }

    } else if (!r->gzip_ok) {
        return NGX_DECLINED;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_stitch_ctx_t));
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ctx->level = level;
    ctx->crc = crc32(0L, Z_NULL, 0);
    ctx->last_out = &ctx->out;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    /* the gzip filter declines a response with Content-Encoding */

    h->hash = 1;
    ngx_str_set(&h->key, "Content-Encoding");
    ngx_str_set(&h->value, "gzip");
    r->headers_out.content_encoding = h;

    r->main_filter_need_in_memory = 1;

    ngx_http_clear_content_length(r);
    ngx_http_clear_accept_ranges(r);
    ngx_http_weak_etag(r);

    ngx_http_set_ctx(r, ctx, ngx_http_esi_stitch_filter_module);

    return NGX_OK;

#else

    return NGX_DECLINED;

#endif
}


ngx_uint_t
ngx_http_esi_stitch_placed(ngx_cycle_t *cycle)
{
    ngx_uint_t   i, stitch, postpone;
    ngx_uint_t   none;

    none = cycle->modules_n;
    stitch = none;
    postpone = none;

    for (i = 0; cycle->modules[i]; i++) {
        if (cycle->modules[i] == &ngx_http_esi_stitch_filter_module) {
            stitch = i;

        } else if (ngx_strcmp(cycle->modules[i]->name,
                              "ngx_http_postpone_filter_module")
                   == 0)
        {
            postpone = i;
        }
    }

    /* a filter earlier in the list is called later */

    return stitch != none && postpone != none && stitch < postpone;
}


static ngx_int_t
ngx_http_esi_stitch_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_int_t                   rc, woven;
    ngx_chain_t                *cl;
    ngx_http_esi_stitch_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_esi_stitch_filter_module);

    if (ctx == NULL || ctx->done || r->header_only) {
        return ngx_http_next_body_filter(r, in);
    }

    if (in && ngx_chain_add_copy(r->pool, &ctx->in, in) != NGX_OK) {
        goto failed;
    }

    for ( ;; ) {

        woven = ngx_http_esi_stitch_weave(r, ctx);

        if (woven == NGX_ERROR) {
            goto failed;
        }

        if (ctx->out == NULL && woven == NGX_OK) {
            rc = ctx->busy ? NGX_AGAIN : NGX_OK;
            break;
        }

        /*
         * out of buffers with nothing new, this pushes the busy ones:
         * what the writer frees, deflate goes on in
         */

        rc = ngx_http_next_body_filter(r, ctx->out);

        if (rc == NGX_ERROR) {
            goto failed;
        }

        ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &ctx->out,
                                NGX_HTTP_ESI_STITCH_ZBUF);
        ctx->last_out = &ctx->out;

        if (ctx->done || woven == NGX_OK || ctx->free == NULL) {
            break;
        }
    }

    if (ctx->in) {
        r->connection->buffered |= NGX_HTTP_GZIP_BUFFERED;

    } else {
        r->connection->buffered &= ~NGX_HTTP_GZIP_BUFFERED;
    }

    return rc;

failed:

    ctx->done = 1;

    for (cl = ctx->in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;
    }

    ctx->in = NULL;
    r->connection->buffered &= ~NGX_HTTP_GZIP_BUFFERED;

    return NGX_ERROR;
}


/*
 * Moves input into ctx->out: segments as they are, everything else
 * through deflate.  NGX_OK when the input is used up, NGX_AGAIN when
 * every output buffer is busy.
 */

static ngx_int_t
ngx_http_esi_stitch_weave(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx)
{
    size_t                   size;
    u_char                  *pos;
    ngx_int_t                rc;
    ngx_buf_t               *b;
    ngx_chain_t             *cl;
    ngx_http_esi_segment_t  *seg;

    if (!ctx->started) {
        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->memory = 1;
        b->pos = ngx_http_esi_stitch_header;
        b->last = b->pos + sizeof(ngx_http_esi_stitch_header);

        if (ngx_http_esi_stitch_link(r, ctx, b) != NGX_OK) {
            return NGX_ERROR;
        }

        ctx->started = 1;
    }

    while (ctx->in) {
        b = ctx->in->buf;

        if (ngx_http_esi_is_segment(b)) {

            /* what was deflated live ends where the segment begins */

            if (ctx->live) {
                rc = ngx_http_esi_stitch_deflate(r, ctx, Z_FULL_FLUSH);
                if (rc != NGX_OK) {
                    return rc;
                }

                if (ngx_http_esi_stitch_zbuf_out(r, ctx) != NGX_OK) {
                    return NGX_ERROR;
                }

                ctx->live = 0;
            }

            seg = (ngx_http_esi_segment_t *) b;

            ctx->crc = crc32_combine(ctx->crc, seg->crc, (z_off_t) seg->size);
            ctx->size += (uint32_t) seg->size;

            if (ngx_http_esi_stitch_link(r, ctx, b) != NGX_OK) {
                return NGX_ERROR;
            }

        } else {

            if (ngx_buf_size(b) && !ngx_buf_in_memory(b)) {
                ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                              "esi stitch: a buffer not in memory");
                return NGX_ERROR;
            }

            if (b->pos < b->last) {
                if (!ctx->zinit) {
                    ctx->zstream.zalloc = ngx_http_esi_stitch_alloc;
                    ctx->zstream.zfree = ngx_http_esi_stitch_free;
                    ctx->zstream.opaque = r;

                    if (deflateInit2(&ctx->zstream, (int) ctx->level,
                                     Z_DEFLATED, -MAX_WBITS, 8,
                                     Z_DEFAULT_STRATEGY)
                        != Z_OK)
                    {
                        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                                      "esi stitch: deflateInit2() failed");
                        return NGX_ERROR;
                    }

                    ctx->zinit = 1;
                }

                pos = b->pos;
                ctx->zstream.next_in = pos;
                ctx->zstream.avail_in = (uInt) (b->last - pos);

                rc = ngx_http_esi_stitch_deflate(r, ctx, Z_NO_FLUSH);

                size = ctx->zstream.next_in - pos;
                ctx->crc = crc32(ctx->crc, pos, (uInt) size);
                ctx->size += (uint32_t) size;
                b->pos = ctx->zstream.next_in;
                ctx->live = 1;

                if (rc != NGX_OK) {
                    return rc;
                }
            }

            if (b->last_buf) {
                rc = ngx_http_esi_stitch_finish(r, ctx);
                if (rc != NGX_OK) {
                    return rc;
                }

            } else if (b->flush && ctx->live) {
                rc = ngx_http_esi_stitch_deflate(r, ctx, Z_SYNC_FLUSH);
                if (rc != NGX_OK) {
                    return rc;
                }

                if (ctx->zbuf) {
                    ctx->zbuf->flush = 1;
                }

                if (ngx_http_esi_stitch_zbuf_out(r, ctx) != NGX_OK) {
                    return NGX_ERROR;
                }
            }
        }

        cl = ctx->in;
        ctx->in = cl->next;
        ngx_free_chain(r->pool, cl);
    }

    return NGX_OK;
}


/*
 * Runs deflate on what ctx->zstream holds with this flush, into output
 * buffers: NGX_OK when the input is used up (and the flush ended),
 * NGX_AGAIN when no buffer is free; called again, it goes on.
 */

static ngx_int_t
ngx_http_esi_stitch_deflate(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, int flush)
{
    int         zrc;
    ngx_buf_t  *b;

    for ( ;; ) {

        if (ctx->zbuf == NULL || ctx->zbuf->last == ctx->zbuf->end) {

            if (ngx_http_esi_stitch_zbuf_out(r, ctx) != NGX_OK) {
                return NGX_ERROR;
            }

            if (ctx->free) {
                b = ctx->free->buf;
                ctx->free = ctx->free->next;

            } else if (ctx->bufs < NGX_HTTP_ESI_STITCH_BUFS) {
                b = ngx_create_temp_buf(r->pool,
                                        NGX_HTTP_ESI_STITCH_BUF_SIZE);
                if (b == NULL) {
                    return NGX_ERROR;
                }

                b->tag = NGX_HTTP_ESI_STITCH_ZBUF;
                ctx->bufs++;

            } else {

                /* called again with the same flush, zlib goes on */

                return NGX_AGAIN;
            }

            b->pos = b->start;
            b->last = b->start;
            b->flush = 0;
            b->last_buf = 0;
            ctx->zbuf = b;
        }

        ctx->zstream.next_out = ctx->zbuf->last;
        ctx->zstream.avail_out = (uInt) (ctx->zbuf->end - ctx->zbuf->last);

        zrc = deflate(&ctx->zstream, flush);

        if (zrc != Z_OK && zrc != Z_STREAM_END && zrc != Z_BUF_ERROR) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "esi stitch: deflate() failed: %d", zrc);
            return NGX_ERROR;
        }

        ctx->zbuf->last = ctx->zstream.next_out;

        /* zlib has more to write only when it filled the buffer */

        if (ctx->zstream.avail_out == 0) {
            continue;
        }

        return NGX_OK;
    }
}


/* the final block, then the trailer: CRC-32 and length of it all */

static ngx_int_t
ngx_http_esi_stitch_finish(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx)
{
    u_char     *p;
    ngx_int_t   rc;
    ngx_buf_t  *b;

    if (ctx->zinit) {
        rc = ngx_http_esi_stitch_deflate(r, ctx, Z_FINISH);
        if (rc != NGX_OK) {
            return rc;
        }

        if (ngx_http_esi_stitch_zbuf_out(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        (void) deflateEnd(&ctx->zstream);
        ctx->zinit = 0;

    } else {

        /* every byte came in segments: zlib was never needed */

        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->memory = 1;
        b->pos = ngx_http_esi_stitch_empty_end;
        b->last = b->pos + sizeof(ngx_http_esi_stitch_empty_end);

        if (ngx_http_esi_stitch_link(r, ctx, b) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    b = ngx_create_temp_buf(r->pool, 8);
    if (b == NULL) {
        return NGX_ERROR;
    }

    p = b->last;
    *p++ = (u_char) (ctx->crc & 0xff);
    *p++ = (u_char) ((ctx->crc >> 8) & 0xff);
    *p++ = (u_char) ((ctx->crc >> 16) & 0xff);
    *p++ = (u_char) ((ctx->crc >> 24) & 0xff);
    *p++ = (u_char) (ctx->size & 0xff);
    *p++ = (u_char) ((ctx->size >> 8) & 0xff);
    *p++ = (u_char) ((ctx->size >> 16) & 0xff);
    *p++ = (u_char) ((ctx->size >> 24) & 0xff);
    b->last = p;
    b->last_buf = 1;

    ctx->done = 1;

    return ngx_http_esi_stitch_link(r, ctx, b);
}


static ngx_int_t
ngx_http_esi_stitch_link(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, ngx_buf_t *b)
{
    ngx_chain_t  *cl;

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = NULL;

    *ctx->last_out = cl;
    ctx->last_out = &cl->next;

    return NGX_OK;
}


/* the buffer deflate wrote into goes out, or back to the free ones */

static ngx_int_t
ngx_http_esi_stitch_zbuf_out(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    b = ctx->zbuf;

    if (b == NULL) {
        return NGX_OK;
    }

    ctx->zbuf = NULL;

    if (b->last > b->pos) {
        return ngx_http_esi_stitch_link(r, ctx, b);
    }

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = ctx->free;
    ctx->free = cl;

    return NGX_OK;
}


static void *
ngx_http_esi_stitch_alloc(void *opaque, u_int items, u_int size)
{
    ngx_http_request_t *r = opaque;

    return ngx_palloc(r->pool, items * size);
}


static void
ngx_http_esi_stitch_free(void *opaque, void *address)
{
    /* the request's pool frees it */
}


static ngx_int_t
ngx_http_esi_stitch_init(ngx_conf_t *cf)
{
    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_esi_stitch_body_filter;

    return NGX_OK;
}
