
/*
 * Copyright (C) The ESI project authors
 *
 * A purge carried out: the handler (a request's purge, its tags and
 * pattern), an order from esid (esictl, the fleet), asking esid which files,
 * marking and unlinking them or marking them stale, and the answer.
 */


#include "ngx_http_esi.h"


/* whether a request header is the one named (a literal), in any case */
#define ngx_http_esi_purge_header_is(h, name)                                 \
    ((h)->key.len == sizeof(name) - 1                                         \
     && ngx_strncasecmp((h)->key.data, (u_char *) (name), sizeof(name) - 1)  \
        == 0)


static ngx_int_t ngx_http_esi_purge_init(ngx_http_esi_purge_t *p,
    ngx_shm_zone_t *zone);
static ngx_int_t ngx_http_esi_purge_tags(ngx_http_request_t *r,
    ngx_http_esi_purge_t *p);
static ngx_uint_t ngx_http_esi_purge_soft_header(ngx_table_elt_t *h);
static ngx_int_t ngx_http_esi_purge_pattern(ngx_http_request_t *r,
    ngx_http_esi_purge_t *p, ngx_str_t *pattern);
static void ngx_http_esi_purge_failed(ngx_http_esi_purge_t *p);
static ngx_int_t ngx_http_esi_purge_magento(ngx_str_t *pattern,
    ngx_array_t *tags);
static ngx_int_t ngx_http_esi_purge_send(ngx_http_esi_purge_t *p);
static ngx_uint_t ngx_http_esi_purge_file(ngx_http_esi_purge_t *p,
    const u_char *key);
static void ngx_http_esi_purge_name(ngx_http_esi_purge_t *p,
    const u_char *key);
static ngx_uint_t ngx_http_esi_purge_stale(ngx_http_esi_purge_t *p,
    const u_char *key);
static ngx_http_file_cache_node_t *ngx_http_esi_cache_lookup(
     ngx_http_file_cache_t *cache, const u_char *key);
static void ngx_http_esi_purge_timeout_handler(ngx_event_t *ev);
static ngx_int_t ngx_http_esi_purge_answer(ngx_http_esi_daemon_t *d,
    ngx_http_esi_answer_t *a);
static ngx_int_t ngx_http_esi_purge_order(ngx_http_esi_daemon_t *d,
    ngx_http_esi_answer_t *a);
static ngx_int_t ngx_http_esi_purge_lost(ngx_http_esi_daemon_t *d);
static void ngx_http_esi_purge_done(ngx_http_esi_purge_t *p,
    ngx_uint_t status, const char *error);
static void ngx_http_esi_purge_finish_handler(ngx_event_t *ev);
static ngx_int_t ngx_http_esi_purge_respond(ngx_http_request_t *r,
    ngx_http_esi_purge_t *p);
static ngx_buf_t *ngx_http_esi_purge_body(ngx_http_request_t *r,
    ngx_http_esi_purge_t *p, ngx_uint_t type);
static u_char *ngx_http_esi_purge_html(u_char *last, ngx_http_esi_purge_t *p,
    const char *what, const char *star, const char *status, ngx_str_t *kind);
static void ngx_http_esi_purge_log(ngx_http_esi_purge_t *p);
static void ngx_http_esi_purge_report(ngx_http_esi_purge_t *p);
static void ngx_http_esi_purge_cleanup(void *data);


/*
 * Cache-Purge-Fleet, what esid did with the purge for the other NGINX of
 * its fleet (Purged.fleet); of several answers the least done says
 */

static ngx_str_t  ngx_http_esi_purge_fleet_states[] = {
    ngx_string("refused"),
    ngx_string("pending"),
    ngx_string("published")
};


/* the answer's Content-Type, by esi_cache_purge_response_type */

static ngx_str_t  ngx_http_esi_purge_types[] = {
    ngx_string("text/html"),
    ngx_string("application/json"),
    ngx_string("text/xml"),
    ngx_string("text/plain")
};


/* Cache-Purge-Result's first word, by NGX_HTTP_ESI_PURGE_KEY ... _PATTERN */

static ngx_str_t  ngx_http_esi_purge_kinds[] = {
    ngx_string("exact"),
    ngx_string("wildcard"),
    ngx_string("tag"),
    ngx_string("all"),
    ngx_string("pattern")
};


/* the purges waiting for esid, and what its answers do to them */

