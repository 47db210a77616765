
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

/*
 * The live stream's memLevel: a hash of 8 KB rather than zlib's default
 * 64 KB, which deflateInit and every Z_FULL_FLUSH (one before each
 * segment) clear.  What it deflates, fragments and short runs, is mostly
 * small; 200 KB of HTML comes out 0.6% larger.
 */
#define NGX_HTTP_ESI_STITCH_MEMLEVEL   5

/*
 * Deflate streams a worker keeps between responses, reset.  A stitched
 * hit deflates only its fragments, mostly a few hundred bytes, and setting
 * up zlib's state for them (144 KB from malloc, and fresh pages) cost more
 * than deflating them.  A response takes one with its first byte to
 * deflate and gives it back with its trailer, or when it is over.
 */
#define NGX_HTTP_ESI_STITCH_IDLE       8

/*
 * A run between segments no longer than this, a fragment of a few dozen
 * bytes as a rule, goes as a stored block: deflating it would save little
 * and cost more than the rest of its share of the hit (Varnish sends every
 * plain include so).  esid's segments start at the same length.
 */
#define NGX_HTTP_ESI_STITCH_STORED     128

/* a stored block's header: BFINAL and BTYPE 00 in a byte, LEN, NLEN */
#define NGX_HTTP_ESI_STITCH_STORED_HEADER  5


typedef struct ngx_http_esi_stitch_zstream_s  ngx_http_esi_stitch_zstream_t;

struct ngx_http_esi_stitch_zstream_s {
    z_stream                        zstream;
    ngx_uint_t                      level;
    ngx_http_esi_stitch_zstream_t  *next;   /* the idle ones */
};


typedef struct {
    ngx_http_esi_stitch_zstream_t *z;       /* while deflating */
    ngx_uint_t                 level;
    uLong                      crc;
    uint32_t                   size;        /* plaintext bytes, mod 2^32 */

    ngx_chain_t               *in;          /* not taken yet */
    ngx_buf_t                 *in_buf;      /* deflate reads it */
    ngx_buf_t                 *held;        /* a short run, to be stored */
    ngx_http_esi_segment_t    *segment;     /* after the live stream's end */
    int                        flush;       /* owed when in_buf is used */
    ngx_chain_t               *out;
    ngx_chain_t              **last_out;
    ngx_chain_t               *free;
    ngx_chain_t               *busy;
    ngx_buf_t                 *zbuf;        /* deflate writes here */
    ngx_uint_t                 bufs;        /* zbufs allocated */
    ngx_event_t                release;     /* ctx->out goes, posted */

    unsigned                   started:1;   /* the gzip header is out */
    unsigned                   live:1;      /* deflated since a full flush */
    unsigned                   done:1;
    unsigned                   releasing:1;
} ngx_http_esi_stitch_ctx_t;


static ngx_int_t ngx_http_esi_stitch_body_filter(ngx_http_request_t *r,
    ngx_chain_t *in);
static ngx_uint_t ngx_http_esi_stitch_hold(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx);
static void ngx_http_esi_stitch_release(ngx_event_t *ev);
static void ngx_http_esi_stitch_cleanup(void *data);
static ngx_int_t ngx_http_esi_stitch_weave(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx);
static ngx_int_t ngx_http_esi_stitch_take(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, ngx_buf_t *b);
static ngx_int_t ngx_http_esi_stitch_flushed(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx);
static ngx_int_t ngx_http_esi_stitch_hold_run(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, ngx_buf_t *b);
static ngx_int_t ngx_http_esi_stitch_feed(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, u_char *data, size_t len,
    ngx_buf_t *in_buf);
static ngx_int_t ngx_http_esi_stitch_store(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, ngx_uint_t final, ngx_uint_t flush);
static ngx_int_t ngx_http_esi_stitch_deflate(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx);
static ngx_int_t ngx_http_esi_stitch_finish(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx);
static ngx_int_t ngx_http_esi_stitch_link(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, ngx_buf_t *b);
static ngx_int_t ngx_http_esi_stitch_constant(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, u_char *data, size_t len);
static ngx_int_t ngx_http_esi_stitch_zbuf_out(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx);
static ngx_http_esi_stitch_zstream_t *ngx_http_esi_stitch_zstream_get(
    ngx_http_request_t *r, ngx_uint_t level);
