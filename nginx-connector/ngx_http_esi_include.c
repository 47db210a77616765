
/*
 * Copyright (C) The ESI project authors
 *
 * Includes: subrequests, their fragments, and captured attempts.
 */


#include "ngx_http_esi.h"


static ngx_int_t ngx_http_esi_include_count(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_str_t *path);
static void ngx_http_esi_include_in_memory(ngx_http_request_t *sr);
static ngx_int_t ngx_http_esi_include_done(ngx_http_request_t *r, void *data,
    ngx_int_t rc);
static ngx_int_t ngx_http_esi_include_deny(ngx_http_request_t *r,
    ngx_int_t status);
static ngx_http_esi_ctx_t *ngx_http_esi_include_ctx(ngx_http_request_t *r);



static u_char  ngx_http_esi_error_marker[] = "<!-- ESI include error -->";


ngx_int_t
ngx_http_esi_include(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_insn_t *insn, ngx_uint_t alt)
{
    ngx_str_t                   *path, *args;
    ngx_http_request_t          *sr, *pr;
    ngx_http_esi_ctx_t          *sctx, *capture;
    ngx_http_esi_include_t      *inc;
    ngx_http_esi_loc_conf_t     *elcf;
    ngx_http_post_subrequest_t  *psr;

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    /* inside an attempt, output is held and includes come one at a time */

    capture = ctx->attempts ? ctx : ctx->capture;

    path = alt ? &insn->alt_path : &insn->path;
    args = alt ? &insn->alt_args : &insn->args;

    if (path->len == 0) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "esi: include refused by esid");
        return ngx_http_esi_include_failed(r, ctx, insn, alt);
    }

    if (ctx->depth >= (ngx_uint_t) elcf->max_depth) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: include \"%V\" exceeds esi_max_depth %i",
                      path, elcf->max_depth);
        return ngx_http_esi_include_failed(r, ctx, insn, alt);
    }

    if (!alt && ++ctx->includes > elcf->max_includes) {
        if (ctx->includes == elcf->max_includes + 1) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: \"%V\" has more than %ui includes "
                          "(esi_max_includes), the rest fail",
                          &r->uri, elcf->max_includes);
        }

        return ngx_http_esi_include_failed(r, ctx, insn, alt);
    }

    for (pr = r; pr; pr = pr->parent) {
        if (pr->uri.len == path->len
            && ngx_strncmp(pr->uri.data, path->data, path->len) == 0
            && pr->args.len == args->len
            && (args->len == 0
                || ngx_strncmp(pr->args.data, args->data, args->len) == 0))
        {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: include \"%V\" would include itself "
                          "(a loop), refused", path);
            return ngx_http_esi_include_failed(r, ctx, insn, alt);
        }
    }

    if (ngx_http_esi_include_count(r, ctx, path) != NGX_OK) {
        return ngx_http_esi_include_failed(r, ctx, insn, alt);
    }

    /* what came before the include goes first, ordered by postpone */

    if (ctx->out && ngx_http_esi_output(r, ctx) == NGX_ERROR) {
        return NGX_ERROR;
    }

    /* when it is done, what postpone holds behind it goes on */

    inc = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_include_t));
    if (inc == NULL) {
        return NGX_ERROR;
    }

    psr = &inc->post;
    psr->handler = ngx_http_esi_include_done;
    psr->data = ctx;

    /* the page's location decides; an include of one that checks, too */

    inc->access = elcf->include_access;

    if (r->post_subrequest
        && r->post_subrequest->handler == ngx_http_esi_include_done)
    {
        inc->access |= ((ngx_http_esi_include_t *) r->post_subrequest)->access;
    }

    if (insn->alt_path.len == 0 && !insn->continue_on_error
        && capture == NULL)
    {
        if (ngx_http_subrequest(r, path, args, &sr, psr, 0) != NGX_OK) {
            return ngx_http_esi_include_failed(r, ctx, insn, alt);
        }

        ngx_http_esi_include_in_memory(sr);

        return NGX_OK;
    }

    /* the outcome decides what follows: wait for it */

    sctx = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_ctx_t));
    if (sctx == NULL) {
        return NGX_ERROR;
    }

    sctx->fragment = 1;
    sctx->capture = capture;

    if (ngx_http_subrequest(r, path, args, &sr, psr,
                            NGX_HTTP_SUBREQUEST_WAITED)
        != NGX_OK)
    {
        return ngx_http_esi_include_failed(r, ctx, insn, alt);
    }

    ngx_http_set_ctx(sr, sctx, ngx_http_esi_module);
    ngx_http_esi_include_in_memory(sr);

    if (capture) {
        sr->filter_need_in_memory = 1;
    }

    ctx->wait = sr;
    ctx->wait_insn = insn;
    ctx->wait_alt = alt;
    ctx->wait_failed = 0;

    return NGX_OK;
}


