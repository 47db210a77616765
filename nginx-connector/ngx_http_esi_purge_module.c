
/*
 * Copyright (C) The ESI project authors
 *
 * The purge module (esi_cache_purge), in the same .so as the ESI filter:
 * its directives and configuration, the access check that hands a purge
 * request to the handler (ngx_http_esi_purge.c), and a header filter that
 * feeds esid's variant index (ngx_http_esi_purge_index.c).
 */


#include "ngx_http_esi.h"


static ngx_int_t ngx_http_esi_purge_access(ngx_http_request_t *r);
static ngx_int_t ngx_http_esi_purge_header_filter(ngx_http_request_t *r);
static void ngx_http_esi_purge_check_key(ngx_http_request_t *r,
    ngx_http_esi_purge_loc_conf_t *plcf);
static void *ngx_http_esi_purge_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_esi_purge_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_esi_purge_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_esi_purge_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_esi_purge_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_esi_purge_compat(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_http_complex_value_t *ngx_http_esi_purge_compile(ngx_conf_t *cf,
    ngx_str_t *value);
static char *ngx_http_esi_purge_named(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_esi_purge_loc_conf_t *plcf, ngx_str_t *name, ngx_str_t *key);
static char *ngx_http_esi_purge_method(ngx_conf_t *cf,
    ngx_http_esi_purge_loc_conf_t *plcf, ngx_str_t *name);
static char *ngx_http_esi_purge_from(ngx_conf_t *cf,
    ngx_http_esi_purge_loc_conf_t *plcf, ngx_uint_t first);
static char *ngx_http_esi_purge_response_type(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static char *ngx_http_esi_purge_index_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_esi_purge_tag_headers(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_http_esi_purge_add_zone(ngx_conf_t *cf,
    ngx_shm_zone_t *zone);
static ngx_shm_zone_t *ngx_http_esi_purge_cache_zone(ngx_conf_t *cf,
    ngx_module_t **cache);
static ngx_http_complex_value_t *ngx_http_esi_purge_location_key(
    ngx_conf_t *cf, ngx_http_esi_purge_loc_conf_t *plcf, ngx_module_t *cache);
static ngx_http_complex_value_t *ngx_http_esi_purge_proxy_key(ngx_conf_t *cf);
#if (NGX_HTTP_SSL)
static ngx_uint_t ngx_http_esi_purge_proxy_https(ngx_module_t *proxy,
    void *plcf);
#endif
static ngx_int_t ngx_http_esi_purge_named_zones(ngx_conf_t *cf,
    ngx_http_esi_purge_main_conf_t *pmcf);
static ngx_int_t ngx_http_esi_purge_use(ngx_conf_t *cf,
    ngx_http_esi_purge_loc_conf_t *plcf);
static ngx_int_t ngx_http_esi_purge_shared_zones(ngx_conf_t *cf,
    ngx_http_esi_purge_main_conf_t *pmcf);
static ngx_uint_t ngx_http_esi_purge_key_has_host(ngx_str_t *key);
static ngx_int_t ngx_http_esi_purge_module_init(ngx_conf_t *cf);


static ngx_conf_enum_t  ngx_http_esi_purge_response_types[] = {
    { ngx_string("html"), NGX_HTTP_ESI_PURGE_HTML },
    { ngx_string("json"), NGX_HTTP_ESI_PURGE_JSON },
    { ngx_string("xml"), NGX_HTTP_ESI_PURGE_XML },
    { ngx_string("text"), NGX_HTTP_ESI_PURGE_TEXT },
    { ngx_null_string, 0 }
};


/* the tag headers of every convention, when esi_purge_tag_headers is not set */

static ngx_str_t  ngx_http_esi_purge_default_tag_headers[] = {
    ngx_string("Surrogate-Key"),            /* Fastly, Akamai */
    ngx_string("xkey"),                     /* Varnish xkey, FOSHttpCache */
    ngx_string("Cache-Tag"),                /* Cloudflare */
    ngx_string("Cache-Tags"),               /* Drupal */
    ngx_string("Purge-Cache-Tags"),         /* Drupal's purge module */
    ngx_string("X-Magento-Tags")            /* Magento 2 */
};


static ngx_command_t  ngx_http_esi_purge_commands[] = {

    { ngx_string("esi_cache_purge"),
      NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_esi_purge_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_cache_purge_key"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_set_complex_value_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_loc_conf_t, key),
      NULL },

    { ngx_string("esi_cache_purge_soft"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_loc_conf_t, soft),
      NULL },

    { ngx_string("proxy_cache_purge"),
      NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_esi_purge_compat,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("fastcgi_cache_purge"),
      NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_esi_purge_compat,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("uwsgi_cache_purge"),
      NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_esi_purge_compat,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("scgi_cache_purge"),
      NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_esi_purge_compat,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("cache_purge_response_type"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_esi_purge_response_type,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_loc_conf_t, response_type),
      &ngx_http_esi_purge_response_types },

    { ngx_string("cache_purge_background_queue"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_main_conf_t, queue),
      NULL },

    { ngx_string("cache_purge_queue_size"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_main_conf_t, queue_size),
      NULL },

    { ngx_string("cache_purge_batch_size"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_main_conf_t, batch_size),
      NULL },

    { ngx_string("cache_purge_throttle_ms"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_main_conf_t, throttle),
      NULL },

    { ngx_string("cache_purge_vary_aware"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_main_conf_t, vary_aware),
      NULL },

    { ngx_string("cache_purge_legacy_status"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_loc_conf_t, legacy_status),
      NULL },

    { ngx_string("esi_cache_purge_response_type"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_esi_purge_response_type,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_loc_conf_t, response_type),
      &ngx_http_esi_purge_response_types },

    { ngx_string("esi_purge_index"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_esi_purge_index_conf,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_purge_tag_headers"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_1MORE,
      ngx_http_esi_purge_tag_headers,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_purge_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_purge_main_conf_t, timeout),
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_esi_purge_module_ctx = {
    NULL,                                  /* preconfiguration */
    ngx_http_esi_purge_module_init,        /* postconfiguration */

    ngx_http_esi_purge_create_main_conf,   /* create main configuration */
    ngx_http_esi_purge_init_main_conf,     /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_esi_purge_create_loc_conf,    /* create location configuration */
    ngx_http_esi_purge_merge_loc_conf      /* merge location configuration */
};


ngx_module_t  ngx_http_esi_purge_module = {
    NGX_MODULE_V1,
    &ngx_http_esi_purge_module_ctx,        /* module context */
    ngx_http_esi_purge_commands,           /* module directives */
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


/*
 * The upstream modules whose caches a purge can purge, by name (an nginx
 * may be built without any of them): each one's location configuration
 * starts with its ngx_http_upstream_conf_t (ngx_http_esi_layout_check()
 * proves it), and its *_cache_path zones are tagged with the module.
 */

static char  *ngx_http_esi_purge_cache_modules[] = {
    "ngx_http_proxy_module",
    "ngx_http_fastcgi_module",
    "ngx_http_uwsgi_module",
    "ngx_http_scgi_module",
    NULL
};

static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;


/* purge */

/*
 * The same-location form: a request with the configured method, in a
 * location whose proxy_cache zone esid indexes, is a purge when it comes
 * from an allowed address.
 */

static ngx_int_t
ngx_http_esi_purge_access(ngx_http_request_t *r)
{
    ngx_str_t                      *m;
    ngx_uint_t                      i;
    ngx_http_esi_purge_loc_conf_t  *plcf;

    plcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_purge_module);

    if (plcf->purge != NGX_HTTP_ESI_PURGE_METHOD || r != r->main) {
        return NGX_DECLINED;
    }

    m = plcf->methods->elts;

    for (i = 0; i < plcf->methods->nelts; i++) {
        if (r->method_name.len == m[i].len
            && ngx_strncmp(r->method_name.data, m[i].data, m[i].len) == 0)
        {
            break;
        }
    }

    if (i == plcf->methods->nelts) {
        return NGX_DECLINED;
    }

    if (plcf->from
        && ngx_cidr_match(r->connection->sockaddr, plcf->from)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "esi: purge by %V forbidden", &r->connection->addr_text);
        return NGX_HTTP_FORBIDDEN;
    }

    r->content_handler = ngx_http_esi_purge_handler;

    return NGX_DECLINED;
}


/* the files a cached response comes from or goes to, for esid's index */

static ngx_int_t
ngx_http_esi_purge_header_filter(ngx_http_request_t *r)
{
    ngx_http_esi_purge_loc_conf_t   *plcf;
    ngx_http_esi_purge_main_conf_t  *pmcf;

    pmcf = ngx_http_get_module_main_conf(r, ngx_http_esi_purge_module);

    if (r->cache && pmcf->zones.nelts) {
        ngx_http_esi_purge_index_report(r, pmcf);

        plcf = ngx_http_get_module_loc_conf(r, ngx_http_esi_purge_module);

        if (plcf->purge == NGX_HTTP_ESI_PURGE_METHOD && !plcf->key_checked) {
            ngx_http_esi_purge_check_key(r, plcf);
        }
    }

    return ngx_http_next_header_filter(r);
}


/*
 * The same-location form purges the location's *_cache_key, or
 * esi_cache_purge_key where set, which must be the same: the first cached
 * response a worker sends from the location tells, and a key that differs
 * is an error in the log, not a silent miss on every purge.
 */

static void
ngx_http_esi_purge_check_key(ngx_http_request_t *r,
    ngx_http_esi_purge_loc_conf_t *plcf)
{
    u_char            *p;
    size_t             len;
    ngx_str_t          key, *part, cached;
    ngx_uint_t         i;
    ngx_http_cache_t  *c;

    c = r->cache;

    if (ngx_http_complex_value(r, plcf->key, &key) != NGX_OK) {
        return;
    }

    plcf->key_checked = 1;

    len = 0;
    part = c->keys.elts;

    for (i = 0; i < c->keys.nelts; i++) {
        len += part[i].len;
    }

    if (len == key.len) {
        p = key.data;

        for (i = 0; i < c->keys.nelts; i++) {
            if (ngx_memcmp(p, part[i].data, part[i].len) != 0) {
                break;
            }

            p += part[i].len;
        }

        if (i == c->keys.nelts) {
            return;
        }
    }

    cached.data = ngx_pnalloc(r->pool, len);
    if (cached.data == NULL) {
        return;
    }

    p = cached.data;

    for (i = 0; i < c->keys.nelts; i++) {
        p = ngx_cpymem(p, part[i].data, part[i].len);
    }

    cached.len = len;

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "esi: esi_cache_purge_key gives \"%V\" where the cache key "
                  "is \"%V\": purges in this location miss; make "
                  "esi_cache_purge_key the location's *_cache_key",
                  &key, &cached);
}


static void *
ngx_http_esi_purge_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_esi_purge_main_conf_t  *pmcf;

    pmcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_esi_purge_main_conf_t));
    if (pmcf == NULL) {
        return NULL;
    }

    pmcf->index = NGX_CONF_UNSET_SIZE;
    pmcf->timeout = NGX_CONF_UNSET_MSEC;
    pmcf->queue = NGX_CONF_UNSET;
    pmcf->queue_size = NGX_CONF_UNSET;
    pmcf->batch_size = NGX_CONF_UNSET;
    pmcf->throttle = NGX_CONF_UNSET_MSEC;
    pmcf->vary_aware = NGX_CONF_UNSET;

    if (ngx_array_init(&pmcf->zones, cf->pool, 4, sizeof(ngx_shm_zone_t *))
        != NGX_OK)
    {
        return NULL;
    }

    if (ngx_array_init(&pmcf->named, cf->pool, 2,
                       sizeof(ngx_http_esi_purge_loc_conf_t *))
        != NGX_OK)
    {
        return NULL;
    }

    if (ngx_array_init(&pmcf->uses, cf->temp_pool, 4,
                       sizeof(ngx_http_esi_purge_use_t))
        != NGX_OK)
    {
        return NULL;
    }

    return pmcf;
}


