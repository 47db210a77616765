
/*
 * Copyright (C) The ESI project authors
 *
 * Esid's splice instructions, decoded and executed; try and attempt.
 */


#include "ngx_http_esi.h"


static ngx_int_t ngx_http_esi_wire_str(ngx_http_request_t *r,
    esi_wire_struct_t *s, unsigned ptr, ngx_str_t *str, ngx_uint_t is_path);
static ngx_uint_t ngx_http_esi_splits_line(ngx_str_t *s, ngx_uint_t args);
static ngx_int_t ngx_http_esi_literal(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_str_t *text);
#if (NGX_ZLIB)
static ngx_int_t ngx_http_esi_segment(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx, ngx_http_esi_insn_t *insn);
#endif
static ngx_int_t ngx_http_esi_try_start(ngx_http_request_t *r,
    ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_try_except(ngx_http_esi_ctx_t *ctx);
static void ngx_http_esi_skip(ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_insn_t *insn);
static ngx_int_t ngx_http_esi_splice(ngx_http_esi_daemon_t *d,
    ngx_http_esi_answer_t *a);


ngx_int_t
ngx_http_esi_splice_register(ngx_http_esi_daemon_t *d, ngx_cycle_t *cycle)
{
    ngx_http_esi_answer_handler_t  *h;

    h = &d->answers[ESI_WIRE_RESPONSE_SPLICE_WHICH];
    h->handler = ngx_http_esi_splice;
    h->table = &d->streams;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_splice(ngx_http_esi_daemon_t *d, ngx_http_esi_answer_t *a)
{
    off_t                 offset, end, released, verbatim_end;
    size_t                n;
    uint16_t              which;
    uint32_t              i, length;
    uint64_t              value;
    ngx_int_t             rc;
    ngx_log_t            *log;
    const uint8_t        *bytes;
    ngx_http_request_t   *r;
    ngx_http_esi_insn_t  *insn, *head, **last;
    esi_wire_list_t       list;
    esi_wire_struct_t     splice, in, inc;
    ngx_http_esi_ctx_t   *ctx;

    ctx = (ngx_http_esi_ctx_t *) a->node;
    r = ctx->request;
    log = d->log;

    if (esi_wire_get_struct(a->root, ESI_WIRE_RESPONSE_SPLICE_PTR, &splice)
        != 0
        || esi_wire_get_list(&splice, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR, &list)
           != 0)
    {
        ngx_log_error(NGX_LOG_ERR, log, 0, "esi: malformed splice from esid");
        return NGX_ERROR;
    }

    value = esi_wire_u64(&splice, ESI_WIRE_SPLICE_RELEASED_OFFSET);

    if (value < (uint64_t) ctx->rx_released || value > (uint64_t) ctx->sent) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "esi: esid released %uL of stream %uD, "
                      "outside [%O, %O]",
                      value, (uint32_t) ctx->node.key, ctx->rx_released,
                      ctx->sent);
        return NGX_ERROR;
    }

    released = (off_t) value;

    if (ctx->plan_wait) {

        /* no plan for this object yet: the body goes to esid after all */

        ctx->plan_wait = 0;

        if (!ctx->tx_queued) {
            ngx_queue_insert_tail(&ngx_http_esi_daemon.tx_wait,
                                  &ctx->tx_link);
            ctx->tx_queued = 1;
        }
    }

    if (esi_wire_bool(&splice, ESI_WIRE_SPLICE_LAST_BIT) && !ctx->end_sent) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "esi: esid ended stream %uD before its body",
                      (uint32_t) ctx->node.key);
        return NGX_ERROR;
    }

    head = NULL;
    last = &head;
    verbatim_end = ctx->rx_verbatim_end;

    for (i = 0; i < list.count; i++) {

        esi_wire_list_at(&list, i, &in);
        which = esi_wire_u16(&in, ESI_WIRE_INSTRUCTION_WHICH_OFFSET);

        insn = ngx_http_esi_splice_insn(ctx);
        if (insn == NULL) {
            goto local_failure;
        }

        switch (which) {

        case ESI_WIRE_INSTRUCTION_VERBATIM_WHICH:
            value = esi_wire_u64(&in,
                                 ESI_WIRE_INSTRUCTION_VERBATIM_OFFSET_OFFSET);
            length = esi_wire_u32(&in,
                                  ESI_WIRE_INSTRUCTION_VERBATIM_LENGTH_OFFSET);

            if (value < (uint64_t) ctx->rx_released
                || value < (uint64_t) verbatim_end
                || value > (uint64_t) ctx->sent
                || length > (uint64_t) ctx->sent - value)
            {
                ngx_log_error(NGX_LOG_ERR, log, 0,
                              "esi: verbatim %uL+%uD of stream %uD is "
                              "outside [%O, %O) or before %O",
                              value, length, (uint32_t) ctx->node.key,
                              ctx->rx_released, ctx->sent, verbatim_end);
                return NGX_ERROR;
            }

            offset = (off_t) value;
            end = offset + length;
            verbatim_end = end;

            insn->type = NGX_HTTP_ESI_VERBATIM;
            insn->offset = offset;
            insn->length = length;
            break;

        case ESI_WIRE_INSTRUCTION_INCLUDE_WHICH:
            if (esi_wire_get_struct(&in, ESI_WIRE_INSTRUCTION_INCLUDE_PTR,
                                    &inc)
                != 0)
            {
                ngx_log_error(NGX_LOG_ERR, log, 0,
                              "esi: malformed include from esid");
                return NGX_ERROR;
            }

            rc = ngx_http_esi_splice_include(r, &inc, insn);

            if (rc == NGX_ERROR) {
                goto local_failure;
            }

            if (rc != NGX_OK) {
                ngx_log_error(NGX_LOG_ERR, log, 0,
                              "esi: malformed include path from esid");
                return NGX_ERROR;
            }

            break;

        case ESI_WIRE_INSTRUCTION_LITERAL_WHICH:
            if (esi_wire_get_data(&in, ESI_WIRE_INSTRUCTION_LITERAL_PTR,
                                  &bytes, &n)
                != 0)
            {
                ngx_log_error(NGX_LOG_ERR, log, 0,
                              "esi: malformed literal from esid");
                return NGX_ERROR;
            }

            /* the ring's bytes are reused once this splice is read */

            insn->type = NGX_HTTP_ESI_LITERAL;
            insn->text.len = n;

            if (n) {
                insn->text.data = ngx_pnalloc(r->pool, n);
                if (insn->text.data == NULL) {
                    goto local_failure;
                }

                ngx_memcpy(insn->text.data, bytes, n);
            }

            break;

        case ESI_WIRE_INSTRUCTION_TRY_START_WHICH:
        case ESI_WIRE_INSTRUCTION_TRY_EXCEPT_WHICH:
        case ESI_WIRE_INSTRUCTION_TRY_END_WHICH:
            insn->type = NGX_HTTP_ESI_TRY_START
                         + (which - ESI_WIRE_INSTRUCTION_TRY_START_WHICH);

            if (ngx_http_esi_splice_try_insn(ctx, insn->type) != NGX_OK) {
                return NGX_ERROR;
            }

            break;

        default:
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "esi: unknown instruction %ud from esid", which);
            return NGX_ERROR;
        }

        *last = insn;
        last = &insn->next;
    }

    if (esi_wire_bool(&splice, ESI_WIRE_SPLICE_LAST_BIT) && ctx->rx_tries) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "esi: esid ended stream %uD inside a try",
                      (uint32_t) ctx->node.key);
        return NGX_ERROR;
    }

    insn = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_insn_t));
    if (insn == NULL) {
        goto local_failure;
    }

    insn->type = NGX_HTTP_ESI_SPLICE;
    insn->offset = released;
    insn->last = esi_wire_bool(&splice, ESI_WIRE_SPLICE_LAST_BIT);

    *last = insn;

    *ctx->last_insn = head;
    ctx->last_insn = &insn->next;

    ctx->rx_released = released;
    ctx->rx_verbatim_end = verbatim_end;

    if (esi_wire_bool(&splice, ESI_WIRE_SPLICE_ANSWERED_BIT)
        && ctx->awaiting)
    {
        ctx->awaiting--;
    }

    if (insn->last) {
        ngx_http_esi_stream_unlink(ctx);
    }

    ngx_http_esi_stream_timer(ctx, 1);
    ngx_http_esi_stream_schedule(ctx);

    return NGX_OK;

