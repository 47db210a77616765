
/*
 * Copyright (C) The ESI project authors
 *
 * An object's identity, the worker's copies of reusable plans and
 * its table of objects that have no ESI.
 */


#include "ngx_http_esi.h"


/* how much of the page's path a replay report carries, for esictl log */
#define NGX_HTTP_ESI_REPLAY_URI_MAX  512


static uint32_t ngx_http_esi_object_hash(const u_char *key);
static ngx_http_esi_replay_t *ngx_http_esi_replay_slot(
     ngx_http_esi_ctx_t *ctx);
static ngx_uint_t ngx_http_esi_replay_matches(ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_replay_t *e);
static void ngx_http_esi_replay_release(ngx_http_esi_daemon_t *d,
    ngx_http_esi_replay_t *e);
static void ngx_http_esi_replay_report(ngx_http_esi_ctx_t *ctx);
static ngx_int_t ngx_http_esi_replay_forget_objects(ngx_http_esi_daemon_t *d,
    ngx_http_esi_answer_t *a);
static ngx_int_t ngx_http_esi_replay_closed(ngx_http_esi_daemon_t *d);
static void ngx_http_esi_replay_flush(ngx_http_esi_daemon_t *d,
    ngx_uint_t all);
static void ngx_http_esi_replay_timer_handler(ngx_event_t *ev);


/* the tables of the worker's copies, and what esid's answers do to them */

ngx_int_t
ngx_http_esi_replay_register(ngx_http_esi_daemon_t *d, ngx_cycle_t *cycle)
{
    d->plain = ngx_pcalloc(cycle->pool, NGX_HTTP_ESI_PLAIN_OBJECTS
                                        * sizeof(ngx_http_esi_plain_t));
    if (d->plain == NULL) {
        return NGX_ERROR;
    }

    d->replays = ngx_pcalloc(cycle->pool, NGX_HTTP_ESI_REPLAYS
                                          * sizeof(ngx_http_esi_replay_t));
    if (d->replays == NULL) {
        return NGX_ERROR;
    }

    d->replay_timer.handler = ngx_http_esi_replay_timer_handler;
    d->replay_timer.log = cycle->log;
    d->replay_timer.data = d;
    d->replay_timer.cancelable = 1;

    d->answers[ESI_WIRE_RESPONSE_FORGET_WHICH].handler =
                                        ngx_http_esi_replay_forget_objects;
    d->closed = ngx_http_esi_replay_closed;

    return NGX_OK;
}


/*
 * A body read from the cache, in a location with esi_plan: its identity
 * lets esid answer with the plan instead of reading the body.  It is the
 * open cache file's: its key, size and header size, and its inode and
 * modification time, since NGINX writes each store to a new file and
 * renames it into place.  The response's own Date, length and validators
 * can be those of the object it replaced, within the same second.  A miss
 * is never planned: what NGINX will store is not known yet.
 */

void
ngx_http_esi_replay_identify(ngx_http_request_t *r, ngx_http_esi_ctx_t *ctx,
    ngx_http_esi_loc_conf_t *elcf)
{
    u_char              *p;
    uint64_t             v[4];
    ngx_uint_t           i, k;
    ngx_file_info_t      fi;
    ngx_http_cache_t    *c;
    ngx_http_upstream_t *u;

    c = r->cache;
    u = r->upstream;

    if (elcf->plan == NULL || c == NULL || u == NULL
        || (u->cache_status != NGX_HTTP_CACHE_HIT
            && u->cache_status != NGX_HTTP_CACHE_STALE
            && u->cache_status != NGX_HTTP_CACHE_UPDATING
            && u->cache_status != NGX_HTTP_CACHE_REVALIDATED))
    {
        return;
    }

    if (ngx_fd_info(c->file.fd, &fi) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_CRIT, r->connection->log, ngx_errno,
                      ngx_fd_info_n " \"%s\" failed", c->file.name.data);
        return;
    }

    p = ngx_cpymem(ctx->object, c->key, NGX_HTTP_CACHE_KEY_LEN);

    v[0] = (uint64_t) c->length;
    v[1] = (uint64_t) c->body_start;
    v[2] = (uint64_t) ngx_file_uniq(&fi);
    v[3] = (uint64_t) fi.st_mtim.tv_sec * 1000000000
           + (uint64_t) fi.st_mtim.tv_nsec;

    for (i = 0; i < 4; i++) {
        for (k = 0; k < 8; k++) {
            *p++ = (u_char) (v[i] >> (8 * k));
        }
    }

    ctx->plan_zone = elcf->plan;
    ctx->identified = 1;
}