static char *
ngx_http_esi_purge_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_esi_purge_main_conf_t *pmcf = conf;

    u_char     *p;
    ngx_str_t  *h;
    ngx_uint_t  i;

    static ngx_str_t  default_key = ngx_string("$uri$is_args$args");

    ngx_conf_init_size_value(pmcf->index, 64 * 1024 * 1024);
    ngx_conf_init_msec_value(pmcf->timeout, 60000);
    ngx_conf_init_value(pmcf->queue, 0);

    pmcf->default_key = ngx_http_esi_purge_compile(cf, &default_key);
    if (pmcf->default_key == NULL) {
        return NGX_CONF_ERROR;
    }

    if (pmcf->tag_headers == NULL) {
        pmcf->tag_headers = ngx_array_create(cf->pool, 6, sizeof(ngx_str_t));
        if (pmcf->tag_headers == NULL) {
            return NGX_CONF_ERROR;
        }

        for (i = 0; i < 6; i++) {
            h = ngx_array_push(pmcf->tag_headers);
            if (h == NULL) {
                return NGX_CONF_ERROR;
            }

            *h = ngx_http_esi_purge_default_tag_headers[i];
        }
    }

    /* as the zone announcement carries them to esid, for its scans */

    h = pmcf->tag_headers->elts;

    for (i = 0; i < pmcf->tag_headers->nelts; i++) {
        pmcf->tag_names.len += h[i].len + 1;
    }

    pmcf->tag_names.data = ngx_pnalloc(cf->pool, pmcf->tag_names.len);
    if (pmcf->tag_names.data == NULL) {
        return NGX_CONF_ERROR;
    }

    p = pmcf->tag_names.data;

    for (i = 0; i < pmcf->tag_headers->nelts; i++) {
        p = ngx_cpymem(p, h[i].data, h[i].len);
        *p++ = ' ';
    }

    pmcf->tag_names.len--;

    return NGX_CONF_OK;
}