local_failure:

    ngx_http_esi_stream_fail(ctx);
    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_wire_str(ngx_http_request_t *r, esi_wire_struct_t *s,
    unsigned ptr, ngx_str_t *str, ngx_uint_t is_path)
{
    size_t       len;
    const char  *p;

    if (esi_wire_get_text(s, ptr, &p, &len) != 0) {
        return NGX_DECLINED;
    }

    if (is_path && len && p[0] != '/') {
        return NGX_DECLINED;
    }

    str->len = len;

    if (len == 0) {
        return NGX_OK;
    }

    str->data = ngx_pnalloc(r->pool, len);
    if (str->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(str->data, p, len);

    return NGX_OK;
}


/* an include instruction from esid; NGX_DECLINED: malformed */

ngx_int_t
ngx_http_esi_splice_include(ngx_http_request_t *r, esi_wire_struct_t *inc,
    ngx_http_esi_insn_t *insn)
{
    ngx_int_t  rc;

    insn->type = NGX_HTTP_ESI_INCLUDE;
    insn->continue_on_error =
        esi_wire_bool(inc, ESI_WIRE_INCLUDE_CONTINUE_ON_ERROR_BIT);

    rc = ngx_http_esi_wire_str(r, inc, ESI_WIRE_INCLUDE_PATH_PTR,
                               &insn->path, 1);
    if (rc == NGX_OK) {
        rc = ngx_http_esi_wire_str(r, inc, ESI_WIRE_INCLUDE_ARGS_PTR,
                                   &insn->args, 0);
    }
    if (rc == NGX_OK) {
        rc = ngx_http_esi_wire_str(r, inc, ESI_WIRE_INCLUDE_ALT_PATH_PTR,
                                   &insn->alt_path, 1);
    }
    if (rc == NGX_OK) {
        rc = ngx_http_esi_wire_str(r, inc, ESI_WIRE_INCLUDE_ALT_ARGS_PTR,
                                   &insn->alt_args, 0);
    }

    if (rc == NGX_OK
        && (ngx_http_esi_splits_line(&insn->path, 0)
            || ngx_http_esi_splits_line(&insn->args, 1)
            || ngx_http_esi_splits_line(&insn->alt_path, 0)
            || ngx_http_esi_splits_line(&insn->alt_args, 1)))
    {
        rc = NGX_DECLINED;
    }

    return rc;
}


/*
 * The proxy module escapes a subrequest's path but copies its args as they
 * are into the request line upstream: a byte that ends the line there
 * could add a header.  esid refuses such a src; a worker checks anyway.
 */

static ngx_uint_t
ngx_http_esi_splits_line(ngx_str_t *s, ngx_uint_t args)
{
    u_char  c;
    size_t  i;

    for (i = 0; i < s->len; i++) {
        c = s->data[i];

        if (c < 0x20 || c == 0x7f || (args && c == ' ')) {
            return 1;
        }
    }

    return 0;
}


/*
 * Keeps esid's try markers balanced as they arrive, so that execution never
 * meets a tryExcept or tryEnd without its tryStart.  NGX_ERROR: a violation.
 */

ngx_int_t
ngx_http_esi_splice_try_insn(ngx_http_esi_ctx_t *ctx, ngx_uint_t type)
{
    uint64_t     bit;
    const char  *error;

    bit = ctx->rx_tries ? (uint64_t) 1 << (ctx->rx_tries - 1) : 0;

    switch (type) {

    case NGX_HTTP_ESI_TRY_START:
        if (ctx->rx_tries == NGX_HTTP_ESI_TRY_MAX) {
            error = "tries nested too deep";
            goto violation;
        }

        ctx->rx_tries++;
        ctx->rx_excepts &= ~((uint64_t) 1 << (ctx->rx_tries - 1));
        return NGX_OK;

    case NGX_HTTP_ESI_TRY_EXCEPT:
        if (ctx->rx_tries == 0 || (ctx->rx_excepts & bit)) {
            error = "tryExcept outside an attempt";
            goto violation;
        }

        ctx->rx_excepts |= bit;
        return NGX_OK;

    default: /* NGX_HTTP_ESI_TRY_END */
        if (ctx->rx_tries == 0 || !(ctx->rx_excepts & bit)) {
            error = "tryEnd without its tryExcept";
            goto violation;
        }

        ctx->rx_tries--;
        return NGX_OK;
    }

violation:

    ngx_log_error(NGX_LOG_ERR, ngx_http_esi_daemon.log, 0,
                  "esi: %s in stream %uD from esid", error,
                  (uint32_t) ctx->node.key);

    return NGX_ERROR;
}


ngx_http_esi_insn_t *
ngx_http_esi_splice_insn(ngx_http_esi_ctx_t *ctx)
{
    ngx_uint_t            i;
    ngx_http_esi_insn_t  *insn, *batch;

    if (ctx->free_insns == NULL) {
        batch = ngx_palloc(ctx->request->pool,
                           NGX_HTTP_ESI_BATCH * sizeof(ngx_http_esi_insn_t));
        if (batch == NULL) {
            return NULL;
        }

        for (i = 0; i < NGX_HTTP_ESI_BATCH; i++) {
            batch[i].next = ctx->free_insns;
            ctx->free_insns = &batch[i];
        }
    }

    insn = ctx->free_insns;
    ctx->free_insns = insn->next;
    ngx_memzero(insn, sizeof(ngx_http_esi_insn_t));

    return insn;
}


ngx_int_t
ngx_http_esi_splice_execute(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_int_t             rc;
    ngx_http_esi_insn_t  *insn;

    while (ctx->insns || ctx->wait) {

        if (ctx->wait) {
            if (!ctx->wait->done) {
                return NGX_OK;
            }

            ctx->wait = NULL;

            if (ctx->wait_failed) {
                ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                               "esi include failed: \"%V\"",
                               ctx->wait_alt ? &ctx->wait_insn->alt_path
                                             : &ctx->wait_insn->path);

                rc = ngx_http_esi_include_failed(r, ctx, ctx->wait_insn,
                                                 ctx->wait_alt);
                if (rc != NGX_OK) {
                    return rc;
                }
            }

            continue;
        }

        insn = ctx->insns;
        ctx->insns = insn->next;

        if (ctx->insns == NULL) {
            ctx->last_insn = &ctx->insns;
        }

        if (ctx->skip && insn->type != NGX_HTTP_ESI_SPLICE) {
            ngx_http_esi_skip(ctx, insn);
            rc = NGX_OK;

        } else {

            switch (insn->type) {

            case NGX_HTTP_ESI_VERBATIM:
                rc = ngx_http_esi_splice_verbatim(r, ctx, insn->offset,
                                                  insn->offset
                                                  + (off_t) insn->length);
                break;

            case NGX_HTTP_ESI_INCLUDE:
                rc = ngx_http_esi_include(r, ctx, insn, 0);
                break;

            case NGX_HTTP_ESI_LITERAL:
                rc = ngx_http_esi_literal(r, ctx, &insn->text);
                break;

#if (NGX_ZLIB)
            case NGX_HTTP_ESI_SEGMENT:
                rc = ngx_http_esi_segment(r, ctx, insn);
                break;
#endif

            case NGX_HTTP_ESI_TRY_START:
                rc = ngx_http_esi_try_start(r, ctx);
                break;

            case NGX_HTTP_ESI_TRY_EXCEPT:
                ngx_http_esi_try_except(ctx);
                rc = NGX_OK;
                break;

            case NGX_HTTP_ESI_TRY_END:
                ctx->ntries--;
                rc = NGX_OK;
                break;

            default: /* NGX_HTTP_ESI_SPLICE */
                ctx->released = insn->offset;
                rc = insn->last ? ngx_http_esi_output_final(r, ctx) : NGX_OK;
                break;
            }
        }

        if (insn->type != NGX_HTTP_ESI_INCLUDE) {
            insn->next = ctx->free_insns;
            ctx->free_insns = insn;
        }

        if (rc == NGX_DECLINED) {
            ngx_http_esi_stream_fail(ctx);
            return NGX_OK;
        }

        if (rc != NGX_OK) {
            return rc;
        }
    }

    return NGX_OK;
}