/*
 * esi_max_includes bounds one page; nested pages multiply it.  Every
 * subrequest an include issues, alt= ones too, is also counted for the
 * client request as a whole, at its outermost ESI page (r->main's, unless
 * r->main is no ESI page itself); they all share r->main's pool.
 */

static ngx_int_t
ngx_http_esi_include_count(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_str_t *path)
{
    ngx_http_request_t       *pr;
    ngx_http_esi_ctx_t       *root, *pctx;
    ngx_http_esi_loc_conf_t  *mlcf;

    root = ctx;

    for (pr = r->parent; pr; pr = pr->parent) {
        pctx = ngx_http_get_module_ctx(pr, ngx_http_esi_module);

        if (pctx) {
            root = pctx;
        }
    }

    mlcf = ngx_http_get_module_loc_conf(r->main, ngx_http_esi_module);

    if (root->tree_includes < mlcf->max_request_includes) {
        root->tree_includes++;
        return NGX_OK;
    }

    if (root->tree_includes++ == mlcf->max_request_includes) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: include \"%V\" is past the %ui includes of "
                      "the request \"%V\" (esi_max_request_includes), "
                      "the rest fail",
                      path, mlcf->max_request_includes, &r->main->uri);
    }

    return NGX_DECLINED;
}


/*
 * A page whose body is not read (plan_trust) no longer asks for its
 * buffers in memory, and its subrequests inherit that: the stitch filter
 * deflates their bodies, so they ask for it themselves.
 */

static void
ngx_http_esi_include_in_memory(ngx_http_request_t *sr)
{
    ngx_http_esi_ctx_t  *mctx;

    mctx = ngx_http_get_module_ctx(sr->main, ngx_http_esi_module);

    if (mctx && mctx->bodiless) {
        sr->main_filter_need_in_memory = 1;
    }
}