static void *
ngx_http_esi_purge_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_esi_purge_loc_conf_t  *plcf;

    plcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_esi_purge_loc_conf_t));
    if (plcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     plcf->purge = NGX_HTTP_ESI_PURGE_OFF;
     *     plcf->methods = NULL;
     *     plcf->from = NULL;
     *     plcf->zone = NULL;
     *     plcf->key = NULL;
     */

    plcf->soft = NGX_CONF_UNSET;
    plcf->response_type = NGX_CONF_UNSET_UINT;
    plcf->legacy_status = NGX_CONF_UNSET;

    return plcf;
}


static char *
ngx_http_esi_purge_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_esi_purge_loc_conf_t *prev = parent;
    ngx_http_esi_purge_loc_conf_t *conf = child;

    ngx_module_t  *cache;

    ngx_conf_merge_value(conf->soft, prev->soft, 0);
    ngx_conf_merge_uint_value(conf->response_type, prev->response_type,
                              NGX_HTTP_ESI_PURGE_HTML);
    ngx_conf_merge_value(conf->legacy_status, prev->legacy_status, 1);

    if (conf->key == NULL) {
        conf->key = prev->key;
    }

    if (conf->purge == NGX_HTTP_ESI_PURGE_METHOD) {

        conf->zone = ngx_http_esi_purge_cache_zone(cf, &cache);

        if (conf->zone == NULL) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"esi_cache_purge %V\" needs \"proxy_cache\", "
                               "\"fastcgi_cache\", \"uwsgi_cache\" or "
                               "\"scgi_cache\" with a zone name in the same "
                               "location, or use \"esi_cache_purge zone=NAME "
                               "key=KEY\" in a location of its own",
                               conf->methods->elts);
            return NGX_CONF_ERROR;
        }

        if (conf->key == NULL) {
            conf->key = ngx_http_esi_purge_location_key(cf, conf, cache);
            if (conf->key == NULL) {
                return NGX_CONF_ERROR;
            }
        }

        if (ngx_http_esi_purge_add_zone(cf, conf->zone) != NGX_OK) {
            return NGX_CONF_ERROR;
        }
    }

    if (ngx_http_esi_purge_use(cf, conf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * esi_cache_purge METHOD ... from all | ADDRESS|CIDR ...;
 * esi_cache_purge zone=NAME key=KEY;
 */

static char *
ngx_http_esi_purge_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_purge_loc_conf_t *plcf = conf;

    char        *rv;
    ngx_str_t   *value, name, key;
    ngx_uint_t   i, from;

    if (plcf->purge != NGX_HTTP_ESI_PURGE_OFF) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strncmp(value[1].data, "zone=", 5) == 0
        || ngx_strncmp(value[1].data, "key=", 4) == 0)
    {
        ngx_str_null(&name);
        ngx_str_null(&key);

        for (i = 1; i < cf->args->nelts; i++) {

            if (ngx_strncmp(value[i].data, "zone=", 5) == 0) {
                name.data = value[i].data + 5;
                name.len = value[i].len - 5;
                continue;
            }

            if (ngx_strncmp(value[i].data, "key=", 4) == 0) {
                key.data = value[i].data + 4;
                key.len = value[i].len - 4;
                continue;
            }

            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid parameter \"%V\"", &value[i]);
            return NGX_CONF_ERROR;
        }

        if (name.len == 0 || key.len == 0) {
            return "needs \"zone=NAME\" and \"key=KEY\"";
        }

        return ngx_http_esi_purge_named(cf, cmd, plcf, &name, &key);
    }

    /* METHOD ... from all | ADDRESS|CIDR ... */

    for (from = 1; from < cf->args->nelts; from++) {
        if (value[from].len == 4
            && ngx_strncmp(value[from].data, "from", 4) == 0)
        {
            break;
        }
    }

    if (from == 1 || from + 1 >= cf->args->nelts) {
        return "must be \"METHOD ... from all|ADDRESS ...\" or "
               "\"zone=NAME key=KEY\"";
    }

    for (i = 1; i < from; i++) {
        rv = ngx_http_esi_purge_method(cf, plcf, &value[i]);
        if (rv != NGX_CONF_OK) {
            return rv;
        }
    }

    plcf->purge = NGX_HTTP_ESI_PURGE_METHOD;

    return ngx_http_esi_purge_from(cf, plcf, from + 1);
}