/*
 * An object's slot in the worker's tables of plain objects and plans: by
 * its cache file's key alone, so that a purge of the file finds it.
 */

static uint32_t
ngx_http_esi_object_hash(const u_char *key)
{
    /* not ngx_murmur_hash2(): it shifts a byte into the sign bit (UBSan) */

    return ngx_crc32_short((u_char *) key, NGX_HTTP_CACHE_KEY_LEN);
}


/* where the object would be among those known to have no ESI */

ngx_http_esi_plain_t *
ngx_http_esi_replay_plain(ngx_http_esi_ctx_t *ctx)
{
    return &ngx_http_esi_daemon.plain[ngx_http_esi_object_hash(ctx->object)
                                      & (NGX_HTTP_ESI_PLAIN_OBJECTS - 1)];
}


/* where the worker's copy of the object's reusable plan would be */

static ngx_http_esi_replay_t *
ngx_http_esi_replay_slot(ngx_http_esi_ctx_t *ctx)
{
    return &ngx_http_esi_daemon.replays[ngx_http_esi_object_hash(ctx->object)
                                        & (NGX_HTTP_ESI_REPLAYS - 1)];
}


/*
 * A purge removes these cache files (Response.forget; none listed: too
 * many to list): the worker's copies of their plans and its notes that
 * they have no ESI go, so that no pin or slot is held for objects nobody
 * will be sent again.  Their identities would never match a later store.
 */

static ngx_int_t
ngx_http_esi_replay_forget_objects(ngx_http_esi_daemon_t *d,
    ngx_http_esi_answer_t *a)
{
    size_t                  len;
    uint32_t                hash;
    const uint8_t          *key;
    ngx_http_esi_plain_t   *plain;
    ngx_http_esi_replay_t  *e;

    if (esi_wire_get_data(a->root, ESI_WIRE_RESPONSE_FORGET_PTR, &key, &len)
        != 0
        || len % NGX_HTTP_CACHE_KEY_LEN != 0)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed forget from esid");
        return NGX_ERROR;
    }

    if (len == 0) {
        ngx_memzero(d->plain, NGX_HTTP_ESI_PLAIN_OBJECTS
                              * sizeof(ngx_http_esi_plain_t));
        ngx_http_esi_replay_flush(d, 1);
        return NGX_OK;
    }

    for ( /* void */ ; len; len -= NGX_HTTP_CACHE_KEY_LEN) {
        hash = ngx_http_esi_object_hash(key);

        plain = &d->plain[hash & (NGX_HTTP_ESI_PLAIN_OBJECTS - 1)];

        if (ngx_memcmp(plain->object, key, NGX_HTTP_CACHE_KEY_LEN) == 0) {
            ngx_memzero(plain, sizeof(ngx_http_esi_plain_t));
        }

        e = &d->replays[hash & (NGX_HTTP_ESI_REPLAYS - 1)];

        if (e->message
            && ngx_memcmp(e->object, key, NGX_HTTP_CACHE_KEY_LEN) == 0)
        {
            ngx_http_esi_replay_release(d, e);
        }

        key += NGX_HTTP_CACHE_KEY_LEN;
    }

    return NGX_OK;
}


static ngx_uint_t
ngx_http_esi_replay_matches(ngx_http_esi_ctx_t *ctx, ngx_http_esi_replay_t *e)
{
    return e->message != NULL
           && e->zone == ctx->plan_zone
           && e->segments == ctx->segments
           && ngx_memcmp(e->object, ctx->object, NGX_HTTP_ESI_OBJECT_LEN) == 0;
}