ngx_int_t
ngx_http_esi_include_failed(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_insn_t *insn, ngx_uint_t alt)
{
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_esi_loc_conf_t  *elcf;

    if (!alt && insn->alt_path.len) {
        return ngx_http_esi_include(r, ctx, insn, 1);
    }

    if (insn->continue_on_error) {
        return NGX_OK;
    }

    ngx_http_esi_try_failed(ctx);

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    if (elcf->silent_errors) {
        return NGX_OK;
    }

    cl = ngx_http_esi_output_link(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;
    b->memory = 1;
    b->pos = ngx_http_esi_error_marker;
    b->last = ngx_http_esi_error_marker + sizeof(ngx_http_esi_error_marker) - 1;

    return NGX_OK;
}


/*
 * An include of the page counts against its esi_max_fragment_size.  One
 * whose Content-Length says it is larger fails as an error status does:
 * NGX_OK, its body is discarded.  NGX_DECLINED: it goes on, counted.
 */

ngx_int_t
ngx_http_esi_include_header(ngx_http_request_t *r, ngx_http_esi_ctx_t **ctxp)
{
    ngx_http_esi_ctx_t       *ctx, *pctx;
    ngx_http_esi_loc_conf_t  *plcf;

    pctx = ngx_http_get_module_ctx(r->parent, ngx_http_esi_module);
    plcf = ngx_http_get_module_loc_conf(r->parent, ngx_http_esi_module);

    if (pctx == NULL || !pctx->stream || plcf->max_fragment_size == 0) {
        return NGX_DECLINED;
    }

    if (*ctxp == NULL) {
        *ctxp = ngx_http_esi_include_ctx(r);
        if (*ctxp == NULL) {
            return NGX_ERROR;
        }
    }

    ctx = *ctxp;
    ctx->limited = 1;
    ctx->fragment_room = plcf->max_fragment_size;

    if (r->headers_out.content_length_n <= plcf->max_fragment_size) {
        return NGX_DECLINED;
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "esi: include \"%V\" is larger than "
                  "esi_max_fragment_size %O (Content-Length %O), "
                  "include failed", &r->uri, plcf->max_fragment_size,
                  r->headers_out.content_length_n);

    ctx->oversized = 1;
    ctx->discard = 1;

    return NGX_OK;
}


/*
 * What an include sends past esi_max_fragment_size is consumed unseen; the
 * end of its response still goes on, so that the include, and an ESI
 * stream of its own, finish.
 */

ngx_int_t
ngx_http_esi_include_limit(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_chain_t **in)
{
    off_t                     size;
    ngx_buf_t                *b;
    ngx_uint_t                end;
    ngx_chain_t              *cl, *out, **ll;
    ngx_http_esi_loc_conf_t  *plcf;

    size = 0;

    for (cl = *in; cl; cl = cl->next) {
        size += ngx_buf_size(cl->buf);
    }

    if (size <= ctx->fragment_room) {
        ctx->fragment_room -= size;
        return NGX_OK;
    }

    if (!ctx->cut) {
        ctx->cut = 1;
        plcf = ngx_http_get_module_loc_conf(r->parent, ngx_http_esi_module);
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: include \"%V\" is larger than "
                      "esi_max_fragment_size %O, the rest of it is "
                      "discarded", &r->uri, plcf->max_fragment_size);
    }

    out = NULL;
    ll = &out;
    end = 0;

    for (cl = *in; cl; cl = cl->next) {
        b = cl->buf;
        size = ngx_buf_size(b);

        if (size > ctx->fragment_room) {
            if (ctx->fragment_room == 0) {
                end |= b->last_in_chain;
                b->pos = b->last;
                b->file_pos = b->file_last;
                continue;
            }

            /* cut in place, as the range filter does */

            if (b->in_file) {
                b->file_last = b->file_pos + ctx->fragment_room;
            }

            if (ngx_buf_in_memory(b)) {
                b->last = b->pos + (size_t) ctx->fragment_room;
            }

            size = ctx->fragment_room;
        }

        ctx->fragment_room -= size;

        *ll = ngx_alloc_chain_link(r->pool);
        if (*ll == NULL) {
            return NGX_ERROR;
        }

        (*ll)->buf = b;
        ll = &(*ll)->next;
    }

    if (end) {
        b = ngx_calloc_buf(r->pool);
        if (b == NULL) {
            return NGX_ERROR;
        }

        b->last_in_chain = 1;
        b->sync = 1;

        *ll = ngx_alloc_chain_link(r->pool);
        if (*ll == NULL) {
            return NGX_ERROR;
        }

        (*ll)->buf = b;
        ll = &(*ll)->next;
    }

    *ll = NULL;
    *in = out;

    return NGX_OK;
}


/* in place of a parallel include refused by its Content-Length */