/*
 * ngx_cache_purge's directives, with its meaning, so that its users'
 * configurations work as they are (and get every variant, tags, the index):
 *
 *     proxy_cache_purge on | off | METHOD [purge_all] [from all | ADDRESS ...];
 *     proxy_cache_purge ZONE KEY;
 *
 * and fastcgi_, uwsgi_ and scgi_cache_purge alike.  A miss is its 412, or
 * 404 with cache_purge_legacy_status off.
 */

static char *
ngx_http_esi_purge_compat(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_purge_loc_conf_t *plcf = conf;

    char                      *rv;
    ngx_str_t                 *value, on = ngx_string("PURGE");
    ngx_uint_t                 i;
    ngx_http_core_loc_conf_t  *clcf;

    if (plcf->purge != NGX_HTTP_ESI_PURGE_OFF || plcf->compat) {
        return "is duplicate";
    }

    value = cf->args->elts;
    plcf->compat = 1;

    if (cf->args->nelts == 3
        && ngx_strcmp(value[2].data, "from") != 0
        && ngx_strcmp(value[2].data, "purge_all") != 0)
    {
        return ngx_http_esi_purge_named(cf, cmd, plcf, &value[1], &value[2]);
    }

    if (ngx_strcmp(value[1].data, "off") == 0) {
        return cf->args->nelts == 2 ? NGX_CONF_OK : "takes nothing after off";
    }

    rv = ngx_http_esi_purge_method(cf, plcf,
                                   ngx_strcmp(value[1].data, "on") == 0
                                   ? &on : &value[1]);
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    plcf->purge = NGX_HTTP_ESI_PURGE_METHOD;

    /* the proxy module's default proxy_cache_key */

    plcf->proxy = (ngx_strcmp(cmd->name.data, "proxy_cache_purge") == 0);

    i = 2;

    if (i < cf->args->nelts && ngx_strcmp(value[i].data, "purge_all") == 0) {
        plcf->all = 1;
        i++;
    }

    if (i == cf->args->nelts) {

        /* ngx_cache_purge's meaning, which esi_cache_purge refuses */

        clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"%V\" without \"from\" lets any address "
                           "purge: add \"from 127.0.0.1\" (the addresses "
                           "that purge) or an allow list, or say \"from "
                           "all\", in location \"%V\"", &cmd->name,
                           &clcf->name);

        return NGX_CONF_OK;
    }

    if (ngx_strcmp(value[i].data, "from") != 0 || i + 1 == cf->args->nelts) {
        return "must be \"on|off|METHOD [purge_all] [from all|ADDRESS ...]\" "
               "or \"ZONE KEY\"";
    }

    return ngx_http_esi_purge_from(cf, plcf, i + 1);
}


static ngx_http_complex_value_t *
ngx_http_esi_purge_compile(ngx_conf_t *cf, ngx_str_t *value)
{
    ngx_http_compile_complex_value_t  ccv;

    ngx_memzero(&ccv, sizeof(ngx_http_compile_complex_value_t));

    ccv.cf = cf;
    ccv.value = value;
    ccv.complex_value = ngx_palloc(cf->pool, sizeof(ngx_http_complex_value_t));
    if (ccv.complex_value == NULL) {
        return NULL;
    }

    if (ngx_http_compile_complex_value(&ccv) != NGX_OK) {
        return NULL;
    }

    return ccv.complex_value;
}


/* the separate-location form: every request here purges KEY from ZONE */