ngx_int_t
ngx_http_esi_purge_register(ngx_http_esi_daemon_t *d, ngx_cycle_t *cycle)
{
    ngx_http_esi_answer_handler_t  *h;

    ngx_rbtree_init(&d->purges, &d->purge_sentinel, ngx_rbtree_insert_value);

    h = &d->answers[ESI_WIRE_RESPONSE_PURGED_WHICH];
    h->handler = ngx_http_esi_purge_answer;
    h->table = &d->purges;

    d->answers[ESI_WIRE_RESPONSE_PURGE_ORDER_WHICH].handler =
                                                ngx_http_esi_purge_order;
    d->lost[d->nlost++] = ngx_http_esi_purge_lost;

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_purge_lost(ngx_http_esi_daemon_t *d)
{
    ngx_rbtree_node_t  *node;

    while (d->purges.root != d->purges.sentinel) {
        node = ngx_rbtree_min(d->purges.root, d->purges.sentinel);

        ngx_http_esi_purge_done((ngx_http_esi_purge_t *) node,
                                NGX_HTTP_SERVICE_UNAVAILABLE,
                                "the connection to esid was lost");
    }

    return NGX_OK;
}


/* an answer to a purge: mark and unlink the files it names */

static ngx_int_t
ngx_http_esi_purge_answer(ngx_http_esi_daemon_t *d, ngx_http_esi_answer_t *a)
{
    size_t                  n, len, fleet_len;
    ngx_uint_t              i;
    const char             *error, *fleet;
    const uint8_t          *files;
    esi_wire_struct_t       purged;
    ngx_http_esi_purge_t   *p;

    p = (ngx_http_esi_purge_t *) a->node;

    if (esi_wire_get_struct(a->root, ESI_WIRE_RESPONSE_PURGED_PTR, &purged)
        != 0
        || esi_wire_get_data(&purged, ESI_WIRE_PURGED_FILES_PTR, &files, &len)
           != 0
        || len % NGX_HTTP_CACHE_KEY_LEN != 0
        || esi_wire_get_text(&purged, ESI_WIRE_PURGED_ERROR_PTR, &error, &n)
           != 0
        || esi_wire_get_text(&purged, ESI_WIRE_PURGED_FLEET_PTR, &fleet,
                             &fleet_len)
           != 0)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed purge answer from esid");
        return NGX_ERROR;
    }

    for (i = 0; fleet_len && i < 3; i++) {
        if (fleet_len == ngx_http_esi_purge_fleet_states[i].len
            && ngx_strncmp(fleet, ngx_http_esi_purge_fleet_states[i].data,
                           fleet_len)
               == 0)
        {
            if (p->fleet == NULL
                || p->fleet > &ngx_http_esi_purge_fleet_states[i])
            {
                p->fleet = &ngx_http_esi_purge_fleet_states[i];
            }

            break;
        }
    }

    if (esi_wire_bool(&purged, ESI_WIRE_PURGED_SCANNED_BIT)) {
        p->scanned = 1;
    }

    for (/* void */; len; len -= NGX_HTTP_CACHE_KEY_LEN) {
        p->count += ngx_http_esi_purge_file(p, files);
        files += NGX_HTTP_CACHE_KEY_LEN;
    }

    if (n) {
        p->error.len = ngx_min(n, 256);
        p->error.data = ngx_pnalloc(p->pool, p->error.len);

        if (p->error.data) {
            ngx_memcpy(p->error.data, error, p->error.len);

        } else {
            p->error.len = 0;
        }

        /* invalid: the purge's own fault, a pattern RE2 refuses */

        ngx_http_esi_purge_done(p,
                           esi_wire_bool(&purged, ESI_WIRE_PURGED_INVALID_BIT)
                           ? NGX_HTTP_BAD_REQUEST
                           : NGX_HTTP_SERVICE_UNAVAILABLE,
                           NULL);
        return NGX_OK;
    }

    if (esi_wire_bool(&purged, ESI_WIRE_PURGED_MORE_BIT)) {
        ngx_add_timer(&p->timer, d->purge->timeout);
        return NGX_OK;
    }

    if (p->tags && p->next_tag < p->tags->nelts) {
        ngx_rbtree_delete(&d->purges, &p->node);
        p->in_table = 0;

        if (ngx_http_esi_purge_send(p) != NGX_OK) {
            ngx_http_esi_purge_done(p, NGX_HTTP_SERVICE_UNAVAILABLE,
                                    "cannot ask esid");
        }

        return NGX_OK;
    }

    if (p->failed) {
        ngx_http_esi_purge_failed(p);
    }

    ngx_http_esi_purge_done(p, ngx_http_esi_purge_status(p), NULL);

    return NGX_OK;
}


/* says how many files a purge left as they were; the log says why */

static void
ngx_http_esi_purge_failed(ngx_http_esi_purge_t *p)
{
    u_char  *last;

    p->error.data = ngx_pnalloc(p->pool, NGX_INT_T_LEN
                                + sizeof(" file(s) could not be marked "
                                         "stale (see the error log)") - 1);
    if (p->error.data == NULL) {
        return;
    }

    last = ngx_sprintf(p->error.data, "%ui file(s) could not be %s "
                       "(see the error log)", p->failed,
                       p->soft ? "marked stale" : "removed");

    p->error.len = last - p->error.data;
}


ngx_int_t
ngx_http_esi_purge_handler(ngx_http_request_t *r)
{
    ngx_int_t                       rc;
    ngx_str_t                       key;
    ngx_pool_cleanup_t             *cln;
    ngx_http_esi_purge_t           *p;
    ngx_http_esi_daemon_t          *d;
    ngx_http_esi_purge_loc_conf_t  *plcf;

    if (r != r->main) {
        return NGX_HTTP_FORBIDDEN;
    }

    rc = ngx_http_discard_request_body(r);

    if (rc != NGX_OK) {
        return rc;
    }

    plcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_purge_module);
    d = &ngx_http_esi_daemon;

    p = ngx_pcalloc(r->pool, sizeof(ngx_http_esi_purge_t));
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    cln->handler = ngx_http_esi_purge_cleanup;
    cln->data = p;

    p->request = r;
    p->pool = r->pool;
    p->log = r->connection->log;

    if (ngx_http_esi_purge_init(p, plcf->zone) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p->soft = plcf->soft;

    /* ngx_cache_purge's directives answer a miss with its 412 */

    p->miss = (plcf->compat && plcf->legacy_status)
              ? NGX_HTTP_PRECONDITION_FAILED : NGX_HTTP_NOT_FOUND;

    rc = ngx_http_esi_purge_tags(r, p);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_ABORT) {
        return NGX_HTTP_BAD_REQUEST;
    }

    if (p->kind == NGX_HTTP_ESI_PURGE_KEY && plcf->all) {
        p->kind = NGX_HTTP_ESI_PURGE_ALL;
    }

    if (p->kind == NGX_HTTP_ESI_PURGE_KEY) {
        if (ngx_http_complex_value(r, plcf->key, &key) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        if (key.len == 1 && key.data[0] == '*') {
            p->kind = NGX_HTTP_ESI_PURGE_ALL;
            key.len = 0;

        } else if (key.len && key.data[key.len - 1] == '*') {
            p->kind = NGX_HTTP_ESI_PURGE_PREFIX;
            key.len--;
        }

        p->key = key;
    }

    if (d->state == NGX_HTTP_ESI_IDLE && d->conf) {

        /* esid may be back before the backoff says so */

        if (d->reconnect.timer_set) {
            ngx_del_timer(&d->reconnect);
        }

        ngx_http_esi_daemon_connect(d);
    }

    if (d->state == NGX_HTTP_ESI_IDLE) {
        p->status = NGX_HTTP_SERVICE_UNAVAILABLE;
        ngx_str_set(&p->error, "esid is not connected");

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: purge of \"%V\" failed: esid is not connected",
                      &p->key);

        return ngx_http_esi_purge_respond(r, p);
    }

    if (ngx_http_esi_purge_send(p) != NGX_OK) {
        p->status = NGX_HTTP_SERVICE_UNAVAILABLE;
        ngx_str_set(&p->error, "cannot ask esid");
        return ngx_http_esi_purge_respond(r, p);
    }

    r->main->count++;

    return NGX_DONE;
}