static void ngx_http_esi_stitch_zstream_put(ngx_http_esi_stitch_zstream_t *z);
static void *ngx_http_esi_stitch_zalloc(void *opaque, u_int items,
    u_int size);
static void ngx_http_esi_stitch_zfree(void *opaque, void *address);
static ngx_int_t ngx_http_esi_stitch_init(ngx_conf_t *cf);
static void ngx_http_esi_stitch_exit_process(ngx_cycle_t *cycle);


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
    ngx_http_esi_stitch_exit_process,      /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* our own deflate output; segments carry the module's address instead */
#define NGX_HTTP_ESI_STITCH_ZBUF                                              \
    ((ngx_buf_tag_t) &ngx_http_esi_stitch_filter_module_ctx)

static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;

/* the gzip filter, whose "gzip" flag esi_stitch's default follows */
static ngx_module_t                     *ngx_http_esi_stitch_gzip_module;

/* deflate, no name, no time, unknown OS */
static u_char  ngx_http_esi_stitch_header[10] =
    { 0x1f, 0x8b, Z_DEFLATED, 0, 0, 0, 0, 0, 0, 3 };

/* a final block of fixed codes holding nothing */
static u_char  ngx_http_esi_stitch_empty_end[2] = { 0x03, 0x00 };

static ngx_http_esi_stitch_zstream_t  *ngx_http_esi_stitch_idle;
static ngx_uint_t                      ngx_http_esi_stitch_nidle;


ngx_int_t
ngx_http_esi_stitch_start(ngx_http_request_t *r, ngx_uint_t level)
{
#if (NGX_HTTP_GZIP)
    ngx_table_elt_t            *h;
    ngx_pool_cleanup_t         *cln;
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
    ctx->flush = Z_NO_FLUSH;
    ctx->last_out = &ctx->out;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    cln->handler = ngx_http_esi_stitch_cleanup;
    cln->data = ctx;

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


/*
 * The gzip filter keeps its configuration to itself; the first member of
 * its location configuration (ngx_http_gzip_conf_t) is the "gzip" flag, as
 * ngx_http_esi_layout_check() proved from its directive table.
 */

ngx_uint_t
ngx_http_esi_stitch_gzip_on(ngx_http_request_t *r)
{
    ngx_flag_t  *enable;

    if (ngx_http_esi_stitch_gzip_module == NULL) {
        return 0;
    }

    enable = r->loc_conf[ngx_http_esi_stitch_gzip_module->ctx_index];

    return *enable == 1;
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

        if (woven == NGX_OK && ngx_http_esi_stitch_hold(r, ctx)) {
            rc = NGX_AGAIN;
            break;
        }

        /*
         * out of buffers with nothing new, this pushes the busy ones:
         * what the writer frees, deflate goes on in
         */

        rc = ngx_http_next_body_filter(r, ctx->out);

        if (ctx->release.posted) {
            ngx_delete_posted_event(&ctx->release);
        }

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

    if (ctx->in || ctx->out || ctx->held
        || (ctx->z && ctx->z->zstream.avail_in) || ctx->flush != Z_NO_FLUSH)
    {
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

    if (ctx->in_buf) {
        ctx->in_buf->pos = ctx->in_buf->last;
        ctx->in_buf = NULL;
    }

    if (ctx->segment) {
        ctx->segment->buf.pos = ctx->segment->buf.last;
        ctx->segment = NULL;
    }

    ctx->in = NULL;
    r->connection->buffered &= ~NGX_HTTP_GZIP_BUFFERED;

    return NGX_ERROR;
}


/*
 * What the page sends goes at the next turn of the worker's event loop,
 * in one write with whatever joined it meanwhile: the fragment a hit asks
 * for in this turn is mostly back by the next one when the worker is busy,
 * so the page goes in one write rather than one before the fragment and
 * one after (the client woken once), and when it is not, the wait is a
 * turn with nothing to do.  The end of the response and a flush go at
 * once, and so does everything when the output buffers run out.
 */

static ngx_uint_t
ngx_http_esi_stitch_hold(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx)
{
    ngx_chain_t  *cl;

    if (ctx->releasing) {
        return 0;
    }

    for (cl = ctx->out; cl; cl = cl->next) {
        if (cl->buf->last_buf || cl->buf->flush) {
            return 0;
        }
    }

    if (ctx->release.handler == NULL) {
        ctx->release.handler = ngx_http_esi_stitch_release;
        ctx->release.data = r;
        ctx->release.log = r->connection->log;
    }

    if (!ctx->release.posted) {
        ngx_post_event(&ctx->release, &ngx_posted_next_events);
    }

    return 1;
}


static void
ngx_http_esi_stitch_release(ngx_event_t *ev)
{
    ngx_int_t                   rc;
    ngx_connection_t           *c;
    ngx_http_request_t         *r;
    ngx_http_esi_stitch_ctx_t  *ctx;

    r = ev->data;
    c = r->connection;
    ctx = ngx_http_get_module_ctx(r, ngx_http_esi_stitch_filter_module);

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, c->log, 0, "esi stitch release");

    ctx->releasing = 1;
    rc = ngx_http_esi_stitch_body_filter(r, NULL);
    ctx->releasing = 0;

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_ERROR);
    }

    ngx_http_run_posted_requests(c);
}