static char *
ngx_http_esi_purge_named(ngx_conf_t *cf, ngx_command_t *cmd,
    ngx_http_esi_purge_loc_conf_t *plcf, ngx_str_t *name, ngx_str_t *key)
{
    u_char                           *p;
    ngx_str_t                        *file;
    ngx_http_core_loc_conf_t         *clcf;
    ngx_http_esi_purge_loc_conf_t   **named;
    ngx_http_esi_purge_main_conf_t   *pmcf;

    plcf->key = ngx_http_esi_purge_compile(cf, key);
    if (plcf->key == NULL) {
        return NGX_CONF_ERROR;
    }

    plcf->purge = NGX_HTTP_ESI_PURGE_LOCATION;
    plcf->zone_name = *name;

    /* the zone is looked for at the end: say then where it was named */

    file = &cf->conf_file->file.name;

    plcf->zone_where.data = ngx_pnalloc(cf->pool, cmd->name.len + file->len
                                        + sizeof("\"\" in :") - 1
                                        + NGX_INT_T_LEN);
    if (plcf->zone_where.data == NULL) {
        return NGX_CONF_ERROR;
    }

    p = ngx_sprintf(plcf->zone_where.data, "\"%V\" in %V:%ui",
                    &cmd->name, file, cf->conf_file->line);
    plcf->zone_where.len = p - plcf->zone_where.data;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_esi_purge_handler;

    /* any *_cache_path may declare the zone, before or after this */

    pmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_purge_module);

    named = ngx_array_push(&pmcf->named);
    if (named == NULL) {
        return NGX_CONF_ERROR;
    }

    *named = plcf;

    return NGX_CONF_OK;
}


/* a method the same-location form purges on */

static char *
ngx_http_esi_purge_method(ngx_conf_t *cf, ngx_http_esi_purge_loc_conf_t *plcf,
    ngx_str_t *name)
{
    ngx_str_t   *method;
    ngx_uint_t   i;

    for (i = 0; i < name->len; i++) {
        if ((name->data[i] < 'A' || name->data[i] > 'Z')
            && name->data[i] != '_' && name->data[i] != '-')
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid method \"%V\"", name);
            return NGX_CONF_ERROR;
        }
    }

    if (plcf->methods == NULL) {
        plcf->methods = ngx_array_create(cf->pool, 2, sizeof(ngx_str_t));
        if (plcf->methods == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    method = ngx_array_push(plcf->methods);
    if (method == NULL) {
        return NGX_CONF_ERROR;
    }

    *method = *name;

    return NGX_CONF_OK;
}


/* "from all | ADDRESS|CIDR ...", from the first-th argument on */

static char *
ngx_http_esi_purge_from(ngx_conf_t *cf, ngx_http_esi_purge_loc_conf_t *plcf,
    ngx_uint_t first)
{
    ngx_int_t    rc;
    ngx_str_t   *value;
    ngx_uint_t   i;
    ngx_cidr_t  *cidr;

    value = cf->args->elts;

    if (cf->args->nelts == first + 1 && value[first].len == 3
        && ngx_strncmp(value[first].data, "all", 3) == 0)
    {
        return NGX_CONF_OK;
    }

    plcf->from = ngx_array_create(cf->pool, cf->args->nelts - first,
                                  sizeof(ngx_cidr_t));
    if (plcf->from == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = first; i < cf->args->nelts; i++) {
        cidr = ngx_array_push(plcf->from);
        if (cidr == NULL) {
            return NGX_CONF_ERROR;
        }

        rc = ngx_ptocidr(&value[i], cidr);

        if (rc == NGX_ERROR) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid address \"%V\"", &value[i]);
            return NGX_CONF_ERROR;
        }

        if (rc == NGX_DONE) {
            ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                               "low address bits of %V are meaningless",
                               &value[i]);
        }
    }

    return NGX_CONF_OK;
}


/*
 * esi_cache_purge_response_type and ngx_cache_purge's
 * cache_purge_response_type: an enum slot, with ngx_cache_purge 3.0's
 * message for a value it does not know
 */

static char *
ngx_http_esi_purge_response_type(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_esi_purge_loc_conf_t *plcf = conf;

    ngx_str_t        *value;
    ngx_uint_t        i;
    ngx_conf_enum_t  *e;

    if (plcf->response_type != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (e = cmd->post, i = 0; e[i].name.len; i++) {
        if (e[i].name.len == value[1].len
            && ngx_strcasecmp(e[i].name.data, value[1].data) == 0)
        {
            plcf->response_type = e[i].value;
            return NGX_CONF_OK;
        }
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "invalid parameter \"%V\", expected \"html\", "
                       "\"json\", \"xml\" or \"text\"", &value[1]);

    return NGX_CONF_ERROR;
}


static char *
ngx_http_esi_purge_index_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_purge_main_conf_t *pmcf = conf;

    ngx_str_t  *value;

    if (pmcf->index != NGX_CONF_UNSET_SIZE) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        pmcf->index = 0;
        return NGX_CONF_OK;
    }

    pmcf->index = ngx_parse_size(&value[1]);

    if (pmcf->index == (size_t) NGX_ERROR) {
        return "invalid value";
    }

    return NGX_CONF_OK;
}


/* esi_purge_tag_headers NAME ...: the response headers that carry tags */