static ngx_int_t
ngx_http_esi_purge_init(ngx_http_esi_purge_t *p, ngx_shm_zone_t *zone)
{
    p->zone = zone;
    p->cache = zone->data;

    p->timer.handler = ngx_http_esi_purge_timeout_handler;
    p->timer.data = p;
    p->timer.log = p->log;

    p->finish.handler = ngx_http_esi_purge_finish_handler;
    p->finish.data = p;
    p->finish.log = p->log;

    /* "path/" + "l/ll/" + 32 hex digits, as ngx_http_file_cache_name() */

    p->name_len = p->cache->path->name.len + 1 + p->cache->path->len
                  + 2 * NGX_HTTP_CACHE_KEY_LEN;

    p->name = ngx_pnalloc(p->pool, p->name_len + 1);
    if (p->name == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(p->name, p->cache->path->name.data, p->cache->path->name.len);

    return NGX_OK;
}


/*
 * esictl's purge, relayed by esid: carried out as an HTTP purge would be,
 * with no request; its outcome goes back as Request.purgeDone.  A malformed
 * order is a lying esid; an order this worker cannot carry out is answered
 * with an error.
 */

static ngx_int_t
ngx_http_esi_purge_order(ngx_http_esi_daemon_t *d, ngx_http_esi_answer_t *a)
{
    size_t                 n;
    uint16_t               which;
    uint32_t               order;
    ngx_str_t              zone, *tag;
    unsigned               ptr;
    ngx_uint_t             i;
    ngx_pool_t            *pool;
    const char            *text;
    ngx_shm_zone_t       **zones;
    esi_wire_struct_t      purge;
    ngx_http_esi_purge_t  *p;

    order = a->id;

    if (esi_wire_get_struct(a->root, ESI_WIRE_RESPONSE_PURGE_ORDER_PTR, &purge)
        != 0
        || esi_wire_get_text(&purge, ESI_WIRE_PURGE_ZONE_PTR, &text, &n) != 0)
    {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed purge order from esid");
        return NGX_ERROR;
    }

    zone.data = (u_char *) text;
    zone.len = n;

    pool = ngx_create_pool(NGX_DEFAULT_POOL_SIZE, d->log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    p = ngx_pcalloc(pool, sizeof(ngx_http_esi_purge_t));
    if (p == NULL) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    p->pool = pool;
    p->log = d->log;
    p->order = order;
    p->miss = NGX_HTTP_NOT_FOUND;

    which = esi_wire_u16(&purge, ESI_WIRE_PURGE_WHICH_OFFSET);
    p->soft = esi_wire_bool(&purge, ESI_WIRE_PURGE_SOFT_BIT);

    switch (which) {

    case ESI_WIRE_PURGE_KEY_PREFIX_WHICH:
        p->kind = NGX_HTTP_ESI_PURGE_PREFIX;
        ptr = ESI_WIRE_PURGE_KEY_PREFIX_PTR;
        break;

    case ESI_WIRE_PURGE_TAG_WHICH:
        p->kind = NGX_HTTP_ESI_PURGE_TAG;
        ptr = ESI_WIRE_PURGE_TAG_PTR;
        break;

    case ESI_WIRE_PURGE_TAG_PATTERN_WHICH:
        p->kind = NGX_HTTP_ESI_PURGE_PATTERN;
        ptr = ESI_WIRE_PURGE_TAG_PATTERN_PTR;
        break;

    case ESI_WIRE_PURGE_KEY_WHICH:
        p->kind = NGX_HTTP_ESI_PURGE_KEY;
        ptr = ESI_WIRE_PURGE_KEY_PTR;
        break;

    default:
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: purge order %uD of unknown kind %ud",
                      order, which);
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    /* the ring slot is released after this returns: keep copies */

    if (esi_wire_get_text(&purge, ptr, &text, &n) != 0) {
        ngx_log_error(NGX_LOG_ERR, d->log, 0,
                      "esi: malformed purge order from esid");
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    p->key.len = n;
    p->key.data = ngx_pnalloc(pool, n + 1);
    if (p->key.data == NULL) {
        ngx_destroy_pool(pool);
        return NGX_ERROR;
    }

    ngx_memcpy(p->key.data, text, n);

    if (p->kind == NGX_HTTP_ESI_PURGE_TAG) {
        p->tags = ngx_array_create(pool, 1, sizeof(ngx_str_t));
        if (p->tags == NULL) {
            ngx_destroy_pool(pool);
            return NGX_ERROR;
        }

        tag = ngx_array_push(p->tags);
        *tag = p->key;
    }

    ngx_log_error(NGX_LOG_INFO, d->log, 0,
                  "esi: esid relays purge order %uD of \"%V\" in zone \"%V\"",
                  order, &p->key, &zone);

    zones = d->purge->zones.elts;

    for (i = 0; i < d->purge->zones.nelts; i++) {
        if (zones[i]->shm.name.len == zone.len
            && ngx_strncmp(zones[i]->shm.name.data, zone.data, zone.len) == 0)
        {
            break;
        }
    }

    if (i == d->purge->zones.nelts) {
        ngx_str_set(&p->error, "this worker serves no such zone");
        ngx_http_esi_purge_report(p);
        return NGX_OK;
    }

    if (ngx_http_esi_purge_init(p, zones[i]) != NGX_OK
        || ngx_http_esi_purge_send(p) != NGX_OK)
    {
        ngx_str_set(&p->error, "cannot ask esid");
        ngx_http_esi_purge_report(p);
    }

    return NGX_OK;
}


/*
 * A tag header in the request makes it a purge by tag, one per tag: any of
 * esi_purge_tag_headers (Surrogate-Key, xkey, Cache-Tags, ...), and
 * xkey-purge and xkey-softpurge as FOSHttpCache sends them.
 * X-Magento-Tags-Pattern is a pattern of tags.  xkey-softpurge,
 * Fastly-Soft-Purge: 1 and X-Magento-Purge-Soft: 1 make the purge soft.
 * NGX_ABORT, logged: a purge that cannot be carried out as asked (a tag
 * header with no tag in it, a pattern that cannot be sent).
 */

static ngx_int_t
ngx_http_esi_purge_tags(ngx_http_request_t *r, ngx_http_esi_purge_t *p)
{
    u_char                          *s, *t, *end;
    size_t                           len;
    ngx_int_t                        rc;
    ngx_str_t                       *tag;
    ngx_uint_t                       i;
    ngx_list_part_t                 *part;
    ngx_table_elt_t                 *h;
    ngx_http_esi_purge_main_conf_t  *pmcf;

    pmcf = ngx_http_get_module_main_conf(r, ngx_http_esi_purge_module);

    part = &r->headers_in.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                break;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (ngx_http_esi_purge_soft_header(&h[i])) {
            p->soft = 1;
            continue;
        }

        if (ngx_http_esi_purge_header_is(&h[i], "X-Magento-Tags-Pattern")) {
            rc = ngx_http_esi_purge_pattern(r, p, &h[i].value);

            if (rc != NGX_OK) {
                return rc;
            }

            continue;
        }

        if (ngx_http_esi_purge_header_is(&h[i], "xkey-softpurge")) {
            p->soft = 1;

        } else if (!ngx_http_esi_purge_header_is(&h[i], "xkey-purge")
                   && !ngx_http_esi_purge_index_tag_header(pmcf, &h[i].key))
        {
            continue;
        }

        if (p->tags == NULL) {
            p->tags = ngx_array_create(r->pool, 4, sizeof(ngx_str_t));
            if (p->tags == NULL) {
                return NGX_ERROR;
            }

            p->key = h[i].value;
        }

        p->kind = NGX_HTTP_ESI_PURGE_TAG;

        s = h[i].value.data;
        end = h[i].value.data + h[i].value.len;

        while (esi_tags_next(&s, end, &t, &len)) {
            tag = ngx_array_push(p->tags);
            if (tag == NULL) {
                return NGX_ERROR;
            }

            tag->data = t;
            tag->len = len;
        }
    }

    if (p->kind == NGX_HTTP_ESI_PURGE_TAG && p->tags->nelts == 0) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "esi: a purge by tag names no tag");
        return NGX_ABORT;
    }

    if (p->pattern.data == NULL || p->kind == NGX_HTTP_ESI_PURGE_ALL) {
        return NGX_OK;
    }

    if (p->tags) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "esi: a tag pattern is refused beside tags to purge");
        return NGX_ABORT;
    }

    p->kind = NGX_HTTP_ESI_PURGE_PATTERN;
    p->key = p->pattern;

    return NGX_OK;
}