ngx_int_t
ngx_http_esi_splice_verbatim(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    off_t offset, off_t end)
{
    off_t                 to;
    ngx_buf_t            *b;
    ngx_chain_t          *cl;
    ngx_http_esi_held_t  *h;

    if (ctx->bodiless) {

        /* the run as it is in the cache file, sent with sendfile */

        cl = ngx_http_esi_output_link(r, ctx);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        b = cl->buf;
        b->in_file = 1;
        b->file = ctx->body_file;
        b->file_pos = ctx->body_start + offset;
        b->file_last = ctx->body_start + end;

        ctx->verbatim_end = end;

        return NGX_OK;
    }

    for (h = ctx->held; h && offset < end; h = h->next) {

        if (h->end <= offset) {
            continue;
        }

        if (h->offset > offset) {
            break;
        }

        to = ngx_min(end, h->end);

        /*
         * an attempt's output waits for its outcome: a copy, so that the
         * body's buffers go on (held, a long attempt would stall its read)
         */

        if (to - offset <= NGX_HTTP_ESI_PACK_MAX || ctx->attempts) {
            if (ngx_http_esi_output_pack(r, ctx,
                                         h->start + (offset - h->offset),
                                         (size_t) (to - offset))
                != NGX_OK)
            {
                return NGX_ERROR;
            }

            offset = to;
            continue;
        }

        cl = ngx_http_esi_output_link(r, ctx);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        b = cl->buf;
        b->memory = 1;
        b->pos = h->start + (offset - h->offset);
        b->last = h->start + (to - h->offset);
        b->shadow = h->buf;
        h->refs++;

        offset = to;
    }

    if (offset < end) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "esi: verbatim at %O is no longer held", offset);
        return NGX_DECLINED;
    }

    ctx->verbatim_end = end;

    return NGX_OK;
}


