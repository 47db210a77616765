
/*
 * Copyright (C) The ESI project authors
 *
 * Parse plans: a plan from esid decoded, checked and replayed.
 */


#include "ngx_http_esi.h"


/* a plain client's runs go as ranges of the cache file if they average this */
#define NGX_HTTP_ESI_RANGE_MIN  32768


static ngx_int_t ngx_http_esi_plan_segment(ngx_http_esi_ctx_t *ctx,
    esi_wire_struct_t *step, ngx_str_t *room, ngx_http_esi_step_t *out);
static u_char *ngx_http_esi_plan_copy(ngx_http_request_t *r, ngx_str_t *room,
    const uint8_t *bytes, size_t len);
static void ngx_http_esi_plan_trust(ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_plan_ahead(ngx_http_esi_ctx_t *ctx,
    const char **why);
static ngx_int_t ngx_http_esi_plan_drop(ngx_http_esi_ctx_t *ctx, off_t at,
    const char *why);
static ngx_uint_t ngx_http_esi_held_equal(ngx_http_esi_ctx_t *ctx, off_t offset,
    u_char *bytes, size_t len);
static ngx_int_t ngx_http_esi_plan_answer(ngx_http_esi_daemon_t *d,
    ngx_http_esi_answer_t *a);
static ngx_int_t ngx_http_esi_plan_unused(ngx_http_esi_daemon_t *d,
    ngx_http_esi_answer_t *a);


/*
 * Plans come for streams; one for a stream that is gone (cancelled,
 * failed) holds a pin all the same, released unused.
 */

ngx_int_t
ngx_http_esi_plan_register(ngx_http_esi_daemon_t *d, ngx_cycle_t *cycle)
{
    ngx_http_esi_answer_handler_t  *h;

    h = &d->answers[ESI_WIRE_RESPONSE_PLAN_WHICH];
    h->handler = ngx_http_esi_plan_answer;
    h->table = &d->streams;
    h->stale = ngx_http_esi_plan_unused;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_plan_answer(ngx_http_esi_daemon_t *d, ngx_http_esi_answer_t *a)
{
    return ngx_http_esi_plan((ngx_http_esi_ctx_t *) a->node, a->root,
                             a->message, a->len);
}


/*
 * esid's plan for a cached object whose body it has not seen: validated
 * whole before anything runs (a lying esid could otherwise make us skip
 * bytes nobody checked), then replayed here as the body arrives.
 */

/*
 * A plan for a stream: message is esid's (kept for later hits when it is
 * reusable), NULL when the worker replays its own copy of one.
 */

ngx_int_t
ngx_http_esi_plan(ngx_http_esi_ctx_t *ctx, esi_wire_struct_t *root,
    const uint8_t *message, size_t message_len)
{
    off_t                   pos, checked;
    size_t                  len;
    uint16_t                which;
    uint32_t                i, pin;
    uint64_t                offset, length, plan_length;
    ngx_int_t               rc;
    ngx_log_t              *log;
    ngx_str_t               room;
    const uint8_t          *bytes;
    ngx_http_request_t     *r;
    ngx_http_esi_step_t    *step;
    ngx_http_esi_insn_t    *insn;
    ngx_http_esi_daemon_t  *d;
    esi_wire_list_t         list;
    esi_wire_struct_t       plan, in, inc;

    r = ctx->request;
    d = &ngx_http_esi_daemon;
    log = d->log;
    ngx_str_null(&room);

    if (!ctx->plan_wait) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "esi: esid sent a plan for stream %uD, which asked "
                      "for none", (uint32_t) ctx->node.key);
        return NGX_ERROR;
    }

    if (esi_wire_get_struct(root, ESI_WIRE_RESPONSE_PLAN_PTR, &plan) != 0
        || esi_wire_get_list(&plan, ESI_WIRE_PLAN_STEPS_PTR, &list) != 0)
    {
        goto malformed;
    }

    plan_length = esi_wire_u64(&plan, ESI_WIRE_PLAN_LENGTH_OFFSET);

    if (plan_length > (uint64_t) NGX_MAX_OFF_T_VALUE) {
        goto malformed;
    }

    pin = esi_wire_u32(&plan, ESI_WIRE_PLAN_PIN_OFFSET);

    if (pin) {

        /* held from here on, whatever becomes of the plan */

        if (!ctx->segments || pin > ESI_PIN_SLOTS || d->arena == NULL) {
            goto malformed;
        }

        if (message == NULL) {

            /* the copy's own count keeps the slot esid's until this one */

            (void) __atomic_fetch_add(&((uint32_t *) d->pins->start)[pin - 1],
                                      1, __ATOMIC_ACQUIRE);
        }

        ctx->pin = pin;
        ctx->pins = d->pins;
        ctx->pins->refs++;
        ctx->arena = d->arena;
        ctx->arena->refs++;
    }

    ctx->steps = ngx_palloc(r->pool, list.count * sizeof(ngx_http_esi_step_t));
    if (ctx->steps == NULL && list.count) {
        goto local_failure;
    }

    /* every byte the plan skips must follow a check at its start */

    pos = 0;
    checked = -1;

    for (i = 0; i < list.count; i++) {

        esi_wire_list_at(&list, i, &in);
        which = esi_wire_u16(&in, ESI_WIRE_PLAN_STEP_WHICH_OFFSET);
        step = &ctx->steps[i];
        ngx_memzero(step, sizeof(ngx_http_esi_step_t));

        switch (which) {

        case ESI_WIRE_PLAN_STEP_VERBATIM_WHICH:
            offset = esi_wire_u64(&in,
                                  ESI_WIRE_PLAN_STEP_VERBATIM_OFFSET_OFFSET);
            length = esi_wire_u64(&in,
                                  ESI_WIRE_PLAN_STEP_VERBATIM_LENGTH_OFFSET);

            if (offset < (uint64_t) pos
                || (offset > (uint64_t) pos && checked != pos)
                || offset > plan_length
                || length > plan_length - offset)
            {
                goto malformed;
            }

            step->type = NGX_HTTP_ESI_VERBATIM;
            step->offset = (off_t) offset;
            step->length = (off_t) length;
            pos = step->offset + step->length;

            rc = ngx_http_esi_plan_segment(ctx, &in, &room, step);

            if (rc == NGX_ERROR) {
                goto local_failure;
            }

            if (rc != NGX_OK) {
                goto malformed;
            }

            break;

        case ESI_WIRE_PLAN_STEP_CHECK_WHICH:
            offset = esi_wire_u64(&in, ESI_WIRE_PLAN_STEP_CHECK_OFFSET_OFFSET);

            if (offset != (uint64_t) pos
                || esi_wire_get_data(&in, ESI_WIRE_PLAN_STEP_CHECK_BYTES_PTR,
                                     &bytes, &len)
                   != 0
                || len == 0
                || len > NGX_HTTP_ESI_CHECK_MAX
                || len > plan_length - offset)
            {
                goto malformed;
            }

            step->type = NGX_HTTP_ESI_CHECK;
            step->offset = pos;
            step->length = (off_t) len;

            step->bytes = ngx_http_esi_plan_copy(r, &room, bytes, len);
            if (step->bytes == NULL) {
                goto local_failure;
            }

            checked = pos;
            break;

        case ESI_WIRE_PLAN_STEP_INCLUDE_WHICH:
            if (checked != pos
                || esi_wire_get_struct(&in, ESI_WIRE_PLAN_STEP_INCLUDE_PTR,
                                       &inc)
                   != 0)
            {
                goto malformed;
            }

            insn = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_insn_t));
            if (insn == NULL) {
                goto local_failure;
            }

            rc = ngx_http_esi_splice_include(r, &inc, insn);

            if (rc == NGX_ERROR) {
                goto local_failure;
            }

            if (rc != NGX_OK) {
                goto malformed;
            }

            step->type = NGX_HTTP_ESI_INCLUDE;
            step->offset = pos;
            step->include = insn;
            break;

        case ESI_WIRE_PLAN_STEP_LITERAL_WHICH:
            if (esi_wire_get_data(&in, ESI_WIRE_PLAN_STEP_LITERAL_PTR,
                                  &bytes, &len)
                != 0)
            {
                goto malformed;
            }

            step->type = NGX_HTTP_ESI_LITERAL;
            step->offset = pos;
            step->length = (off_t) len;

            if (len) {
                step->bytes = ngx_http_esi_plan_copy(r, &room, bytes, len);
                if (step->bytes == NULL) {
                    goto local_failure;
                }
            }

            break;

        case ESI_WIRE_PLAN_STEP_TRY_START_WHICH:
        case ESI_WIRE_PLAN_STEP_TRY_EXCEPT_WHICH:
        case ESI_WIRE_PLAN_STEP_TRY_END_WHICH:
            step->type = NGX_HTTP_ESI_TRY_START
                         + (which - ESI_WIRE_PLAN_STEP_TRY_START_WHICH);
            step->offset = pos;

            /* an outermost try is checked ahead from the check before it */

            if ((step->type == NGX_HTTP_ESI_TRY_START && ctx->rx_tries == 0
                 && checked != pos)
                || ngx_http_esi_splice_try_insn(ctx, step->type) != NGX_OK)
            {
                goto malformed;
            }

            break;

        default:
            goto malformed;
        }
    }

    if (((off_t) plan_length > pos && checked != pos) || ctx->rx_tries) {
        goto malformed;
    }

    if (message && esi_wire_bool(&plan, ESI_WIRE_PLAN_REUSABLE_BIT)) {
        ngx_http_esi_replay_keep(ctx, message, message_len, pin);
    }

    ctx->nsteps = list.count;
    ctx->step = 0;
    ctx->plan_ahead = 0;
    ctx->plan_pos = 0;
    ctx->plan_length = (off_t) plan_length;
    ctx->plan_wait = 0;
    ctx->planned = 1;

    if (ctx->awaiting) {
        ctx->awaiting--;
    }

    /* esid is done with this stream: it never saw the body, nor will */

    ngx_http_esi_stream_unlink(ctx);

    if (message == NULL) {
        ngx_http_esi_plan_trust(ctx);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "esi plan of %ui steps over %O bytes",
                   ctx->nsteps, ctx->plan_length);

    if (ngx_http_esi_plan_run(ctx) != NGX_OK) {
        ngx_http_esi_stream_fail(ctx);
        return NGX_OK;
    }

    ngx_http_esi_stream_schedule(ctx);

    return NGX_OK;