/* Fastly-Soft-Purge: 1 (Fastly's API), X-Magento-Purge-Soft: 1 */

static ngx_uint_t
ngx_http_esi_purge_soft_header(ngx_table_elt_t *h)
{
    if (h->value.len != 1 || h->value.data[0] != '1') {
        return 0;
    }

    return ngx_http_esi_purge_header_is(h, "Fastly-Soft-Purge")
           || ngx_http_esi_purge_header_is(h, "X-Magento-Purge-Soft");
}


/*
 * X-Magento-Tags-Pattern, a regular expression Magento's VCL matches
 * against an object's comma-joined X-Magento-Tags.  As Magento 2 sends it,
 * "((^|,)TAG(,|$))" per tag joined with "|", it is a set of tags purged
 * each by the index; ".*", its flush, is every object; any other pattern
 * goes to esid as it is (p->pattern), which evaluates it with RE2.
 */

static ngx_int_t
ngx_http_esi_purge_pattern(ngx_http_request_t *r, ngx_http_esi_purge_t *p,
    ngx_str_t *pattern)
{
    if (pattern->len == 2 && pattern->data[0] == '.' && pattern->data[1] == '*')
    {
        if (p->kind != NGX_HTTP_ESI_PURGE_TAG) {
            p->kind = NGX_HTTP_ESI_PURGE_ALL;
        }

        return NGX_OK;
    }

    if (ngx_http_esi_purge_magento(pattern, NULL) == NGX_OK) {
        if (p->tags == NULL) {
            p->tags = ngx_array_create(r->pool, 4, sizeof(ngx_str_t));
            if (p->tags == NULL) {
                return NGX_ERROR;
            }

            p->key = *pattern;
        }

        p->kind = NGX_HTTP_ESI_PURGE_TAG;

        return ngx_http_esi_purge_magento(pattern, p->tags);
    }

    if (pattern->len == 0) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "esi: an empty tag pattern is refused");
        return NGX_ABORT;
    }

    if (pattern->len > NGX_HTTP_ESI_PURGE_PATTERN_MAX) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "esi: a tag pattern of %uz bytes is refused, "
                      "the longest is %d", pattern->len,
                      NGX_HTTP_ESI_PURGE_PATTERN_MAX);
        return NGX_ABORT;
    }

    if (p->pattern.data) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, 0,
                      "esi: a purge with two tag patterns is refused");
        return NGX_ABORT;
    }

    p->pattern = *pattern;

    return NGX_OK;
}


/*
 * Whether the pattern is Magento's "((^|,)TAG(,|$))|...": NGX_DECLINED if
 * not; if so and tags is not NULL, its tags are added to tags.
 */