/*
 * Replays the worker's copy of the object's plan, if it holds one that has
 * not expired: the stream never reaches esid, which only hears of the hit.
 * "plan" runs it (plan.c's, which keeps copies here: passed, not called,
 * so that the copies stay below the plans).  NGX_DECLINED: esid is to be
 * asked.
 */

ngx_int_t
ngx_http_esi_replay(ngx_http_esi_ctx_t *ctx, ngx_http_esi_plan_pt plan)
{
    esi_wire_msg_t            msg;
    esi_wire_struct_t         root;
    ngx_http_esi_replay_t    *e;
    ngx_http_esi_daemon_t    *d;
    ngx_http_esi_loc_conf_t  *elcf;

    d = &ngx_http_esi_daemon;
    e = ngx_http_esi_replay_slot(ctx);
    elcf = ngx_http_get_module_loc_conf(ctx->request, ngx_http_esi_module);

    if (elcf->plan_reuse == 0 || !ngx_http_esi_replay_matches(ctx, e)) {
        return NGX_DECLINED;
    }

    if ((ngx_msec_int_t) (e->expires - ngx_current_msec) <= 0) {
        ngx_http_esi_replay_release(d, e);
        return NGX_DECLINED;
    }

    ngx_log_debug0(NGX_LOG_DEBUG_HTTP, ctx->request->connection->log, 0,
                   "esi: the plan is replayed from the worker's copy");

    ctx->plan_wait = 1;

    /* the copy passed these checks when esid sent it */

    if (esi_wire_open(&msg, (const uint8_t *) e->message, e->len, &root) != 0
        || plan(ctx, &root, NULL, 0) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, ctx->request->connection->log, 0,
                      "esi: the worker's copy of a plan is malformed");
        ngx_http_esi_replay_release(d, e);
        ngx_http_esi_stream_fail(ctx);
        return NGX_OK;
    }

    if (!ctx->failed) {
        ngx_http_esi_replay_report(ctx);
    }

    return NGX_OK;
}


/* keeps a copy of esid's reusable plan for the stream's object */

void
ngx_http_esi_replay_keep(ngx_http_esi_ctx_t *ctx, const uint8_t *message,
    size_t len, uint32_t pin)
{
    ngx_http_esi_replay_t    *e;
    ngx_http_esi_daemon_t    *d;
    ngx_http_esi_loc_conf_t  *elcf;

    d = &ngx_http_esi_daemon;
    e = ngx_http_esi_replay_slot(ctx);
    elcf = ngx_http_get_module_loc_conf(ctx->request, ngx_http_esi_module);

    if (elcf->plan_reuse == 0) {
        return;
    }

    if (e->message) {
        ngx_http_esi_replay_release(d, e);
    }

    /* without a copy later hits ask esid, as they would anyway */

    e->message = ngx_alloc(len, d->log);
    if (e->message == NULL) {
        return;
    }

    ngx_memcpy(e->message, message, len);
    e->len = len;
    e->zone = ctx->plan_zone;
    ngx_memcpy(e->object, ctx->object, NGX_HTTP_ESI_OBJECT_LEN);
    e->segments = ctx->segments;
    e->expires = ngx_current_msec + elcf->plan_reuse;
    e->pin = pin;

    if (pin) {

        /* the stream's count keeps the slot esid's until this one */

        (void) __atomic_fetch_add(&((uint32_t *) d->pins->start)[pin - 1], 1,
                                  __ATOMIC_RELAXED);
    }

    d->nreplays++;

    if (!d->replay_timer.timer_set) {
        ngx_add_timer(&d->replay_timer, NGX_HTTP_ESI_REPLAY_SWEEP);
    }
}


/* the object's plan did not match its body: no more replays of the copy */

void
ngx_http_esi_replay_forget(ngx_http_esi_ctx_t *ctx)
{
    ngx_http_esi_replay_t  *e;

    e = ngx_http_esi_replay_slot(ctx);

    if (ngx_http_esi_replay_matches(ctx, e)) {
        ngx_http_esi_replay_release(&ngx_http_esi_daemon, e);
    }
}