static char *
ngx_http_esi_purge_tag_headers(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_esi_purge_main_conf_t *pmcf = conf;

    ngx_str_t   *value, *h;
    ngx_uint_t   i, k;

    if (pmcf->tag_headers) {
        return "is duplicate";
    }

    if (cf->args->nelts - 1 > 32) {
        return "takes at most 32 names";
    }

    value = cf->args->elts;

    pmcf->tag_headers = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                         sizeof(ngx_str_t));
    if (pmcf->tag_headers == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {

        /* a header name: a token (RFC 9110) */

        for (k = 0; k < value[i].len; k++) {
            if (value[i].data[k] <= ' ' || value[i].data[k] >= 0x7f
                || ngx_strchr((u_char *) "()<>@,;:\\\"/[]?={}",
                              value[i].data[k]))
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "invalid header name \"%V\"", &value[i]);
                return NGX_CONF_ERROR;
            }
        }

        if (value[i].len > 64) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "header name \"%V\" is longer than 64 bytes",
                               &value[i]);
            return NGX_CONF_ERROR;
        }

        h = ngx_array_push(pmcf->tag_headers);
        if (h == NULL) {
            return NGX_CONF_ERROR;
        }

        *h = value[i];
    }

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_esi_purge_add_zone(ngx_conf_t *cf, ngx_shm_zone_t *zone)
{
    ngx_uint_t                       i;
    ngx_shm_zone_t                 **z;
    ngx_http_esi_main_conf_t        *emcf;
    ngx_http_esi_purge_main_conf_t  *pmcf;

    /* the worker connects to esid to announce it */

    emcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_module);
    emcf->used = 1;

    pmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_purge_module);

    z = pmcf->zones.elts;

    for (i = 0; i < pmcf->zones.nelts; i++) {
        if (z[i] == zone) {
            return NGX_OK;
        }
    }

    z = ngx_array_push(&pmcf->zones);
    if (z == NULL) {
        return NGX_ERROR;
    }

    *z = zone;

    return NGX_OK;
}


/*
 * The cache zone of the location being merged: proxy_cache's,
 * fastcgi_cache's, ...; and in "cache" the module whose it is.  A dynamic
 * module comes after them, so their configuration is already merged here.
 */

static ngx_shm_zone_t *
ngx_http_esi_purge_cache_zone(ngx_conf_t *cf, ngx_module_t **cache)
{
    ngx_uint_t                 i, k;
    ngx_http_conf_ctx_t       *ctx;
    ngx_http_upstream_conf_t  *ucf;

    ctx = cf->ctx;

    for (i = 0; cf->cycle->modules[i]; i++) {
        for (k = 0; ngx_http_esi_purge_cache_modules[k]; k++) {
            if (ngx_strcmp(cf->cycle->modules[i]->name,
                           ngx_http_esi_purge_cache_modules[k])
                != 0)
            {
                continue;
            }

            ucf = ctx->loc_conf[cf->cycle->modules[i]->ctx_index];

            if (ucf && ucf->cache_zone) {
                *cache = cf->cycle->modules[i];
                return ucf->cache_zone;
            }
        }
    }

    return NULL;
}


/*
 * The same-location form purges the key the cache module stores the
 * location's answers under: its *_cache_key, read where
 * ngx_http_esi_layout_cache_key() proves it is (merged already, so
 * inherited as the module inherits it); without one, proxy's default key
 * for proxy_cache_purge, else $uri$is_args$args.
 */

static ngx_http_complex_value_t *
ngx_http_esi_purge_location_key(ngx_conf_t *cf,
    ngx_http_esi_purge_loc_conf_t *plcf, ngx_module_t *cache)
{
    ngx_uint_t                       offset;
    ngx_http_conf_ctx_t             *ctx;
    ngx_http_complex_value_t        *key;
    ngx_http_esi_purge_main_conf_t  *pmcf;

    switch (ngx_http_esi_layout_cache_key(cf, cache, &offset)) {

    case NGX_ERROR:
        return NULL;

    case NGX_OK:
        ctx = cf->ctx;
        key = (ngx_http_complex_value_t *)
                  ((u_char *) ctx->loc_conf[cache->ctx_index] + offset);

        if (key->value.data) {
            return key;
        }

        break;
    }

    if (plcf->proxy) {
        return ngx_http_esi_purge_proxy_key(cf);
    }

    pmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_purge_module);

    return pmcf->default_key;
}


/*
 * proxy_cache_purge in the cached location purges the key the proxy module
 * stores a response under when the location sets no proxy_cache_key:
 * proxy_pass's scheme and host ("http://" and host[:port], the port only
 * when it is not the scheme's) followed by the request's URI.  $proxy_host
 * is set only once the proxy module handles a request, which a purge never
 * reaches, so the key is spelt here from proxy_pass's upstream.  A location
 * with a proxy_cache_key of its own, or a proxy_pass with a URI, sets
 * esi_cache_purge_key to its key (ngx_http_esi_purge_check_key() says so).
 */

static ngx_http_complex_value_t *
ngx_http_esi_purge_proxy_key(ngx_conf_t *cf)
{
    u_char                        *p;
    in_port_t                      port;
    ngx_str_t                      key;
    ngx_uint_t                     i;
    const char                    *scheme;
    ngx_module_t                  *proxy;
    ngx_http_conf_ctx_t           *ctx;
    ngx_http_upstream_conf_t      *ucf;
    ngx_http_upstream_srv_conf_t  *uscf;

    ctx = cf->ctx;
    proxy = NULL;
    ucf = NULL;
    uscf = NULL;

    for (i = 0; cf->cycle->modules[i]; i++) {
        if (ngx_strcmp(cf->cycle->modules[i]->name, "ngx_http_proxy_module")
            == 0)
        {
            proxy = cf->cycle->modules[i];
            ucf = ctx->loc_conf[proxy->ctx_index];
            uscf = ucf->upstream;
            break;
        }
    }

    if (uscf == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"proxy_cache_purge\" cannot know this "
                           "location's cache key (proxy_pass with variables):"
                           " set \"esi_cache_purge_key\" to its "
                           "proxy_cache_key");
        return NULL;
    }

    scheme = "http://";
    port = 80;