static ngx_int_t
ngx_http_esi_purge_magento(ngx_str_t *pattern, ngx_array_t *tags)
{
    u_char     *pos, *s, *end;
    size_t      len;
    ngx_int_t   rc;
    ngx_str_t  *tag;

    pos = pattern->data;
    end = pattern->data + pattern->len;

    while ((rc = esi_tags_magento_next(pattern->data, end, &pos, &s, &len))
           == 1)
    {
        if (tags) {
            tag = ngx_array_push(tags);
            if (tag == NULL) {
                return NGX_ERROR;
            }

            tag->data = s;
            tag->len = len;
        }
    }

    return rc == 0 ? NGX_OK : NGX_DECLINED;
}


/* Request{purge} under a fresh id, from the id space of the streams */

static ngx_int_t
ngx_http_esi_purge_send(ngx_http_esi_purge_t *p)
{
    size_t                  need;
    u_char                 *buf;
    uint16_t                which;
    unsigned                ptr;
    ngx_str_t              *value, *zone, *tag;
    esi_wire_out_t          req, purge;
    esi_wire_builder_t      b;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;
    zone = &p->zone->shm.name;

    switch (p->kind) {

    case NGX_HTTP_ESI_PURGE_PREFIX:
    case NGX_HTTP_ESI_PURGE_ALL:        /* p->key is empty */
        which = ESI_WIRE_PURGE_KEY_PREFIX_WHICH;
        ptr = ESI_WIRE_PURGE_KEY_PREFIX_PTR;
        value = &p->key;
        break;

    case NGX_HTTP_ESI_PURGE_TAG:
        which = ESI_WIRE_PURGE_TAG_WHICH;
        ptr = ESI_WIRE_PURGE_TAG_PTR;
        tag = p->tags->elts;
        value = &tag[p->next_tag++];
        break;

    case NGX_HTTP_ESI_PURGE_PATTERN:
        which = ESI_WIRE_PURGE_TAG_PATTERN_WHICH;
        ptr = ESI_WIRE_PURGE_TAG_PATTERN_PTR;
        value = &p->key;
        break;

    default: /* NGX_HTTP_ESI_PURGE_KEY */
        which = ESI_WIRE_PURGE_KEY_WHICH;
        ptr = ESI_WIRE_PURGE_KEY_PTR;
        value = &p->key;
        break;
    }

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS
                         + ESI_WIRE_PURGE_DATA_WORDS
                         + ESI_WIRE_PURGE_POINTERS,
                         esi_wire_blob(zone->len + 1)
                         + esi_wire_blob(value->len + 1));

    buf = ngx_palloc(p->pool, need);
    if (buf == NULL) {
        return NGX_ERROR;
    }

    p->node.key = d->next_id++;

    ngx_http_esi_daemon_request(&b, buf, need, (uint32_t) p->node.key,
                                ESI_WIRE_REQUEST_PURGE_WHICH, &req);
    (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_PURGE_PTR,
                               ESI_WIRE_PURGE_DATA_WORDS,
                               ESI_WIRE_PURGE_POINTERS, &purge);
    (void) esi_wire_set_text(&purge, ESI_WIRE_PURGE_ZONE_PTR,
                             (const char *) zone->data, zone->len);
    esi_wire_set_u16(&purge, ESI_WIRE_PURGE_WHICH_OFFSET, which);
    (void) esi_wire_set_text(&purge, ptr, (const char *) value->data,
                             value->len);
    esi_wire_set_bool(&purge, ESI_WIRE_PURGE_SOFT_BIT, p->soft);

    if (esi_wire_finish(&b) != need) {
        return NGX_ERROR;
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, p->log, 0,
                   "esi purge %ui \"%V\"", p->node.key, value);

    if (ngx_http_esi_daemon_post(d, buf, need) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_rbtree_insert(&d->purges, &p->node);
    p->in_table = 1;

    ngx_add_timer(&p->timer, d->purge->timeout);

    return NGX_OK;
}


/*
 * Removes one file esid named: marks its keys_zone node as a purge must
 * (under the zone's mutex; a node someone else already marked is left
 * alone), then unlinks the file.  Returns 1 when the file was purged.
 */

static ngx_uint_t
ngx_http_esi_purge_file(ngx_http_esi_purge_t *p, const u_char *key)
{
    ngx_err_t                    err;
    ngx_uint_t                   marked, unlinked;
    ngx_http_file_cache_t       *cache;
    ngx_http_file_cache_node_t  *fcn;

    cache = p->cache;

    if (p->soft) {
        return ngx_http_esi_purge_stale(p, key);
    }

    marked = 0;
    unlinked = 0;

    ngx_shmtx_lock(&cache->shpool->mutex);

    fcn = ngx_http_esi_cache_lookup(cache, key);

    if (fcn && fcn->exists) {
        cache->sh->size -= fcn->fs_size;
        fcn->fs_size = 0;
        fcn->exists = 0;
        fcn->updating = 0;
        marked = 1;
    }

    ngx_shmtx_unlock(&cache->shpool->mutex);

    ngx_http_esi_purge_name(p, key);

    if (ngx_delete_file(p->name) == NGX_FILE_ERROR) {
        err = ngx_errno;

        if (err != NGX_ENOENT) {
            ngx_log_error(NGX_LOG_CRIT, p->log, err,
                          ngx_delete_file_n " \"%s\" failed", p->name);

            /* marked, it is no longer served: only its space is lost */

            p->failed += !marked;
        }

    } else {
        unlinked = 1;
    }

    ngx_log_debug3(NGX_LOG_DEBUG_HTTP, p->log, 0,
                   "esi purge file \"%s\" marked:%ui unlinked:%ui",
                   p->name, marked, unlinked);

    return marked || unlinked;
}


/* ngx_http_file_cache_lookup(), which is static */

/* p->name: the path of the cache file named by key, in p's zone */

static void
ngx_http_esi_purge_name(ngx_http_esi_purge_t *p, const u_char *key)
{
    u_char                 *last;
    ngx_http_file_cache_t  *cache;

    cache = p->cache;

    last = ngx_hex_dump(p->name + cache->path->name.len + 1 + cache->path->len,
                        (u_char *) key, NGX_HTTP_CACHE_KEY_LEN);
    *last = '\0';

    ngx_create_hashed_filename(cache->path, p->name, p->name_len);
}


