
/*
 * Copyright (C) The ESI project authors
 *
 * The variant index's feed: zone announcements and the reports of
 * every cache file a worker serves from or stores.
 */


#include "ngx_http_esi.h"


static void ngx_http_esi_purge_index_stored(void *data);
static void ngx_http_esi_purge_index_object(ngx_http_request_t *r,
    ngx_pool_t *pool, ngx_uint_t store);
static ngx_int_t ngx_http_esi_purge_index_file(ngx_http_request_t *r,
    ngx_pool_t *pool, ngx_str_t *zone, ngx_str_t *key, u_char *file,
    ngx_str_t *tags);
static ngx_int_t ngx_http_esi_purge_index_announce(ngx_http_esi_daemon_t *d);


ngx_int_t
ngx_http_esi_purge_index_register(ngx_http_esi_daemon_t *d,
    ngx_cycle_t *cycle)
{
    d->attached = ngx_http_esi_purge_index_announce;

    return NGX_OK;
}


/*
 * Tells esid which proxy_cache zones this worker serves, first thing on a
 * new connection: the announcements go ahead of anything queued while
 * connecting.
 */

static ngx_int_t
ngx_http_esi_purge_index_announce(ngx_http_esi_daemon_t *d)
{
    size_t                   need;
    u_char                  *buf;
    ngx_str_t               *name, *path;
    ngx_uint_t               i;
    ngx_queue_t             *first;
    ngx_shm_zone_t         **zone;
    esi_wire_out_t           req, z;
    esi_wire_builder_t       b;
    ngx_http_file_cache_t   *cache;

    zone = d->purge->zones.elts;
    first = ngx_queue_head(&d->posted);   /* the sentinel when empty */

    for (i = 0; i < d->purge->zones.nelts; i++) {
        cache = zone[i]->data;
        name = &zone[i]->shm.name;
        path = &cache->path->name;

        need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                             + ESI_WIRE_REQUEST_POINTERS
                             + ESI_WIRE_ZONE_DATA_WORDS
                             + ESI_WIRE_ZONE_POINTERS,
                             esi_wire_blob(name->len + 1)
                             + esi_wire_blob(path->len + 1)
                             + esi_wire_blob(d->purge->tag_names.len + 1));

        buf = ngx_palloc(d->pool, need);
        if (buf == NULL) {
            return NGX_ERROR;
        }

        ngx_http_esi_daemon_request(&b, buf, need, 0,
                                    ESI_WIRE_REQUEST_ZONE_WHICH, &req);
        (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_ZONE_PTR,
                                   ESI_WIRE_ZONE_DATA_WORDS,
                                   ESI_WIRE_ZONE_POINTERS, &z);
        (void) esi_wire_set_text(&z, ESI_WIRE_ZONE_NAME_PTR,
                                 (const char *) name->data, name->len);
        (void) esi_wire_set_text(&z, ESI_WIRE_ZONE_PATH_PTR,
                                 (const char *) path->data, path->len);
        esi_wire_set_u64(&z, ESI_WIRE_ZONE_INDEX_BYTES_OFFSET,
                         (uint64_t) d->purge->index);
        esi_wire_set_bool(&z, ESI_WIRE_ZONE_LOST_REPORTS_BIT,
                          d->lost_reports);
        (void) esi_wire_set_text(&z, ESI_WIRE_ZONE_TAG_HEADERS_PTR,
                                 (const char *) d->purge->tag_names.data,
                                 d->purge->tag_names.len);

        if (esi_wire_finish(&b) != need) {
            return NGX_ERROR;
        }

        /*
         * ahead of what was queued while connecting (reports, purges):
         * attach() flushes the queue next
         */

        if (ngx_http_esi_daemon_enqueue(d, buf, need, first) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    /* should the announcement itself be lost, free_posted() says so again */

    d->lost_reports = 0;

    return NGX_OK;
}


/*
 * Tells esid about a file of an announced zone that this response was
 * served from or is being stored into, so that its variant index stays
 * complete.  The header filter runs before the upstream module computes
 * the final file name from the response's Vary: a response being stored
 * goes under r->cache->key or, if its Vary changed, back under
 * r->cache->main, so both are reported.  A name that never gets written
 * costs esid nothing but an entry a purge finds absent.
 */

void
ngx_http_esi_purge_index_report(ngx_http_request_t *r,
    ngx_http_esi_purge_main_conf_t *pmcf)
{
    ngx_uint_t              i, store;
    ngx_shm_zone_t        **zone;
    ngx_pool_cleanup_t     *cln;
    ngx_http_esi_stored_t  *stored;

    store = (r->upstream && r->upstream->cacheable && !r->cached);

    if (!r->cached && !store) {
        return;
    }

    zone = pmcf->zones.elts;

    for (i = 0; i < pmcf->zones.nelts; i++) {
        if (zone[i] == r->cache->file_cache->shm_zone) {
            break;
        }
    }

    if (i == pmcf->zones.nelts) {
        return;
    }

    if (!store) {
        ngx_http_esi_purge_index_object(r, r->pool, 0);
        return;
    }

    /*
     * NGINX renames a stored file into place once the body is in.  Reported
     * now, a purge in between would find no file, and esid would forget one
     * that then appears: reported when the request is over instead.
     */

    cln = ngx_pool_cleanup_add(r->pool, sizeof(ngx_http_esi_stored_t));
    if (cln == NULL) {
        return;
    }

    stored = cln->data;
    stored->request = r;
    stored->pool = r->pool;

    cln->handler = ngx_http_esi_purge_index_stored;
}


/*
 * r->pool is being destroyed, and r->pool is NULL by now
 * (ngx_http_free_request): the pool itself, which its cleanups may still
 * allocate from, is what the report is built in.
 */

static void
ngx_http_esi_purge_index_stored(void *data)
{
    ngx_http_esi_stored_t *stored = data;

    ngx_http_esi_purge_index_object(stored->request, stored->pool, 1);
}


/* whether a header carries tags: one of esi_purge_tag_headers */

ngx_uint_t
ngx_http_esi_purge_index_tag_header(ngx_http_esi_purge_main_conf_t *pmcf,
    ngx_str_t *name)
{
    ngx_str_t   *t;
    ngx_uint_t   i;

    t = pmcf->tag_headers->elts;

    for (i = 0; i < pmcf->tag_headers->nelts; i++) {
        if (name->len == t[i].len
            && ngx_strncasecmp(name->data, t[i].data, t[i].len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


/* a file of a zone esid indexes: its key, its file name and its tags */

static void
ngx_http_esi_purge_index_object(ngx_http_request_t *r, ngx_pool_t *pool,
    ngx_uint_t store)
{
    u_char                          *p;
    size_t                           len;
    ngx_str_t                        key, tags, *name, *k;
    ngx_uint_t                       i, n;
    ngx_list_part_t                 *part;
    ngx_table_elt_t                 *h;
    ngx_http_cache_t                *c;
    ngx_http_esi_purge_main_conf_t  *pmcf;

    c = r->cache;
    pmcf = ngx_http_get_module_main_conf(r, ngx_http_esi_purge_module);
    name = &c->file_cache->shm_zone->shm.name;

    if (ngx_http_esi_daemon.state == NGX_HTTP_ESI_IDLE) {

        /*
         * lost: esid puts the zone in doubt when this worker attaches
         * again and announces it
         */

        ngx_log_debug0(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                       "esi: esid is not connected, cache report dropped");
        return;
    }

    /* the key as NGINX writes its KEY line: the parts, concatenated */

    len = 0;
    k = c->keys.elts;

    for (n = 0; n < c->keys.nelts; n++) {
        len += k[n].len;
    }

    key.data = ngx_pnalloc(pool, len);
    if (key.data == NULL) {
        return;
    }

    p = key.data;

    for (n = 0; n < c->keys.nelts; n++) {
        p = ngx_cpymem(p, k[n].data, k[n].len);
    }

    key.len = len;

    /*
     * tags as the upstream sent them (as esid reads them from the file),
     * even when proxy_hide_header keeps them from the client
     */

    part = r->upstream ? &r->upstream->headers_in.headers.part
                       : &r->headers_out.headers.part;

    for (n = 0; n < 2; n++) {
        len = 0;
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

            if (h[i].hash == 0
                || !ngx_http_esi_purge_index_tag_header(pmcf, &h[i].key))
            {
                continue;
            }

            if (n == 0) {
                len += h[i].value.len + 1;
                continue;
            }

            /* space separated, whatever separated them before */

            tags.len = esi_tags_join(tags.data, tags.len, h[i].value.data,
                                     h[i].value.len);
        }

        if (n == 0) {
            tags.len = 0;
            tags.data = NULL;

            if (len == 0) {
                break;
            }

            tags.data = ngx_pnalloc(pool, len);
            if (tags.data == NULL) {
                return;
            }

            part = r->upstream ? &r->upstream->headers_in.headers.part
                               : &r->headers_out.headers.part;

        } else if (tags.len) {
            tags.len--;
        }
    }

    if (tags.len > NGX_HTTP_ESI_PURGE_TAGS_MAX) {

        /* the whole tags that fit; esid would refuse the report */

        len = esi_tags_fit(tags.data, tags.len, NGX_HTTP_ESI_PURGE_TAGS_MAX);

        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "esi: \"%V\" has %uz bytes of tags, esid indexes "
                      "the first %uz", &key, tags.len, len);

        tags.len = len;
    }

    if (ngx_http_esi_purge_index_file(r, pool, name, &key, c->key, &tags)
        != NGX_OK)
    {
        return;
    }

    if (store && ngx_memcmp(c->key, c->main, NGX_HTTP_CACHE_KEY_LEN) != 0) {
        (void) ngx_http_esi_purge_index_file(r, pool, name, &key, c->main,
                                             &tags);
    }
}


static ngx_int_t
ngx_http_esi_purge_index_file(ngx_http_request_t *r, ngx_pool_t *pool,
    ngx_str_t *zone, ngx_str_t *key, u_char *file, ngx_str_t *tags)
{
    size_t                  need;
    u_char                 *buf, *dst;
    esi_wire_out_t          req, stored;
    esi_wire_builder_t      b;
    ngx_http_esi_daemon_t  *d;

    d = &ngx_http_esi_daemon;

    need = esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS
                         + ESI_WIRE_REQUEST_POINTERS
                         + ESI_WIRE_STORED_DATA_WORDS
                         + ESI_WIRE_STORED_POINTERS,
                         esi_wire_blob(zone->len + 1)
                         + esi_wire_blob(key->len + 1)
                         + esi_wire_blob(NGX_HTTP_CACHE_KEY_LEN)
                         + esi_wire_blob(tags->len + 1));

    buf = ngx_palloc(pool, need);
    if (buf == NULL) {
        return NGX_ERROR;
    }

    ngx_http_esi_daemon_request(&b, buf, need, 0,
                                ESI_WIRE_REQUEST_STORED_WHICH, &req);
    (void) esi_wire_set_struct(&req, ESI_WIRE_REQUEST_STORED_PTR,
                               ESI_WIRE_STORED_DATA_WORDS,
                               ESI_WIRE_STORED_POINTERS, &stored);
    (void) esi_wire_set_text(&stored, ESI_WIRE_STORED_ZONE_PTR,
                             (const char *) zone->data, zone->len);
    (void) esi_wire_set_text(&stored, ESI_WIRE_STORED_KEY_PTR,
                             (const char *) key->data, key->len);
    dst = esi_wire_alloc_data(&stored, ESI_WIRE_STORED_FILE_PTR,
                              NGX_HTTP_CACHE_KEY_LEN);
    if (dst) {
        ngx_memcpy(dst, file, NGX_HTTP_CACHE_KEY_LEN);
    }

    (void) esi_wire_set_text(&stored, ESI_WIRE_STORED_TAGS_PTR,
                             (const char *) tags->data, tags->len);

    if (esi_wire_finish(&b) != need) {
        return NGX_ERROR;
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, r->connection->log, 0,
                   "esi: cache report for \"%V\"", key);

    if (ngx_http_esi_daemon_post(d, buf, need) == NGX_OK) {
        return NGX_OK;
    }

    /*
     * A report esid never gets leaves its index incomplete: the next
     * announcement says so, and esid doubts the zone.  A connection that
     * cannot take a report is dropped, so that the announcement comes soon.
     */

    d->lost_reports = 1;

    if (d->state != NGX_HTTP_ESI_IDLE) {
        ngx_http_esi_daemon_drop(d, NGX_LOG_ERR,
                                 "esi: a cache report cannot reach esid");
    }

    return NGX_ERROR;
}
