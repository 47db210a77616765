
/*
 * Copyright (C) The ESI project authors
 *
 * Surrogate-Capability upstream and Surrogate-Control, and the lookup of
 * a header by name the module's files share.
 */


#include "ngx_http_esi.h"


/* Surrogate-Control is for us: the client never sees it */

void
ngx_http_esi_surrogate_hide(ngx_http_request_t *r)
{
    ngx_table_elt_t  *h;

    for ( ;; ) {
        h = ngx_http_esi_surrogate_find_header(&r->headers_out.headers,
                                               "Surrogate-Control");
        if (h == NULL) {
            return;
        }

        h->hash = 0;
    }
}


/* Surrogate headers (W3C Note "Edge Architecture Specification 1.0") */

/*
 * esi_surrogate: the request upstream says Surrogate-Capability NAME=
 * "ESI/1.0", ours only: a client's would let it ask the origin for markup
 * meant for us, or pretend to be a surrogate in front of us.
 */

ngx_int_t
ngx_http_esi_surrogate_capability(ngx_http_request_t *r)
{
    ngx_uint_t                i, ours, forged;
    ngx_list_t                headers;
    ngx_list_part_t          *part;
    ngx_table_elt_t          *h, *nh;
    ngx_http_esi_loc_conf_t  *elcf;

    static u_char  name[] = "Surrogate-Capability";
    static u_char  lowcase[] = "surrogate-capability";

    elcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_module);

    if (elcf->capability.len == 0) {
        return NGX_DECLINED;
    }

    ours = 0;
    forged = 0;

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

        if (h[i].key.len != sizeof(name) - 1
            || ngx_strncasecmp(h[i].key.data, name, sizeof(name) - 1) != 0)
        {
            continue;
        }

        if (!ours
            && h[i].value.len == elcf->capability.len
            && ngx_strncmp(h[i].value.data, elcf->capability.data,
                           elcf->capability.len) == 0)
        {
            ours = 1;

        } else {
            forged = 1;
        }
    }

    if (ours && !forged) {
        return NGX_DECLINED;
    }

    /*
     * A subrequest's list shares its parts with the parent's, so it is
     * never pushed to; a client's header cannot be taken out of a list:
     * either way the list is built anew, without them
     */

    if (forged || r != r->main) {
        if (ngx_list_init(&headers, r->pool, 20, sizeof(ngx_table_elt_t))
            != NGX_OK)
        {
            return NGX_ERROR;
        }

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

            if (h[i].key.len == sizeof(name) - 1
                && ngx_strncasecmp(h[i].key.data, name, sizeof(name) - 1)
                   == 0)
            {
                continue;
            }

            nh = ngx_list_push(&headers);
            if (nh == NULL) {
                return NGX_ERROR;
            }

            *nh = h[i];
        }

        r->headers_in.headers = headers;

        if (headers.last == &headers.part) {
            r->headers_in.headers.last = &r->headers_in.headers.part;
        }
    }

    nh = ngx_list_push(&r->headers_in.headers);
    if (nh == NULL) {
        return NGX_ERROR;
    }

    nh->hash = ngx_hash_key(lowcase, sizeof(lowcase) - 1);
    nh->key.len = sizeof(name) - 1;
    nh->key.data = name;
    nh->value = elcf->capability;
    nh->lowcase_key = lowcase;

    return NGX_DECLINED;
}


/*
 * esi_surrogate_control on: a response is ours to process only when its
 * Surrogate-Control says content="ESI/1.0" to us; its no-store and max-age
 * decide for the cached object, as Cache-Control does for others (this
 * header filter runs before the upstream module decides to store it).  The
 * client never sees the header; the cache file keeps it, so that a hit
 * decides the same way.  NGX_DECLINED: not for ESI.
 */

ngx_int_t
ngx_http_esi_surrogate_control(ngx_http_request_t *r,
    ngx_http_esi_loc_conf_t *elcf)
{
    time_t                     max_age;
    ngx_uint_t                 i;
    ngx_list_part_t           *part;
    ngx_table_elt_t           *h;
    ngx_http_upstream_t       *u;
    esi_surrogate_t            sc;

    static u_char  name[] = "Surrogate-Control";

    esi_surrogate_init(&sc);

    part = &r->headers_out.headers.part;
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
            || h[i].key.len != sizeof(name) - 1
            || ngx_strncasecmp(h[i].key.data, name, sizeof(name) - 1) != 0)
        {
            continue;
        }

        esi_surrogate_parse(&sc, h[i].value.data, h[i].value.len,
                            elcf->surrogate.data, elcf->surrogate.len);

        h[i].hash = 0;
    }

    u = r->upstream;

    if (u && r->cache && u->cacheable && !r->cached) {
        max_age = sc.max_age_targeted >= 0 ? sc.max_age_targeted
                                           : sc.max_age;

        if (sc.no_store || max_age == 0) {
            u->cacheable = 0;

        } else if (max_age > 0) {

            /* a max-age past the end of time_t is for ever, not the past */

            r->cache->valid_sec = max_age > NGX_MAX_TIME_T_VALUE - ngx_time()
                                  ? NGX_MAX_TIME_T_VALUE
                                  : ngx_time() + max_age;
        }
    }

    return sc.esi ? NGX_OK : NGX_DECLINED;
}


/* the first header of that name in a list, deleted ones (hash 0) aside */

ngx_table_elt_t *
ngx_http_esi_surrogate_find_header(ngx_list_t *headers, const char *name)
{
    size_t            len;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    len = ngx_strlen(name);
    part = &headers->part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NULL;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash
            && h[i].key.len == len
            && ngx_strncasecmp(h[i].key.data, (u_char *) name, len) == 0)
        {
            return &h[i];
        }
    }
}