/*
 * A soft purge: the file stays and is marked stale, as NGINX reads an
 * object's freshness from its file's header on every hit (valid_sec): the
 * next request finds it expired, and with proxy_cache_use_stale updating
 * and proxy_cache_background_update is answered from it while NGINX
 * fetches it again.  NGINX updates that header in place the same way.
 */

static ngx_uint_t
ngx_http_esi_purge_stale(ngx_http_esi_purge_t *p, const u_char *key)
{
    time_t       valid;
    ssize_t      n;
    uint64_t     version;
    ngx_fd_t     fd;
    ngx_uint_t   marked;

    ngx_http_esi_purge_name(p, key);

    fd = ngx_open_file(p->name, NGX_FILE_RDWR, NGX_FILE_OPEN, 0);

    if (fd == NGX_INVALID_FILE) {
        if (ngx_errno != NGX_ENOENT) {
            ngx_log_error(NGX_LOG_CRIT, p->log, ngx_errno,
                          ngx_open_file_n " \"%s\" failed", p->name);
            p->failed++;
        }

        return 0;
    }

    marked = 0;

    /* only a header of this NGINX's version is written to */

    n = pread(fd, &version, sizeof(uint64_t), 0);

    if (n == sizeof(uint64_t) && version == NGX_HTTP_CACHE_VERSION) {
        valid = ngx_time() - 1;

        n = pwrite(fd, &valid, sizeof(time_t),
                   offsetof(ngx_http_file_cache_header_t, valid_sec));

        if (n == sizeof(time_t)) {
            marked = 1;

        } else {
            ngx_log_error(NGX_LOG_CRIT, p->log, ngx_errno,
                          "pwrite() \"%s\" failed", p->name);
            p->failed++;
        }
    }

    if (ngx_close_file(fd) == NGX_FILE_ERROR) {
        ngx_log_error(NGX_LOG_ALERT, p->log, ngx_errno,
                      ngx_close_file_n " \"%s\" failed", p->name);
    }

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, p->log, 0,
                   "esi purge file \"%s\" marked stale:%ui", p->name, marked);

    return marked;
}


static ngx_http_file_cache_node_t *
ngx_http_esi_cache_lookup(ngx_http_file_cache_t *cache, const u_char *key)
{
    ngx_int_t                    rc;
    ngx_rbtree_key_t             node_key;
    ngx_rbtree_node_t           *node, *sentinel;
    ngx_http_file_cache_node_t  *fcn;

    ngx_memcpy((u_char *) &node_key, key, sizeof(ngx_rbtree_key_t));

    node = cache->sh->rbtree.root;
    sentinel = cache->sh->rbtree.sentinel;

    while (node != sentinel) {

        if (node_key < node->key) {
            node = node->left;
            continue;
        }

        if (node_key > node->key) {
            node = node->right;
            continue;
        }

        /* node_key == node->key */

        fcn = (ngx_http_file_cache_node_t *) node;

        rc = ngx_memcmp(&key[sizeof(ngx_rbtree_key_t)], fcn->key,
                        NGX_HTTP_CACHE_KEY_LEN - sizeof(ngx_rbtree_key_t));

        if (rc == 0) {
            return fcn;
        }

        node = (rc < 0) ? node->left : node->right;
    }

    return NULL;
}


/* the answer goes out from a posted event, never from inside the caller */

static void
ngx_http_esi_purge_done(ngx_http_esi_purge_t *p, ngx_uint_t status,
    const char *error)
{
    if (p->in_table) {
        ngx_rbtree_delete(&ngx_http_esi_daemon.purges, &p->node);
        p->in_table = 0;
    }

    if (p->timer.timer_set) {
        ngx_del_timer(&p->timer);
    }

    p->status = status;

    if (error) {
        p->error.data = (u_char *) error;
        p->error.len = ngx_strlen(error);
    }

    if (!p->finish.posted) {
        ngx_post_event(&p->finish, &ngx_posted_events);
    }
}


/*
 * esid already forgot what it told us about; an answer we ignore would
 * leave files on disk that its index no longer lists.  So a late esid is
 * dropped, as for streams: when the connection ends esid doubts the zone,
 * and the next purge of it reads the directory.
 */

static void
ngx_http_esi_purge_timeout_handler(ngx_event_t *ev)
{
    ngx_http_esi_purge_t  *p;

    p = ev->data;

    ngx_log_error(NGX_LOG_ERR, ev->log, 0,
                  "esi: esid did not answer purge %ui in time",
                  p->node.key);

    ngx_http_esi_daemon_drop(&ngx_http_esi_daemon, NGX_LOG_ERR,
                             "esi: dropping the connection to esid");
}


