
/*
 * Copyright (C) The ESI project authors
 *
 * Surrogate-Capability upstream and Surrogate-Control.
 */


#include "ngx_http_esi.h"


static void ngx_http_esi_surrogate_parse(ngx_str_t *value, ngx_str_t *name,
    ngx_http_esi_surrogate_t *sc);


/* Surrogate-Control is for us: the client never sees it */

void
ngx_http_esi_surrogate_hide(ngx_http_request_t *r)
{
    ngx_table_elt_t  *h;

    for ( ;; ) {
        h = ngx_http_esi_filter_find_header(&r->headers_out.headers,
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
    ngx_http_esi_surrogate_t   sc;

    static u_char  name[] = "Surrogate-Control";

    sc.max_age = -1;
    sc.max_age_targeted = -1;
    sc.esi = 0;
    sc.no_store = 0;

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

        ngx_http_esi_surrogate_parse(&h[i].value, &elcf->surrogate, &sc);

        h[i].hash = 0;
    }

    u = r->upstream;

    if (u && r->cache && u->cacheable && !r->cached) {
        max_age = sc.max_age_targeted >= 0 ? sc.max_age_targeted
                                           : sc.max_age;

        if (sc.no_store || max_age == 0) {
            u->cacheable = 0;

        } else if (max_age > 0) {
            r->cache->valid_sec = ngx_time() + max_age;
        }
    }

    return sc.esi ? NGX_OK : NGX_DECLINED;
}


/*
 * One Surrogate-Control value: comma-separated directives, each with an
 * optional ";target"; those without a target or for ours are taken.
 * Anything else, malformed or unknown, is skipped.
 */

static void
ngx_http_esi_surrogate_parse(ngx_str_t *value, ngx_str_t *name,
    ngx_http_esi_surrogate_t *sc)
{
    u_char     *p, *end, *start, *last, *target, *v, *q;
    time_t      n;
    size_t      len;
    ngx_uint_t  quoted, targeted;

    p = value->data;
    end = p + value->len;

    while (p < end) {

        /* one directive: up to a comma outside quotes */

        start = p;
        target = NULL;
        quoted = 0;

        for ( /* void */ ; p < end; p++) {
            if (*p == '"') {
                quoted = !quoted;

            } else if (!quoted && *p == ',') {
                break;

            } else if (!quoted && *p == ';' && target == NULL) {
                target = p;
            }
        }

        last = target ? target : p;
        p++;        /* past the comma */

        while (start < last && (*start == ' ' || *start == '\t')) {
            start++;
        }

        while (last > start && (last[-1] == ' ' || last[-1] == '\t')) {
            last--;
        }

        targeted = 0;

        if (target) {
            target++;
            q = ngx_min(p - 1, end);

            while (target < q && (*target == ' ' || *target == '\t')) {
                target++;
            }

            while (q > target && (q[-1] == ' ' || q[-1] == '\t')) {
                q--;
            }

            len = q - target;

            if (len != name->len || len == 0
                || ngx_strncasecmp(target, name->data, len) != 0)
            {
                continue;
            }

            targeted = 1;
        }

        len = last - start;

        if (len == sizeof("no-store") - 1
            && ngx_strncasecmp(start, (u_char *) "no-store", len) == 0)
        {
            sc->no_store = 1;
            continue;
        }

        v = ngx_strlchr(start, last, '=');
        if (v == NULL) {
            continue;
        }

        len = v - start;
        v++;

        if (len == sizeof("max-age") - 1
            && ngx_strncasecmp(start, (u_char *) "max-age", len) == 0)
        {
            /* max-age=N[+M]: M is for stale content, N is ours */

            q = ngx_strlchr(v, last, '+');
            n = ngx_atotm(v, (q ? q : last) - v);

            if (n == NGX_ERROR) {
                continue;
            }

            if (targeted) {
                sc->max_age_targeted = n;

            } else {
                sc->max_age = n;
            }

            continue;
        }

        if (len == sizeof("content") - 1
            && ngx_strncasecmp(start, (u_char *) "content", len) == 0)
        {
            /* content="ESI/1.0 ESI-INLINE/1.0": a space-separated list */

            if (v < last && *v == '"') {
                v++;
            }

            if (last > v && last[-1] == '"') {
                last--;
            }

            while (v < last) {
                while (v < last && *v == ' ') {
                    v++;
                }

                q = v;

                while (q < last && *q != ' ') {
                    q++;
                }

                if (q - v == sizeof("ESI/1.0") - 1
                    && ngx_strncasecmp(v, (u_char *) "ESI/1.0", q - v) == 0)
                {
                    sc->esi = 1;
                }

                v = q;
            }
        }
    }
}