/*
 * a request over before its turn came takes its event off the queue, and
 * one over before its trailer gives its stream back
 */

static void
ngx_http_esi_stitch_cleanup(void *data)
{
    ngx_http_esi_stitch_ctx_t  *ctx = data;

    if (ctx->release.posted) {
        ngx_delete_posted_event(&ctx->release);
    }

    if (ctx->z) {
        ngx_http_esi_stitch_zstream_put(ctx->z);
        ctx->z = NULL;
    }
}


/*
 * Moves input into ctx->out: segments as they are, short runs between
 * them as stored blocks, everything else through deflate.  NGX_OK when the
 * input is used up, NGX_AGAIN when every output buffer is busy.
 */

static ngx_int_t
ngx_http_esi_stitch_weave(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    if (!ctx->started) {
        if (ngx_http_esi_stitch_constant(r, ctx, ngx_http_esi_stitch_header,
                                         sizeof(ngx_http_esi_stitch_header))
            != NGX_OK)
        {
            return NGX_ERROR;
        }

        ctx->started = 1;
    }

    for ( ;; ) {

        if ((ctx->z && ctx->z->zstream.avail_in)
            || ctx->flush != Z_NO_FLUSH)
        {
            rc = ngx_http_esi_stitch_deflate(r, ctx);
            if (rc != NGX_OK) {
                return rc;
            }

            if (ngx_http_esi_stitch_flushed(r, ctx) != NGX_OK) {
                return NGX_ERROR;
            }
        }

        if (ctx->in == NULL || ctx->done) {
            return NGX_OK;
        }

        cl = ctx->in;
        ctx->in = cl->next;
        b = cl->buf;
        ngx_free_chain(r->pool, cl);

        if (ngx_http_esi_stitch_take(r, ctx, b) != NGX_OK) {
            return NGX_ERROR;
        }
    }
}


/*
 * Takes one buffer off the input.  Whoever made a buffer may reuse it once
 * its pos reaches last, so all it asks for is noted here, at once: its
 * bytes are held for a stored block, or go to zlib, which moves pos as it
 * reads them, and its flags become the flush owed after them.
 */