static void
ngx_http_esi_purge_finish_handler(ngx_event_t *ev)
{
    ngx_connection_t      *c;
    ngx_http_request_t    *r;
    ngx_http_esi_purge_t  *p;

    p = ev->data;
    r = p->request;

    if (r == NULL) {
        ngx_http_esi_purge_report(p);
        return;
    }

    c = r->connection;

    ngx_http_set_log_request(c->log, r);

    ngx_http_finalize_request(r, ngx_http_esi_purge_respond(r, p));
    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_http_esi_purge_respond(ngx_http_request_t *r, ngx_http_esi_purge_t *p)
{
    u_char                          *last;
    ngx_int_t                        rc;
    ngx_buf_t                       *b;
    ngx_str_t                       *kind;
    ngx_chain_t                      out;
    ngx_table_elt_t                 *h;
    ngx_http_esi_purge_loc_conf_t   *plcf;
    ngx_http_esi_purge_main_conf_t  *pmcf;

    kind = &ngx_http_esi_purge_kinds[p->kind];

    if (p->status == 0) {
        p->status = ngx_http_esi_purge_status(p);
    }

    /*
     * cache_purge_background_queue: what ngx_cache_purge 3.0 would queue
     * (a wildcard, purge_all) is answered as queued, 202, found or not,
     * as its clients expect; esid has carried it out by now
     */

    pmcf = ngx_http_get_module_main_conf(r, ngx_http_esi_purge_module);

    if (pmcf->queue
        && (p->kind == NGX_HTTP_ESI_PURGE_PREFIX
            || p->kind == NGX_HTTP_ESI_PURGE_ALL)
        && (p->status == NGX_HTTP_OK || p->status == p->miss))
    {
        p->status = NGX_HTTP_ACCEPTED;
    }

    ngx_http_esi_purge_log(p);

    r->headers_out.status = p->status;

    if (p->status != NGX_HTTP_SERVICE_UNAVAILABLE
        && p->status != NGX_HTTP_BAD_REQUEST)
    {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "Cache-Purge-Result");

        h->value.data = ngx_pnalloc(r->pool,
                                    kind->len + sizeof("; count=") - 1
                                    + NGX_INT_T_LEN + sizeof("; failed=") - 1
                                    + NGX_INT_T_LEN + sizeof("; soft") - 1);
        if (h->value.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        last = ngx_sprintf(h->value.data, "%V; count=%ui", kind, p->count);

        if (p->failed) {
            last = ngx_sprintf(last, "; failed=%ui", p->failed);
        }

        if (p->soft) {
            last = ngx_cpymem(last, "; soft", sizeof("; soft") - 1);
        }

        h->value.len = last - h->value.data;
    }

    if (p->fleet) {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "Cache-Purge-Fleet");
        h->value = *p->fleet;
    }

    plcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_purge_module);

    b = ngx_http_esi_purge_body(r, p, plcf->response_type);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.content_type = ngx_http_esi_purge_types[plcf->response_type];
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.content_length_n = b->last - b->pos;

    if (r->headers_out.content_length) {
        r->headers_out.content_length->hash = 0;
        r->headers_out.content_length = NULL;
    }

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


/*
 * The answer's body in esi_cache_purge_response_type, as ngx_cache_purge
 * writes its own: what was purged, how, and how many files went.
 */

static ngx_buf_t *
ngx_http_esi_purge_body(ngx_http_request_t *r, ngx_http_esi_purge_t *p,
    ngx_uint_t type)
{
    size_t       len;
    u_char      *last;
    uintptr_t    escape;
    ngx_buf_t   *b;
    ngx_str_t   *kind;
    const char  *what, *star, *status;

    kind = &ngx_http_esi_purge_kinds[p->kind];

    what = p->kind == NGX_HTTP_ESI_PURGE_TAG ? "Tag"
           : p->kind == NGX_HTTP_ESI_PURGE_PATTERN ? "Pattern"
           : "Key";

    /* a wildcard is shown as it was asked for, as ngx_cache_purge does */
    star = p->kind == NGX_HTTP_ESI_PURGE_PREFIX ? "*" : "";

    status = p->status == NGX_HTTP_OK ? "purged"
             : p->status == NGX_HTTP_ACCEPTED ? "queued"
             : p->status == p->miss ? "not cached"
             : p->failed ? "failed"
             : p->status == NGX_HTTP_BAD_REQUEST ? "refused"
             : "unavailable";

    if (type == NGX_HTTP_ESI_PURGE_JSON) {

        /* the key twice: ngx_cache_purge's "Key" and ours */

        escape = p->key.len + 2 * ngx_escape_json(NULL, p->key.data, p->key.len)
                 + ngx_escape_json(NULL, p->error.data, p->error.len);

    } else if (type == NGX_HTTP_ESI_PURGE_TEXT) {
        escape = 0;

    } else {
        escape = 2 * ngx_escape_html(NULL, p->key.data, p->key.len)
                 + 2 * ngx_escape_html(NULL, p->error.data, p->error.len);
    }

    len = sizeof("<html><head><title>Purge unavailable</title></head>"
                 "<body><h1>Purge unavailable</h1><p>Pattern: *</p>"
                 "<p>Status: unavailable</p>"
                 "<p>wildcard: 18446744073709551615 file(s) removed</p>"
                 "<p></p><p>soft</p></body></html>" CRLF)
          + p->key.len + p->error.len + escape;

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NULL;
    }

    last = b->last;

    switch (type) {

    case NGX_HTTP_ESI_PURGE_JSON:
        last = ngx_cpymem(last, "{\"Key\": \"", sizeof("{\"Key\": \"") - 1);
        last = (u_char *) ngx_escape_json(last, p->key.data, p->key.len);
        last = ngx_sprintf(last, "%s\", \"Status\": \"%s\", "
                           "\"status\": \"%s\", \"kind\": \"%V\", "
                           "\"key\": \"", star, status, status, kind);
        last = (u_char *) ngx_escape_json(last, p->key.data, p->key.len);
        last = ngx_sprintf(last, "\", \"count\": %ui, \"soft\": %s",
                           p->count, p->soft ? "true" : "false");

        if (p->error.len) {
            last = ngx_cpymem(last, ", \"error\": \"", 12);
            last = (u_char *) ngx_escape_json(last, p->error.data,
                                              p->error.len);
            *last++ = '"';
        }

        last = ngx_cpymem(last, "}" CRLF, sizeof("}" CRLF) - 1);
        break;

    case NGX_HTTP_ESI_PURGE_XML:
        last = ngx_sprintf(last, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>"
                           "<purge><status>%s</status><kind>%V</kind><key>",
                           status, kind);
        last = (u_char *) ngx_escape_html(last, p->key.data, p->key.len);
        last = ngx_sprintf(last, "</key><count>%ui</count><soft>%s</soft>",
                           p->count, p->soft ? "true" : "false");

        if (p->error.len) {
            last = ngx_cpymem(last, "<error>", 7);
            last = (u_char *) ngx_escape_html(last, p->error.data,
                                              p->error.len);
            last = ngx_cpymem(last, "</error>", 8);
        }

        last = ngx_cpymem(last, "</purge>" CRLF, sizeof("</purge>" CRLF) - 1);
        break;

    case NGX_HTTP_ESI_PURGE_TEXT:
        last = ngx_sprintf(last, "%s: %V%s" CRLF "Status: %s" CRLF
                           "%V: %ui file(s) removed%s" CRLF,
                           what, &p->key, star, status, kind, p->count,
                           p->soft ? ", soft" : "");

        if (p->error.len) {
            last = ngx_sprintf(last, "%V" CRLF, &p->error);
        }

        break;

    default: /* NGX_HTTP_ESI_PURGE_HTML */
        last = ngx_http_esi_purge_html(last, p, what, star, status, kind);
        break;
    }

    b->last = last;

    return b;
}