static void
ngx_http_esi_replay_release(ngx_http_esi_daemon_t *d,
    ngx_http_esi_replay_t *e)
{
    if (e->pin) {
        ngx_http_esi_daemon_unpin(d->pins, e->pin);
        e->pin = 0;
    }

    ngx_free(e->message);
    e->message = NULL;
    d->nreplays--;
}


/* the copies pin segments of the connection's arena: they go with it */

static ngx_int_t
ngx_http_esi_replay_closed(ngx_http_esi_daemon_t *d)
{
    ngx_http_esi_replay_flush(d, 1);

    if (d->replay_timer.timer_set) {
        ngx_del_timer(&d->replay_timer);
    }

    return NGX_OK;
}


/* releases the expired copies, or all of them when the connection goes */

static void
ngx_http_esi_replay_flush(ngx_http_esi_daemon_t *d, ngx_uint_t all)
{
    ngx_uint_t              i;
    ngx_http_esi_replay_t  *e;

    for (i = 0; d->nreplays && i < NGX_HTTP_ESI_REPLAYS; i++) {
        e = &d->replays[i];

        if (e->message
            && (all || (ngx_msec_int_t) (e->expires - ngx_current_msec) <= 0))
        {
            ngx_http_esi_replay_release(d, e);
        }
    }
}


/* so that a copy nobody asks for again does not pin its segments for long */

static void
ngx_http_esi_replay_timer_handler(ngx_event_t *ev)
{
    ngx_http_esi_daemon_t  *d;

    d = ev->data;

    ngx_http_esi_replay_flush(d, 0);

    if (d->nreplays) {
        ngx_add_timer(ev, NGX_HTTP_ESI_REPLAY_SWEEP);
    }
}


/*
 * tells esid of a hit replayed from the worker's copy, for its counts and
 * its trace (esictl log)
 */

static void
ngx_http_esi_replay_report(ngx_http_esi_ctx_t *ctx)
{
    size_t               need, uri_len;
    u_char              *buf, *dst;
    ngx_str_t           *zone;
    esi_wire_out_t       req, replayed;
    esi_wire_builder_t   b;

    zone = &ctx->plan_zone->name;
    uri_len = ngx_min(ctx->request->uri.len, NGX_HTTP_ESI_REPLAY_URI_MAX);

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS
                         + ESI_WIRE_REPLAYED_DATA_WORDS
                         + ESI_WIRE_REPLAYED_POINTERS,
                         esi_wire_blob(zone->len + 1)
                         + esi_wire_blob(NGX_HTTP_ESI_OBJECT_LEN)
                         + esi_wire_blob(uri_len + 1));

    buf = ngx_palloc(ctx->request->pool, need);
    if (buf == NULL) {
        return;
    }

    ngx_http_esi_daemon_request(&b, buf, need, 0,
                                ESI_WIRE_REQUEST_REPLAYED_WHICH, &req);
    (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_REPLAYED_PTR,
                               ESI_WIRE_REPLAYED_DATA_WORDS,
                               ESI_WIRE_REPLAYED_POINTERS, &replayed);
    (void) esi_wire_set_text(&replayed, ESI_WIRE_REPLAYED_ZONE_PTR,
                             (const char *) zone->data, zone->len);

    dst = esi_wire_alloc_data(&replayed, ESI_WIRE_REPLAYED_OBJECT_PTR,
                              NGX_HTTP_ESI_OBJECT_LEN);
    if (dst) {
        ngx_memcpy(dst, ctx->object, NGX_HTTP_ESI_OBJECT_LEN);
    }

    esi_wire_set_bool(&replayed, ESI_WIRE_REPLAYED_STITCHED_BIT,
                      ctx->pin != 0);
    (void) esi_wire_set_text(&replayed, ESI_WIRE_REPLAYED_URI_PTR,
                             (const char *) ctx->request->uri.data, uri_len);
    esi_wire_set_u16(&replayed, ESI_WIRE_REPLAYED_STATUS_OFFSET,
                     (uint16_t) ctx->request->headers_out.status);

    /* only counts are lost if it cannot go */

    ngx_http_esi_daemon_report(&ngx_http_esi_daemon, buf,
                               esi_wire_finish(&b));
}