malformed:

    ngx_log_error(NGX_LOG_ERR, log, 0,
                  "esi: malformed plan from esid for stream %uD",
                  (uint32_t) ctx->node.key);
    return NGX_ERROR;

local_failure:

    ngx_http_esi_stream_fail(ctx);
    return NGX_OK;
}


/*
 * A hit replayed from the worker's copy, in the header filter, whose plan
 * needs none of the body's bytes in memory: stitched, every run has its
 * segment; for a plain client, every run goes as a range of the cache
 * file; the rest are literals and includes.  The object's identity (its
 * cache file's inode and modification time in nanoseconds) says its bytes
 * are those the plan was recorded from, so its checks and heads are not
 * compared, and the body is not read: unless a filter needs it in memory,
 * the copy filter passes the cache file's buffer on as it is (with
 * sendfile), and the body filter only counts its bytes (see feed).  A
 * plain client's runs go as ranges only when they are long: a sendfile
 * call a run costs more than copying runs shorter than an output buffer.
 */

static void
ngx_http_esi_plan_trust(ngx_http_esi_ctx_t *ctx)
{
    off_t                 run_bytes;
    ngx_uint_t            i, runs;
    ngx_http_request_t   *r;
    ngx_http_esi_step_t  *step;

    r = ctx->request;

    if (ctx->inflate || ctx->memory_above || ctx->received || r != r->main)
    {
        return;
    }

    runs = 0;
    run_bytes = 0;

    for (i = 0; i < ctx->nsteps; i++) {
        step = &ctx->steps[i];

        switch (step->type) {

        case NGX_HTTP_ESI_VERBATIM:
            if (ctx->segments && step->segment.len == 0) {
                return;     /* deflated live, from the body's bytes */
            }

            runs++;
            run_bytes += step->length;
            break;

        case NGX_HTTP_ESI_CHECK:
        case NGX_HTTP_ESI_INCLUDE:
        case NGX_HTTP_ESI_LITERAL:
            break;

        default: /* a try: its attempt is held, from the body's bytes */
            return;
        }
    }

    if (!ctx->segments && run_bytes < (off_t) (runs * NGX_HTTP_ESI_RANGE_MIN))
    {
        return;     /* copied: cheaper than a sendfile call a short run */
    }

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "esi: the plan needs no byte of the body");

    ctx->bodiless = 1;
    r->filter_need_in_memory = 0;
    r->main_filter_need_in_memory = 0;
}