/* the HTML answer, as ngx_cache_purge's */

static u_char *
ngx_http_esi_purge_html(u_char *last, ngx_http_esi_purge_t *p,
    const char *what, const char *star, const char *status, ngx_str_t *kind)
{
    switch (p->status) {

    case NGX_HTTP_OK:
    case NGX_HTTP_ACCEPTED:
        last = ngx_cpymem(last, "<html><head><title>Successful purge</title>"
                          "</head><body><h1>Successful purge</h1>",
                          sizeof("<html><head><title>Successful purge</title>"
                                 "</head><body><h1>Successful purge</h1>")
                          - 1);
        break;

    case NGX_HTTP_NOT_FOUND:
    case NGX_HTTP_PRECONDITION_FAILED:
        last = ngx_cpymem(last, "<html><head><title>Not cached</title>"
                          "</head><body><h1>Not cached</h1>",
                          sizeof("<html><head><title>Not cached</title>"
                                 "</head><body><h1>Not cached</h1>") - 1);
        break;

    case NGX_HTTP_INTERNAL_SERVER_ERROR:
        last = ngx_cpymem(last, "<html><head><title>Purge failed</title>"
                          "</head><body><h1>Purge failed</h1>",
                          sizeof("<html><head><title>Purge failed</title>"
                                 "</head><body><h1>Purge failed</h1>") - 1);
        break;

    case NGX_HTTP_BAD_REQUEST:
        last = ngx_cpymem(last, "<html><head><title>Purge refused</title>"
                          "</head><body><h1>Purge refused</h1>",
                          sizeof("<html><head><title>Purge refused</title>"
                                 "</head><body><h1>Purge refused</h1>") - 1);
        break;

    default:
        last = ngx_cpymem(last, "<html><head><title>Purge unavailable</title>"
                          "</head><body><h1>Purge unavailable</h1>",
                          sizeof("<html><head><title>Purge unavailable"
                                 "</title></head><body><h1>Purge unavailable"
                                 "</h1>") - 1);
        break;
    }

    last = ngx_sprintf(last, "<p>%s: ", what);
    last = (u_char *) ngx_escape_html(last, p->key.data, p->key.len);
    last = ngx_sprintf(last, "%s</p><p>Status: %s</p>"
                       "<p>%V: %ui file(s) removed</p>",
                       star, status, kind, p->count);

    if (p->error.len) {
        last = ngx_cpymem(last, "<p>", 3);
        last = (u_char *) ngx_escape_html(last, p->error.data, p->error.len);
        last = ngx_cpymem(last, "</p>", 4);
    }

    if (p->soft) {
        last = ngx_cpymem(last, "<p>soft</p>", 11);
    }

    last = ngx_cpymem(last, "</body></html>" CRLF,
                      sizeof("</body></html>" CRLF) - 1);

    return last;
}


static void
ngx_http_esi_purge_log(ngx_http_esi_purge_t *p)
{
    ngx_log_error(NGX_LOG_INFO, p->log, 0,
                  "esi: %V purge of \"%V\": %ui file(s) removed%s%s%V",
                  &ngx_http_esi_purge_kinds[p->kind], &p->key, p->count,
                  p->scanned ? ", zone directory read" : ", via variant index",
                  p->error.len ? ", " : "", &p->error);
}


/* Request{purgeDone} for an order; the order's pool goes with it */

static void
ngx_http_esi_purge_report(ngx_http_esi_purge_t *p)
{
    size_t                  need;
    u_char                 *buf;
    esi_wire_out_t          req, done;
    esi_wire_builder_t      b;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    if (p->status == NGX_HTTP_SERVICE_UNAVAILABLE && p->error.len == 0) {
        ngx_str_set(&p->error, "esid could not answer");
    }

    ngx_http_esi_purge_log(p);

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS
                         + ESI_WIRE_PURGE_DONE_DATA_WORDS
                         + ESI_WIRE_PURGE_DONE_POINTERS,
                         esi_wire_blob(p->error.len + 1));

    buf = ngx_palloc(p->pool, need);

    if (buf) {
        ngx_http_esi_daemon_request(&b, buf, need, p->order,
                                    ESI_WIRE_REQUEST_PURGE_DONE_WHICH, &req);
        (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_PURGE_DONE_PTR,
                                   ESI_WIRE_PURGE_DONE_DATA_WORDS,
                                   ESI_WIRE_PURGE_DONE_POINTERS, &done);
        esi_wire_set_u64(&done, ESI_WIRE_PURGE_DONE_COUNT_OFFSET,
                         (uint64_t) p->count);
        esi_wire_set_bool(&done, ESI_WIRE_PURGE_DONE_SCANNED_BIT, p->scanned);
        (void) esi_wire_set_text(&done, ESI_WIRE_PURGE_DONE_ERROR_PTR,
                                 (const char *) p->error.data, p->error.len);

        /* esid fails the order itself when the connection is gone */

        if (esi_wire_finish(&b) == need) {
            (void) ngx_http_esi_daemon_post(d, buf, need);
        }
    }

    ngx_destroy_pool(p->pool);
}


static void
ngx_http_esi_purge_cleanup(void *data)
{
    ngx_http_esi_purge_t  *p = data;

    if (p->in_table) {
        ngx_rbtree_delete(&ngx_http_esi_daemon.purges, &p->node);
        p->in_table = 0;
    }

    if (p->timer.timer_set) {
        ngx_del_timer(&p->timer);
    }

    if (p->finish.posted) {
        ngx_delete_posted_event(&p->finish);
    }
}