/* bytes esid made, such as a substituted variable */

static ngx_int_t
ngx_http_esi_literal(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_str_t *text)
{
    ngx_buf_t                *b;
    ngx_chain_t              *cl;
    ngx_http_esi_loc_conf_t  *elcf;

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    ctx->made += (off_t) text->len;

    if (elcf->max_page_size && ctx->made > elcf->max_page_size) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: esid made more than esi_max_page_size %O "
                      "of \"%V\"", elcf->max_page_size, &r->uri);
        return NGX_DECLINED;
    }

    if (text->len == 0) {
        return NGX_OK;
    }

    if (text->len <= NGX_HTTP_ESI_PACK_MAX) {
        return ngx_http_esi_output_pack(r, ctx, text->data, text->len);
    }

    cl = ngx_http_esi_output_link(r, ctx);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;
    b->memory = 1;
    b->pos = text->data;
    b->last = text->data + text->len;

    return NGX_OK;
}


#if (NGX_ZLIB)

/*
 * A run sent as its segment: the arena's bytes as they are, for the stitch
 * filter to forward; the run's own bytes are released unread.
 */

static ngx_int_t
ngx_http_esi_segment(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_insn_t *insn)
{
    ngx_chain_t             *cl;
    ngx_http_esi_segment_t  *seg;

    seg = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_segment_t));
    if (seg == NULL) {
        return NGX_ERROR;
    }

    cl = ngx_alloc_chain_link(r->pool);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    seg->buf.memory = 1;
    seg->buf.pos = insn->text.data;
    seg->buf.last = insn->text.data + insn->text.len;
    seg->buf.tag = (ngx_buf_tag_t) &ngx_http_esi_stitch_filter_module;
    seg->crc = insn->crc;
    seg->size = (off_t) insn->length;

    cl->buf = &seg->buf;
    cl->next = NULL;

    *ctx->last_out = cl;
    ctx->last_out = &cl->next;

    ctx->verbatim_end = insn->offset + (off_t) insn->length;

    return NGX_OK;
}