/*
 * A verbatim step's segment, if esid named one: inside the arena, pinned,
 * with a head no longer than its run.  NGX_DECLINED: malformed.
 */

static ngx_int_t
ngx_http_esi_plan_segment(ngx_http_esi_ctx_t *ctx, esi_wire_struct_t *step,
    ngx_str_t *room, ngx_http_esi_step_t *out)
{
    size_t                   len;
    uint32_t                 zlen;
    uint64_t                 zoff;
    const uint8_t           *head;
    esi_wire_struct_t        seg;
    ngx_http_esi_mapping_t  *arena;

    if (esi_wire_get_struct(step, ESI_WIRE_PLAN_STEP_VERBATIM_SEGMENT_PTR,
                            &seg)
        != 0)
    {
        return NGX_DECLINED;
    }

    zoff = esi_wire_u64(&seg, ESI_WIRE_SEGMENT_OFFSET_OFFSET);
    zlen = esi_wire_u32(&seg, ESI_WIRE_SEGMENT_LENGTH_OFFSET);

    if (zlen == 0) {
        return NGX_OK;
    }

    arena = ctx->arena;

    if (ctx->pin == 0
        || zoff > arena->size
        || zlen > arena->size - zoff
        || esi_wire_get_data(&seg, ESI_WIRE_SEGMENT_HEAD_PTR, &head, &len)
           != 0
        || len == 0
        || len > NGX_HTTP_ESI_CHECK_MAX
        || (off_t) len > out->length)
    {
        return NGX_DECLINED;
    }

    out->segment.data = arena->start + zoff;
    out->segment.len = zlen;
    out->crc = esi_wire_u32(&seg, ESI_WIRE_SEGMENT_CRC_OFFSET);
    out->head_len = len;

    out->head = ngx_http_esi_plan_copy(ctx->request, room, head, len);
    if (out->head == NULL) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* a plan for a stream that is gone: its pin goes at once */

static ngx_int_t
ngx_http_esi_plan_unused(ngx_http_esi_daemon_t *d, ngx_http_esi_answer_t *a)
{
    uint32_t           pin;
    esi_wire_struct_t  plan;

    if (esi_wire_get_struct(a->root, ESI_WIRE_RESPONSE_PLAN_PTR, &plan) != 0)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed plan from esid");
        return NGX_ERROR;
    }

    pin = esi_wire_u32(&plan, ESI_WIRE_PLAN_PIN_OFFSET);

    if (pin > ESI_PIN_SLOTS || (pin && d->arena == NULL)) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: plan from esid with pin %uD", pin);
        return NGX_ERROR;
    }

    if (pin) {
        ngx_http_esi_daemon_unpin(d->pins, pin);
    }

    return NGX_OK;
}