#if (NGX_HTTP_SSL)
    if (ngx_http_esi_purge_proxy_https(proxy, ucf)) {
        scheme = "https://";
        port = 443;
    }
#endif

    key.len = sizeof("https://") - 1 + uscf->host.len + sizeof(":65535") - 1
              + sizeof("$request_uri") - 1;

    key.data = ngx_pnalloc(cf->pool, key.len);
    if (key.data == NULL) {
        return NULL;
    }

    p = ngx_cpymem(key.data, scheme, ngx_strlen(scheme));
    p = ngx_cpymem(p, uscf->host.data, uscf->host.len);

    if (!uscf->no_port && uscf->port != port) {
        p = ngx_sprintf(p, ":%d", (int) uscf->port);
    }

    p = ngx_cpymem(p, "$request_uri", sizeof("$request_uri") - 1);
    key.len = p - key.data;

    return ngx_http_esi_purge_compile(cf, &key);
}


#if (NGX_HTTP_SSL)

/*
 * Whether the location's proxy_pass names https.  Since NGINX 1.23.0 every
 * location has an upstream.ssl (the proxy_ssl_* settings are inherited), so
 * only the proxy module's own "ssl" flag tells: the ngx_uint_t right before
 * its ssl_protocols, in every NGINX from 1.22 to 1.31, where the
 * "proxy_ssl_protocols" command says ssl_protocols is.  NGINX 1.30 publishes
 * the structure (ngx_http_proxy_module.h), where the order is checked at
 * compile time.
 */

#if (nginx_version >= 1030000)
#include <ngx_http_proxy_module.h>

typedef char  ngx_http_esi_purge_proxy_ssl_precedes_ssl_protocols[
    offsetof(ngx_http_proxy_loc_conf_t, ssl) + sizeof(ngx_uint_t)
    == offsetof(ngx_http_proxy_loc_conf_t, ssl_protocols) ? 1 : -1];
#endif


static ngx_uint_t
ngx_http_esi_purge_proxy_https(ngx_module_t *proxy, void *plcf)
{
    ngx_command_t  *cmd;

    for (cmd = proxy->commands; cmd->name.len; cmd++) {
        if (ngx_strcmp(cmd->name.data, "proxy_ssl_protocols") == 0
            && cmd->conf == NGX_HTTP_LOC_CONF_OFFSET
            && cmd->offset >= sizeof(ngx_uint_t))
        {
            return *(ngx_uint_t *) ((u_char *) plcf + cmd->offset
                                    - sizeof(ngx_uint_t));
        }
    }

    return 0;
}

#endif


/* the zones of esi_cache_purge zone=NAME, once every *_cache_path is read */

static ngx_int_t
ngx_http_esi_purge_named_zones(ngx_conf_t *cf,
    ngx_http_esi_purge_main_conf_t *pmcf)
{
    ngx_uint_t                       i, k, n;
    ngx_module_t                    *m;
    ngx_shm_zone_t                  *zone;
    ngx_list_part_t                 *part;
    ngx_http_esi_purge_loc_conf_t  **named;

    named = pmcf->named.elts;

    for (n = 0; n < pmcf->named.nelts; n++) {

        part = &cf->cycle->shared_memory.part;
        zone = part->elts;

        for (i = 0; /* void */; i++) {

            if (i >= part->nelts) {
                if (part->next == NULL) {
                    break;
                }

                part = part->next;
                zone = part->elts;
                i = 0;
            }

            if (zone[i].shm.name.len != named[n]->zone_name.len
                || ngx_strncmp(zone[i].shm.name.data,
                               named[n]->zone_name.data,
                               named[n]->zone_name.len)
                   != 0)
            {
                continue;
            }

            m = zone[i].tag;

            for (k = 0; ngx_http_esi_purge_cache_modules[k]; k++) {
                if (ngx_strcmp(m->name, ngx_http_esi_purge_cache_modules[k])
                    == 0)
                {
                    named[n]->zone = &zone[i];
                    break;
                }
            }

            if (named[n]->zone) {
                break;
            }
        }

        if (named[n]->zone == NULL) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "no proxy_cache_path, fastcgi_cache_path, "
                          "uwsgi_cache_path or scgi_cache_path declares the "
                          "keys_zone \"%V\" of %V",
                          &named[n]->zone_name, &named[n]->zone_where);
            return NGX_ERROR;
        }

        if (ngx_http_esi_purge_add_zone(cf, named[n]->zone) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_esi_purge_module_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt             *h;
    ngx_http_core_main_conf_t       *cmcf;
    ngx_http_esi_purge_main_conf_t  *pmcf;

    pmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_purge_module);

    if (ngx_http_esi_purge_named_zones(cf, pmcf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (ngx_http_esi_purge_shared_zones(cf, pmcf) != NGX_OK) {
        return NGX_ERROR;
    }

    /* in the configuration's temporary pool: gone with it */

    ngx_memzero(&pmcf->uses, sizeof(ngx_array_t));

    /*
     * the same-location purge: before the access phase, so that "satisfy
     * any" cannot let a client outside "from" purge
     */

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PREACCESS_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_esi_purge_access;

    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_esi_purge_header_filter;

    return NGX_OK;
}


/*
 * Where the location being merged caches or purges, for
 * ngx_http_esi_purge_shared_zones(): each purging location, and a caching
 * one once for its server and zone.  A server's own level is no location.
 */

static ngx_int_t
ngx_http_esi_purge_use(ngx_conf_t *cf, ngx_http_esi_purge_loc_conf_t *plcf)
{
    ngx_uint_t                       i;
    ngx_module_t                    *cache;
    ngx_shm_zone_t                  *zone;
    ngx_http_conf_ctx_t             *ctx;
    ngx_http_core_srv_conf_t        *cscf;
    ngx_http_esi_purge_use_t        *use;
    ngx_http_esi_purge_main_conf_t  *pmcf;

    ctx = cf->ctx;
    cscf = ctx->srv_conf[ngx_http_core_module.ctx_index];

    if (ctx->loc_conf == cscf->ctx->loc_conf) {
        return NGX_OK;
    }

    pmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_purge_module);

    if (plcf->purge == NGX_HTTP_ESI_PURGE_OFF) {
        plcf = NULL;
        zone = ngx_http_esi_purge_cache_zone(cf, &cache);

        if (zone == NULL) {
            return NGX_OK;
        }

        use = pmcf->uses.elts;

        for (i = 0; i < pmcf->uses.nelts; i++) {
            if (use[i].zone == zone && use[i].server == cscf) {
                return NGX_OK;
            }
        }

    } else {
        zone = plcf->zone;      /* zone=NAME: found at the end */
    }

    use = ngx_array_push(&pmcf->uses);
    if (use == NULL) {
        return NGX_ERROR;
    }

    use->zone = zone;
    use->purge = plcf;
    use->server = cscf;
    use->location = ctx->loc_conf[ngx_http_core_module.ctx_index];

    return NGX_OK;
}