#endif


/*
 * <esi:attempt>: what came before is set aside (the outermost try sends it
 * first, flushed: see flush_held), and ctx->out starts afresh to hold the
 * attempt's output.
 */

static ngx_int_t
ngx_http_esi_try_start(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_try_t  *t;

    if (ctx->tries == NULL) {
        ctx->tries = ngx_palloc(r->pool, NGX_HTTP_ESI_TRY_MAX
                                         * sizeof(ngx_http_esi_try_t));
        if (ctx->tries == NULL) {
            return NGX_ERROR;
        }
    }

    if (ctx->attempts == 0) {
        if (ngx_http_esi_output_flush_held(r, ctx) != NGX_OK) {
            return NGX_ERROR;
        }

        if (ctx->out && ngx_http_esi_output(r, ctx) == NGX_ERROR) {
            return NGX_ERROR;
        }
    }

    t = &ctx->tries[ctx->ntries++];

    t->out = ctx->out;
    t->last_out = ctx->last_out;
    t->attempt = 1;
    t->failed = 0;

    ctx->out = NULL;
    ctx->last_out = &ctx->out;
    ctx->pack = NULL;
    ctx->attempts++;

    return NGX_OK;
}


/* the attempt is over: its output goes on, or the except part runs */

static void
ngx_http_esi_try_except(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_try_t  *t;

    t = &ctx->tries[ctx->ntries - 1];

    if (t->failed) {
        ngx_log_error(NGX_LOG_INFO, ctx->request->connection->log, 0,
                      "esi: an include of an attempt failed, "
                      "its except part is used");

        ngx_http_esi_splice_try_close(ctx, 0);
        return;
    }

    ngx_http_esi_splice_try_close(ctx, 1);

    ctx->skip = 1;
}