/*
 * The bytes of a plan's checks and literals, copied out of the ring into
 * a few blocks of the request's pool rather than one allocation each.
 */

static u_char *
ngx_http_esi_plan_copy(ngx_http_request_t *r, ngx_str_t *room,
    const uint8_t *bytes, size_t len)
{
    u_char  *p;

    if (room->len < len) {
        room->len = ngx_max(len, NGX_HTTP_ESI_PLAN_BYTES);

        room->data = ngx_pnalloc(r->pool, room->len);
        if (room->data == NULL) {
            return NULL;
        }
    }

    p = room->data;
    ngx_memcpy(p, bytes, len);

    room->data += len;
    room->len -= len;

    return p;
}


/*
 * Runs the plan's steps as far as the bytes that arrived allow: verbatim
 * runs as they come, a construct only after its recorded first bytes are
 * found where they should be, the includes it holds; then tells execute()
 * what may be released, and whether the page is complete.  At most a
 * batch of steps at a time: execute() asks for the next (plan_more).
 */

ngx_int_t
ngx_http_esi_plan_run(ngx_http_esi_ctx_t *ctx)
{
    off_t                  end, to;
    ngx_int_t              rc;
    ngx_uint_t             n;
    const char            *why;
    ngx_http_esi_step_t   *step;
    ngx_http_esi_insn_t   *insn;
    ngx_http_esi_plain_t  *plain;

    ctx->plan_more = 0;
    ctx->plan_starved = 0;

    for (n = 0; ctx->step < ctx->nsteps; n++) {

        if (n == NGX_HTTP_ESI_BATCH) {

            /*
             * the rest once execute() ran these, so that their insns and
             * those of the batches after are the same few
             */

            ctx->plan_more = 1;
            return NGX_OK;
        }

        step = &ctx->steps[ctx->step];

        switch (step->type) {

        case NGX_HTTP_ESI_VERBATIM:

            /* the construct before it was checked: skip it */

            if (ctx->plan_pos < step->offset) {
                ctx->plan_pos = step->offset;
            }

            end = step->offset + step->length;

            if (step->segment.len && ctx->plan_pos == step->offset) {

                /* its gzip instead, once its first bytes are the run's */

                if (ctx->bodiless) {
                    /* void */

                } else if (ctx->received
                           < step->offset + (off_t) step->head_len)
                {
                    if (ctx->input_done) {
                        return ngx_http_esi_plan_drop(ctx, ctx->plan_pos,
                                            "the body is shorter than planned");
                    }

                    goto released;

                } else if (!ngx_http_esi_held_equal(ctx, step->offset,
                                                    step->head,
                                                    step->head_len))
                {
                    return ngx_http_esi_plan_drop(ctx, step->offset,
                                                "a run differs from the plan");
                }

                insn = ngx_http_esi_splice_insn(ctx);
                if (insn == NULL) {
                    return NGX_ERROR;
                }

                insn->type = NGX_HTTP_ESI_SEGMENT;
                insn->offset = step->offset;
                insn->length = (size_t) step->length;
                insn->text = step->segment;
                insn->crc = step->crc;

                *ctx->last_insn = insn;
                ctx->last_insn = &insn->next;

                ctx->plan_pos = end;
                break;
            }

            to = ngx_min(end, ctx->received);

            if (to > ctx->plan_pos) {
                insn = ngx_http_esi_splice_insn(ctx);
                if (insn == NULL) {
                    return NGX_ERROR;
                }

                insn->type = NGX_HTTP_ESI_VERBATIM;
                insn->offset = ctx->plan_pos;
                insn->length = (size_t) (to - ctx->plan_pos);

                *ctx->last_insn = insn;
                ctx->last_insn = &insn->next;

                ctx->plan_pos = to;
            }

            if (ctx->plan_pos < end) {
                if (ctx->input_done) {
                    return ngx_http_esi_plan_drop(ctx, ctx->plan_pos,
                                            "the body is shorter than planned");
                }

                goto released;
            }

            break;

        case NGX_HTTP_ESI_CHECK:
            if (ctx->step < ctx->plan_ahead || ctx->bodiless) {
                break;
            }

            rc = ngx_http_esi_plan_ahead(ctx, &why);

            if (rc == NGX_AGAIN) {
                goto released;
            }

            if (rc != NGX_OK) {
                return ngx_http_esi_plan_drop(ctx, step->offset, why);
            }

            break;

        case NGX_HTTP_ESI_INCLUDE:
            insn = ngx_palloc(ctx->request->pool,
                              sizeof(ngx_http_esi_insn_t));
            if (insn == NULL) {
                return NGX_ERROR;
            }

            *insn = *step->include;
            insn->next = NULL;

            *ctx->last_insn = insn;
            ctx->last_insn = &insn->next;
            break;

        default: /* LITERAL, TRY_START, TRY_EXCEPT, TRY_END */
            insn = ngx_http_esi_splice_insn(ctx);
            if (insn == NULL) {
                return NGX_ERROR;
            }

            insn->type = step->type;
            insn->text.len = (size_t) step->length;
            insn->text.data = step->bytes;

            if (step->type == NGX_HTTP_ESI_TRY_START) {
                ctx->rx_tries++;

            } else if (step->type == NGX_HTTP_ESI_TRY_END) {
                ctx->rx_tries--;
            }

            *ctx->last_insn = insn;
            ctx->last_insn = &insn->next;
            break;
        }

        ctx->step++;
    }

    if (ctx->received > ctx->plan_length) {
        return ngx_http_esi_plan_drop(ctx, ctx->plan_length,
                                      "the body is longer than planned");
    }

    if (!ctx->input_done) {
        goto released;
    }

    if (ctx->received < ctx->plan_length) {
        return ngx_http_esi_plan_drop(ctx, ctx->plan_pos,
                                      "the body is shorter than planned");
    }

    /* the whole body, as planned */

    if (ctx->nsteps == 1
        && ctx->steps[0].type == NGX_HTTP_ESI_VERBATIM
        && ctx->steps[0].length == ctx->plan_length
        && ctx->steps[0].segment.len == 0)
    {
        plain = ngx_http_esi_replay_plain(ctx);
        plain->zone = ctx->plan_zone;
        ngx_memcpy(plain->object, ctx->object, NGX_HTTP_ESI_OBJECT_LEN);
    }

    insn = ngx_http_esi_splice_insn(ctx);
    if (insn == NULL) {
        return NGX_ERROR;
    }

    insn->type = NGX_HTTP_ESI_SPLICE;
    insn->offset = ctx->plan_length;
    insn->last = 1;

    *ctx->last_insn = insn;
    ctx->last_insn = &insn->next;

    ctx->planned = 0;

    return NGX_OK;

released:

    ctx->plan_starved = 1;

    insn = ngx_http_esi_splice_insn(ctx);
    if (insn == NULL) {
        return NGX_ERROR;
    }

    insn->type = NGX_HTTP_ESI_SPLICE;
    insn->offset = ctx->plan_pos;

    *ctx->last_insn = insn;
    ctx->last_insn = &insn->next;

    return NGX_OK;
}