ngx_int_t
ngx_http_esi_include_marker(ngx_http_request_t *r)
{
    ngx_buf_t                *b;
    ngx_chain_t               out;
    ngx_http_esi_loc_conf_t  *plcf;

    plcf = ngx_http_get_module_loc_conf(r->parent, ngx_http_esi_module);

    if (plcf->silent_errors) {
        return NGX_OK;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->memory = 1;
    b->pos = ngx_http_esi_error_marker;
    b->last = ngx_http_esi_error_marker + sizeof(ngx_http_esi_error_marker) - 1;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_esi_output_next(r, NULL, &out);
}


static ngx_int_t
ngx_http_esi_include_done(ngx_http_request_t *r, void *data, ngx_int_t rc)
{
    ngx_http_esi_ctx_t  *ctx = data;
    ngx_http_esi_ctx_t  *sctx;

    sctx = ngx_http_get_module_ctx(r, ngx_http_esi_module);

    if (ctx->wait == r
        && (rc == NGX_ERROR
            || rc >= NGX_HTTP_BAD_REQUEST
            || r->headers_out.status >= NGX_HTTP_BAD_REQUEST
            || (sctx && sctx->oversized)))
    {
        ctx->wait_failed = 1;
    }

    /* r->done is set after this handler returns */

    if (!ctx->resume.posted) {
        ngx_post_event(&ctx->resume, &ngx_posted_events);
    }

    return rc;
}


/*
 * esi_include_access on.  NGINX runs no access phase for a subrequest
 * (ngx_http_core_access_phase passes it by), so an include reaches what
 * allow/deny or auth_basic keep from the client.  This preaccess handler
 * runs the access phase's handlers for the include, in the location it
 * landed in, as ngx_http_core_access_phase runs them for the client's own
 * request, "satisfy all" or "any"; a refusal fails the include.  Minus
 * auth_delay: a refused include is not delayed.  A handler that waits
 * (auth_request, for its own subrequest) cannot be waited for here: the
 * include is refused.  The subrequest carries the setting in its
 * r->post_subrequest (ngx_http_esi_include_t), so that it is checked again
 * after an internal redirect, as the client's request would be.
 */

ngx_int_t
ngx_http_esi_include_access(ngx_http_request_t *r)
{
    ngx_int_t                   rc, code;
    ngx_table_elt_t            *h;
    ngx_http_phase_handler_t   *ph;
    ngx_http_core_loc_conf_t   *clcf;
    ngx_http_core_main_conf_t  *cmcf;

    if (r == r->main
        || r->post_subrequest == NULL
        || r->post_subrequest->handler != ngx_http_esi_include_done
        || !((ngx_http_esi_include_t *) r->post_subrequest)->access)
    {
        return NGX_DECLINED;
    }

    cmcf = ngx_http_get_module_main_conf(r, ngx_http_core_module);
    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    code = 0;

    for (ph = cmcf->phase_engine.handlers; ph->checker; ph++) {

        if (ph->checker != ngx_http_core_access_phase) {
            continue;
        }

        rc = ph->handler(r);

        if (rc == NGX_DECLINED) {
            continue;
        }

        if (rc == NGX_AGAIN || rc == NGX_DONE) {
            ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                          "esi: include \"%V\" of \"%V\" refused: an access "
                          "check of its location waits for a subrequest "
                          "(auth_request), which esi_include_access does "
                          "not support", &r->uri, &r->parent->uri);

            return ngx_http_esi_include_deny(r, NGX_HTTP_FORBIDDEN);
        }

        if (clcf->satisfy == NGX_HTTP_SATISFY_ALL) {

            if (rc == NGX_OK) {
                continue;
            }

        } else {

            if (rc == NGX_OK) {
#if (nginx_version >= 1023000)
                for (h = r->headers_out.www_authenticate; h; h = h->next) {
                    h->hash = 0;
                }
#else
                h = r->headers_out.www_authenticate;

                if (h) {
                    h->hash = 0;
                }
#endif
                return NGX_DECLINED;
            }

            if (rc == NGX_HTTP_FORBIDDEN || rc == NGX_HTTP_UNAUTHORIZED) {
                if (code != NGX_HTTP_UNAUTHORIZED) {
                    code = rc;
                }

                continue;
            }
        }

        /* refused, or an error */

        code = (rc == NGX_ERROR) ? NGX_HTTP_INTERNAL_SERVER_ERROR : rc;
        break;
    }

    if (code == 0) {
        return NGX_DECLINED;
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "esi: include \"%V\" of \"%V\" refused by the access "
                  "checks of its location (%i), include failed",
                  &r->uri, &r->parent->uri, code);

    return ngx_http_esi_include_deny(r, code);
}


/*
 * The include ends with the status, as NGINX ends a refused request; its
 * filters discard the answer, and put the error marker in a parallel
 * include's place (a sequential one fails to its alt= or onerror).
 */

static ngx_int_t
ngx_http_esi_include_deny(ngx_http_request_t *r, ngx_int_t status)
{
    ngx_http_esi_ctx_t  *ctx;

    ctx = ngx_http_esi_include_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->denied = 1;

    return status;
}


/* an include's context: its own, or a new one */

static ngx_http_esi_ctx_t *
ngx_http_esi_include_ctx(ngx_http_request_t *r)
{
    ngx_http_esi_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_esi_module);

    if (ctx == NULL) {
        ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_ctx_t));
        if (ctx == NULL) {
            return NULL;
        }

        ngx_http_set_ctx(r, ctx, ngx_http_esi_module);
    }

    return ctx;
}