/*
 * A zone that servers of different names share, purged in a location
 * whose key names no host: a purge in one server removes what the others
 * cache under the same key, through that location's "from".  One [warn] a
 * zone, naming it, the servers and the key.
 */

static ngx_int_t
ngx_http_esi_purge_shared_zones(ngx_conf_t *cf,
    ngx_http_esi_purge_main_conf_t *pmcf)
{
    u_char                    *p;
    size_t                     len;
    ngx_str_t                 *name, *names, list;
    ngx_uint_t                 i, k, j, n, nnames;
    ngx_shm_zone_t            *zone;
    ngx_http_esi_purge_use_t  *use, *hostless;

    use = pmcf->uses.elts;
    n = pmcf->uses.nelts;

    if (n < 2) {
        return NGX_OK;
    }

    names = ngx_palloc(cf->temp_pool, n * sizeof(ngx_str_t));
    if (names == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < n; i++) {
        if (use[i].zone == NULL) {
            use[i].zone = use[i].purge->zone;
        }
    }

    for (i = 0; i < n; i++) {
        zone = use[i].zone;

        for (k = 0; k < i && use[k].zone != zone; k++) { /* void */ }

        if (k < i) {
            continue;               /* the zone is done */
        }

        hostless = NULL;
        nnames = 0;
        len = 0;

        for (k = i; k < n; k++) {
            if (use[k].zone != zone) {
                continue;
            }

            if (hostless == NULL && use[k].purge
                && !ngx_http_esi_purge_key_has_host(
                                                &use[k].purge->key->value))
            {
                hostless = &use[k];
            }

            name = &use[k].server->server_name;

            for (j = 0; j < nnames; j++) {
                if (names[j].len == name->len
                    && ngx_strncmp(names[j].data, name->data, name->len)
                       == 0)
                {
                    break;
                }
            }

            if (j == nnames) {
                names[nnames++] = *name;
                len += sizeof("\"\", ") - 1 + name->len;
            }
        }

        if (hostless == NULL || nnames < 2) {
            continue;
        }

        list.data = ngx_pnalloc(cf->temp_pool, len);
        if (list.data == NULL) {
            return NGX_ERROR;
        }

        p = list.data;

        for (j = 0; j < nnames; j++) {
            p = ngx_sprintf(p, "%s\"%V\"", j ? ", " : "", &names[j]);
        }

        list.len = p - list.data;

        ngx_log_error(NGX_LOG_WARN, cf->log, 0,
                      "servers %V share the cache zone \"%V\", and the "
                      "purge key \"%V\" of location \"%V\" in server "
                      "\"%V\" names no $host: a purge in one server "
                      "removes what the others cache under the same key; "
                      "put $host in the cache key and in "
                      "esi_cache_purge_key, or give each server a "
                      "keys_zone of its own",
                      &list, &zone->shm.name, &hostless->purge->key->value,
                      &hostless->location->name,
                      &hostless->server->server_name);
    }

    return NGX_OK;
}


/* whether a key names $host, $http_host or $server_name */

static ngx_uint_t
ngx_http_esi_purge_key_has_host(ngx_str_t *key)
{
    u_char      *p, *last, *start;
    size_t       len;
    ngx_uint_t   i;

    static ngx_str_t  hosts[] = {
        ngx_string("host"),
        ngx_string("http_host"),
        ngx_string("server_name")
    };

    p = key->data;
    last = p + key->len;

    while (p < last) {
        if (*p++ != '$') {
            continue;
        }

        if (p < last && *p == '{') {
            p++;
        }

        start = p;

        while (p < last
               && ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')
                   || (*p >= '0' && *p <= '9') || *p == '_'))
        {
            p++;
        }

        len = p - start;

        for (i = 0; i < sizeof(hosts) / sizeof(ngx_str_t); i++) {
            if (len == hosts[i].len
                && ngx_strncasecmp(start, hosts[i].data, len) == 0)
            {
                return 1;
            }
        }
    }

    return 0;
}