/*
 * A construct's check, and, when tries follow it before the next run, the
 * checks, runs and segment heads up to their end: all of them before any
 * of it runs, so that the plan never stops matching inside a try (its
 * attempt held here, it could not be handed to esid).  NGX_AGAIN: those
 * bytes have not all arrived (held meanwhile, as copies once the stream
 * starves: see own_held); NGX_DECLINED: the plan is dropped at the check,
 * for "why".
 */

static ngx_int_t
ngx_http_esi_plan_ahead(ngx_http_esi_ctx_t *ctx, const char **why)
{
    off_t                 need;
    ngx_uint_t            i, end, depth;
    ngx_http_esi_step_t  *check, *step;

    check = &ctx->steps[ctx->step];
    need = check->offset + check->length;
    depth = 0;

    for (end = ctx->step + 1; end < ctx->nsteps; end++) {
        step = &ctx->steps[end];

        if (step->type == NGX_HTTP_ESI_TRY_START) {
            depth++;

        } else if (step->type == NGX_HTTP_ESI_TRY_END) {
            depth--;

        } else if (step->type == NGX_HTTP_ESI_CHECK
                   || step->type == NGX_HTTP_ESI_VERBATIM)
        {
            if (depth == 0) {
                break;
            }

            need = ngx_max(need, step->offset + step->length);
        }
    }

    if (ctx->received < need) {
        if (ctx->input_done) {
            *why = "the body is shorter than planned";
            return NGX_DECLINED;
        }

        return NGX_AGAIN;
    }

    for (i = ctx->step; i < end; i++) {
        step = &ctx->steps[i];

        if (step->type == NGX_HTTP_ESI_CHECK
            && !ngx_http_esi_held_equal(ctx, step->offset, step->bytes,
                                        (size_t) step->length))
        {
            *why = "a construct differs from the plan";
            return NGX_DECLINED;
        }

        if (step->type == NGX_HTTP_ESI_VERBATIM && step->segment.len
            && !ngx_http_esi_held_equal(ctx, step->offset, step->head,
                                        step->head_len))
        {
            *why = "a run differs from the plan";
            return NGX_DECLINED;
        }
    }

    ctx->plan_ahead = end;

    return NGX_OK;
}