/* ends the innermost attempt, keeping or dropping its held output */

void
ngx_http_esi_splice_try_close(ngx_http_esi_ctx_t *ctx, ngx_uint_t keep)
{
    ngx_chain_t           *held, **last_held, *cl;
    ngx_http_esi_held_t   *h;
    ngx_http_esi_try_t    *t;

    t = &ctx->tries[ctx->ntries - 1];

    held = ctx->out;
    last_held = ctx->last_out;

    ctx->out = t->out;
    ctx->last_out = t->out ? t->last_out : &ctx->out;
    ctx->pack = NULL;

    t->attempt = 0;
    ctx->attempts--;

    if (keep) {
        if (held) {
            *ctx->last_out = held;
            ctx->last_out = last_held;
        }

        return;
    }

    while (held) {
        cl = held;
        held = cl->next;

        if (cl->buf->shadow) {
            for (h = ctx->held; h; h = h->next) {
                if (h->buf == cl->buf->shadow && h->refs) {
                    h->refs--;
                    break;
                }
            }
        }

        cl->next = ctx->free;
        ctx->free = cl;
    }
}


/* the except part of a try whose attempt succeeded: nothing of it runs */

static void
ngx_http_esi_skip(ngx_http_esi_ctx_t *ctx, ngx_http_esi_insn_t *insn)
{
    switch (insn->type) {

    case NGX_HTTP_ESI_TRY_START:
        ctx->skip++;
        break;

    case NGX_HTTP_ESI_TRY_END:
        if (--ctx->skip == 0) {
            ctx->ntries--;
        }

        break;

    case NGX_HTTP_ESI_VERBATIM:
    case NGX_HTTP_ESI_SEGMENT:
        ctx->verbatim_end = insn->offset + (off_t) insn->length;
        break;

    default: /* an include never fetched, a literal, a tryExcept */
        break;
    }
}