static ngx_int_t
ngx_http_esi_stitch_take(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, ngx_buf_t *b)
{
    size_t  size;

    if (ngx_http_esi_is_segment(b)) {
        ctx->segment = (ngx_http_esi_segment_t *) b;

        /* what was deflated live ends where the segment begins */

        if (ctx->live) {
            ctx->flush = Z_FULL_FLUSH;
            return NGX_OK;
        }

        if (ctx->held && ngx_http_esi_stitch_store(r, ctx, 0, 0) != NGX_OK) {
            return NGX_ERROR;
        }

        return ngx_http_esi_stitch_flushed(r, ctx);
    }

    size = ngx_buf_size(b);

    if (size && !ngx_buf_in_memory(b)) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "esi stitch: a buffer not in memory");
        return NGX_ERROR;
    }

    if (size && !ctx->live) {
        switch (ngx_http_esi_stitch_hold_run(r, ctx, b)) {

        case NGX_OK:
            size = 0;
            break;

        case NGX_DECLINED:
            break;

        case NGX_AGAIN:     /* zlib takes the held bytes before these */
            return NGX_OK;

        default:
            return NGX_ERROR;
        }
    }

    if (size) {
        ctx->crc = crc32(ctx->crc, b->pos, (uInt) size);
        ctx->size += (uint32_t) size;

        if (ngx_http_esi_stitch_feed(r, ctx, b->pos, size, b) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    if (b->last_buf) {
        if (ctx->live) {
            ctx->flush = Z_FINISH;
            return NGX_OK;
        }

        /* what was deflated is flushed whole: zlib is not needed again */

        if (ctx->z) {
            ngx_http_esi_stitch_zstream_put(ctx->z);
            ctx->z = NULL;
        }

        if (ctx->held) {
            if (ngx_http_esi_stitch_store(r, ctx, 1, 0) != NGX_OK) {
                return NGX_ERROR;
            }

        } else if (ngx_http_esi_stitch_constant(r, ctx,
                                     ngx_http_esi_stitch_empty_end,
                                     sizeof(ngx_http_esi_stitch_empty_end))
                   != NGX_OK)
        {
            return NGX_ERROR;
        }

        return ngx_http_esi_stitch_finish(r, ctx);

    } else if (b->flush) {
        if (ctx->live) {
            ctx->flush = Z_SYNC_FLUSH;

        } else if (ctx->held) {
            return ngx_http_esi_stitch_store(r, ctx, 0, 1);
        }
    }

    return NGX_OK;
}


/*
 * Keeps b's bytes, in a run that nothing has been deflated in since the
 * last full flush, for a stored block: NGX_OK.  NGX_DECLINED when the run
 * has nothing held and b alone is too long: it is deflated.  NGX_AGAIN
 * when b makes the held run too long: the held bytes become zlib's input
 * and b goes back on the input, to follow them.
 */

static ngx_int_t
ngx_http_esi_stitch_hold_run(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, ngx_buf_t *b)
{
    size_t        size, held;
    ngx_chain_t  *cl;

    size = ngx_buf_size(b);
    held = ctx->held ? (size_t) (ctx->held->last - ctx->held->pos) : 0;

    if (held + size <= NGX_HTTP_ESI_STITCH_STORED) {

        if (ctx->held == NULL) {
            ctx->held = ngx_create_temp_buf(r->pool,
                                          NGX_HTTP_ESI_STITCH_STORED_HEADER
                                          + NGX_HTTP_ESI_STITCH_STORED);
            if (ctx->held == NULL) {
                return NGX_ERROR;
            }

            ctx->held->pos += NGX_HTTP_ESI_STITCH_STORED_HEADER;
            ctx->held->last = ctx->held->pos;
        }

        ctx->crc = crc32(ctx->crc, b->pos, (uInt) size);
        ctx->size += (uint32_t) size;
        ctx->held->last = ngx_cpymem(ctx->held->last, b->pos, size);
        b->pos = b->last;

        return NGX_OK;
    }

    if (held == 0) {
        return NGX_DECLINED;
    }

    /* the held buffer is not written again before zlib has read it all */

    if (ngx_http_esi_stitch_feed(r, ctx, ctx->held->pos, held, NULL)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ctx->held = NULL;

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    cl->buf = b;
    cl->next = ctx->in;
    ctx->in = cl;

    return NGX_AGAIN;
}


/* len bytes at data become zlib's input; in_buf, if any, holds them */

static ngx_int_t
ngx_http_esi_stitch_feed(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, u_char *data, size_t len,
    ngx_buf_t *in_buf)
{
    if (ctx->z == NULL) {
        ctx->z = ngx_http_esi_stitch_zstream_get(r, ctx->level);
        if (ctx->z == NULL) {
            return NGX_ERROR;
        }
    }

    ctx->z->zstream.next_in = data;
    ctx->z->zstream.avail_in = (uInt) len;
    ctx->in_buf = in_buf;
    ctx->live = 1;

    return NGX_OK;
}


/* the held run goes out as a stored block, the stream's last if final */

static ngx_int_t
ngx_http_esi_stitch_store(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, ngx_uint_t final, ngx_uint_t flush)
{
    size_t      len;
    u_char     *p;
    ngx_buf_t  *b;

    b = ctx->held;
    ctx->held = NULL;

    len = b->last - b->pos;
    p = b->pos - NGX_HTTP_ESI_STITCH_STORED_HEADER;
    b->pos = p;

    *p++ = (u_char) (final ? 1 : 0);
    *p++ = (u_char) (len & 0xff);
    *p++ = (u_char) (len >> 8);
    *p++ = (u_char) (~len & 0xff);
    *p = (u_char) ((~len >> 8) & 0xff);

    b->flush = flush;

    return ngx_http_esi_stitch_link(r, ctx, b);
}


/* what the flush just ended was for */

static ngx_int_t
ngx_http_esi_stitch_flushed(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx)
{
    ngx_http_esi_segment_t  *seg;

    switch (ctx->flush) {

    case Z_FINISH:
        ctx->flush = Z_NO_FLUSH;

        if (ngx_http_esi_stitch_zbuf_out(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        ngx_http_esi_stitch_zstream_put(ctx->z);
        ctx->z = NULL;

        return ngx_http_esi_stitch_finish(r, ctx);

    case Z_SYNC_FLUSH:
        ctx->flush = Z_NO_FLUSH;

        if (ctx->zbuf) {
            ctx->zbuf->flush = 1;
        }

        return ngx_http_esi_stitch_zbuf_out(r, ctx);

    case Z_FULL_FLUSH:
        ctx->flush = Z_NO_FLUSH;
        ctx->live = 0;

        if (ngx_http_esi_stitch_zbuf_out(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        /* fall through */

    default: /* Z_NO_FLUSH */

        seg = ctx->segment;

        if (seg == NULL) {
            return NGX_OK;
        }

        ctx->segment = NULL;

        ctx->crc = crc32_combine(ctx->crc, seg->crc, (z_off_t) seg->size);
        ctx->size += (uint32_t) seg->size;

        return ngx_http_esi_stitch_link(r, ctx, &seg->buf);
    }
}


/*
 * Runs deflate on what ctx->z holds with the flush owed, into output
 * buffers: NGX_OK when the input is used up (and the flush ended),
 * NGX_AGAIN when no buffer is free; called again, it goes on.
 */

static ngx_int_t
ngx_http_esi_stitch_deflate(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx)
{
    int         zrc;
    z_stream   *zs;
    ngx_buf_t  *b;

    /* only a live stream owes a flush, and feed() made the stream */

    if (ctx->z == NULL) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "esi stitch: deflate without a stream");
        return NGX_ERROR;
    }

    zs = &ctx->z->zstream;

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

        zs->next_out = ctx->zbuf->last;
        zs->avail_out = (uInt) (ctx->zbuf->end - ctx->zbuf->last);

        zrc = deflate(zs, ctx->flush);

        if (zrc != Z_OK && zrc != Z_STREAM_END && zrc != Z_BUF_ERROR) {
            ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                          "esi stitch: deflate() failed: %d", zrc);
            return NGX_ERROR;
        }

        ctx->zbuf->last = zs->next_out;

        /* what zlib read is in its window: the buffer's owner may have it */

        if (ctx->in_buf) {
            ctx->in_buf->pos = zs->next_in;

            if (zs->avail_in == 0) {
                ctx->in_buf = NULL;
            }
        }

        /* zlib has more to write only when it filled the buffer */

        if (zs->avail_out == 0) {
            continue;
        }

        return NGX_OK;
    }
}


/* the trailer, after the final block: CRC-32 and length of it all */

static ngx_int_t
ngx_http_esi_stitch_finish(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx)
{
    u_char     *p;
    ngx_buf_t  *b;

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


/* bytes of ours that never change, such as the gzip header */

static ngx_int_t
ngx_http_esi_stitch_constant(ngx_http_request_t *r,
    ngx_http_esi_stitch_ctx_t *ctx, u_char *data, size_t len)
{
    ngx_buf_t  *b;

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->memory = 1;
    b->pos = data;
    b->last = data + len;

    return ngx_http_esi_stitch_link(r, ctx, b);
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


/* an idle stream, or a new one */

static ngx_http_esi_stitch_zstream_t *
ngx_http_esi_stitch_zstream_get(ngx_http_request_t *r, ngx_uint_t level)
{
    ngx_http_esi_stitch_zstream_t  *z;

    z = ngx_http_esi_stitch_idle;

    if (z) {
        ngx_http_esi_stitch_idle = z->next;
        ngx_http_esi_stitch_nidle--;

        /* a reset stream has deflated nothing: the level just changes */

        if (z->level == level
            || deflateParams(&z->zstream, (int) level, Z_DEFAULT_STRATEGY)
               == Z_OK)
        {
            z->level = level;
            return z;
        }

        (void) deflateEnd(&z->zstream);
        ngx_free(z);
    }

    z = ngx_alloc(sizeof(ngx_http_esi_stitch_zstream_t), r->connection->log);
    if (z == NULL) {
        return NULL;
    }

    ngx_memzero(&z->zstream, sizeof(z_stream));
    z->zstream.zalloc = ngx_http_esi_stitch_zalloc;
    z->zstream.zfree = ngx_http_esi_stitch_zfree;
    z->level = level;

    if (deflateInit2(&z->zstream, (int) level, Z_DEFLATED, -MAX_WBITS,
                     NGX_HTTP_ESI_STITCH_MEMLEVEL, Z_DEFAULT_STRATEGY)
        != Z_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "esi stitch: deflateInit2() failed");
        ngx_free(z);
        return NULL;
    }

    return z;
}


/* kept reset while fewer than NGX_HTTP_ESI_STITCH_IDLE are, else freed */

static void
ngx_http_esi_stitch_zstream_put(ngx_http_esi_stitch_zstream_t *z)
{
    if (ngx_http_esi_stitch_nidle < NGX_HTTP_ESI_STITCH_IDLE
        && deflateReset(&z->zstream) == Z_OK)
    {
        z->next = ngx_http_esi_stitch_idle;
        ngx_http_esi_stitch_idle = z;
        ngx_http_esi_stitch_nidle++;
        return;
    }

    (void) deflateEnd(&z->zstream);
    ngx_free(z);
}


/* zlib's state outlives the request that set it up: not from its pool */

static void *
ngx_http_esi_stitch_zalloc(void *opaque, u_int items, u_int size)
{
    return ngx_alloc((size_t) items * size, ngx_cycle->log);
}


static void
ngx_http_esi_stitch_zfree(void *opaque, void *address)
{
    ngx_free(address);
}


static ngx_int_t
ngx_http_esi_stitch_init(ngx_conf_t *cf)
{
    ngx_uint_t  i;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_esi_stitch_body_filter;

    ngx_http_esi_stitch_gzip_module = NULL;

    for (i = 0; cf->cycle->modules[i]; i++) {
        if (ngx_strcmp(cf->cycle->modules[i]->name,
                       "ngx_http_gzip_filter_module")
            == 0)
        {
            ngx_http_esi_stitch_gzip_module = cf->cycle->modules[i];
        }
    }

    return NGX_OK;
}


static void
ngx_http_esi_stitch_exit_process(ngx_cycle_t *cycle)
{
    ngx_http_esi_stitch_zstream_t  *z;

    while (ngx_http_esi_stitch_idle) {
        z = ngx_http_esi_stitch_idle;
        ngx_http_esi_stitch_idle = z->next;

        (void) deflateEnd(&z->zstream);
        ngx_free(z);
    }

    ngx_http_esi_stitch_nidle = 0;
}