/*
 * The plan does not fit the body from "at" on: everything before went out
 * as planned, the rest goes to esid as a new stream that starts there (a
 * construct's start or the end of a run: outside any markup, and never
 * inside a try, see plan_ahead), telling esid to forget the plan.
 */

static ngx_int_t
ngx_http_esi_plan_drop(ngx_http_esi_ctx_t *ctx, off_t at, const char *why)
{
    ngx_http_esi_held_t    *h;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    if (ctx->bodiless) {

        /* the identity said otherwise: the bytes to parse were never read */

        ngx_log_error(NGX_LOG_ERR, ctx->request->connection->log, 0,
                      "esi: plan failed at byte %O of an object that was "
                      "not read: %s", at, why);

        ngx_http_esi_replay_forget(ctx);

        return NGX_ERROR;
    }

    ngx_log_error(NGX_LOG_INFO, ctx->request->connection->log, 0,
                  "esi: plan dropped at byte %O: %s, the rest is parsed",
                  at, why);

    ngx_http_esi_replay_forget(ctx);

    ctx->planned = 0;
    ctx->plan_failed = 1;
    ctx->base = at;
    ctx->sent = at;
    ctx->rx_released = at;
    ctx->rx_verbatim_end = at;
    ctx->open_sent = 0;
    ctx->end_sent = 0;

    ctx->send_held = NULL;

    for (h = ctx->held; h; h = h->next) {
        if (h->end > at) {
            ctx->send_held = h;
            break;
        }
    }

    if (d->state == NGX_HTTP_ESI_IDLE) {
        ngx_http_esi_stream_fail(ctx);
        return NGX_OK;
    }

    ngx_http_esi_stream_start(ctx);

    return NGX_OK;
}


/* whether the held bytes at offset are these */

static ngx_uint_t
ngx_http_esi_held_equal(ngx_http_esi_ctx_t *ctx, off_t offset, u_char *bytes,
    size_t len)
{
    size_t                n;
    ngx_http_esi_held_t  *h;

    for (h = ctx->held; h && len; h = h->next) {

        if (h->end <= offset) {
            continue;
        }

        if (h->offset > offset) {
            return 0;
        }

        n = ngx_min(len, (size_t) (h->end - offset));

        if (ngx_memcmp(h->start + (offset - h->offset), bytes, n) != 0) {
            return 0;
        }

        bytes += n;
        offset += (off_t) n;
        len -= n;
    }

    return len == 0;
}
