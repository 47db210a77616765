
/*
 * Copyright (C) The ESI project authors
 *
 * What the connector reads of structures NGINX keeps private, checked
 * before the configuration is read (docs/architecture.md, "What the module
 * reads of NGINX's private structures").  Another module's location configuration
 * is proved from what that module publishes, its directive table: the
 * offset at which a directive stores its value is where the member the
 * connector reads, or a neighbour of it, is.  The cache file header esid
 * reads is compared with ngx_http_cache.h, which the module is compiled
 * with, through include/esi/cache_file.h, esid's own definition.  A layout
 * that moved is an [emerg] naming this nginx's version and what moved, and
 * "nginx -t" fails, rather than a wrong read at run time.  The upstream
 * modules' *_cache_key, which only a same-location purge reads, is proved
 * by the directives beside it when such a purge is configured.
 */


#include "ngx_http_esi.h"

#include <esi/cache_file.h>


typedef char *(*ngx_http_esi_layout_set_pt)(ngx_conf_t *cf,
    ngx_command_t *cmd, void *conf);


/* a directive of another module that stores at an offset the connector uses */

typedef struct {
    char                        *module;
    char                        *directive;
    ngx_http_esi_layout_set_pt   set;
    ngx_uint_t                   offset;
    char                        *reads;     /* what is read at that offset */
} ngx_http_esi_layout_directive_t;


/* a member of ngx_http_file_cache_header_t that esid reads */

typedef struct {
    char                        *member;
    size_t                       offset;
    size_t                       size;
    size_t                       esi_offset;
    size_t                       esi_size;
} ngx_http_esi_layout_member_t;


/*
 * Where a module keeps its *_cache_key (an ngx_http_complex_value_t) in
 * its location configuration, proved by the directives that store right
 * below it and, where one does, right above: the members in between are
 * the same in every NGINX from 1.22 to 1.31.
 */

typedef struct {
    char                        *module;
    char                        *below;
    ngx_http_esi_layout_set_pt   below_set;
    size_t                       below_gap;  /* its offset to cache_key's */
    char                        *above;
    ngx_http_esi_layout_set_pt   above_set;
    size_t                       above_gap;  /* cache_key's offset to its */
} ngx_http_esi_layout_key_t;


static ngx_int_t ngx_http_esi_layout_directive(ngx_conf_t *cf,
    ngx_http_esi_layout_directive_t *d);
static ngx_command_t *ngx_http_esi_layout_command(ngx_module_t *m,
    char *name);
static ngx_uint_t ngx_http_esi_layout_stores(ngx_command_t *cmd,
    ngx_http_esi_layout_set_pt set);
static ngx_int_t ngx_http_esi_layout_cache_header(ngx_conf_t *cf);


#define ngx_http_esi_layout_upstream(module, prefix)                        \
    { module, prefix "_connect_timeout", ngx_conf_set_msec_slot,            \
      offsetof(ngx_http_upstream_conf_t, connect_timeout),                  \
      "its ngx_http_upstream_conf_t (upstream)" },                          \
    { module, prefix "_cache_valid", ngx_http_file_cache_valid_set_slot,    \
      offsetof(ngx_http_upstream_conf_t, cache_valid),                      \
      "its ngx_http_upstream_conf_t (cache_zone)" }


static ngx_http_esi_layout_directive_t  ngx_http_esi_layout_directives[] = {

#if (NGX_ZLIB && NGX_HTTP_GZIP)
    /* ngx_http_esi_stitch_gzip_on(): whether the gzip filter is on */
    { "ngx_http_gzip_filter_module", "gzip", ngx_conf_set_flag_slot, 0,
      "the \"gzip\" flag" },
#endif

    /*
     * ngx_http_esi_purge_cache_zone() and _proxy_key(): the location
     * configuration of each of them starts with its ngx_http_upstream_conf_t
     */
    ngx_http_esi_layout_upstream("ngx_http_proxy_module", "proxy"),
    ngx_http_esi_layout_upstream("ngx_http_fastcgi_module", "fastcgi"),
    ngx_http_esi_layout_upstream("ngx_http_uwsgi_module", "uwsgi"),
    ngx_http_esi_layout_upstream("ngx_http_scgi_module", "scgi"),

    { NULL, NULL, NULL, 0, NULL }
};


static ngx_http_esi_layout_key_t  ngx_http_esi_layout_keys[] = {

    /*
     * method, location, url, cache_key, vars (5 strings), redirect,
     * http_version
     */
    { "ngx_http_proxy_module",
      "proxy_method", ngx_http_set_complex_value_slot,
      sizeof(ngx_http_complex_value_t *) + 2 * sizeof(ngx_str_t),
      "proxy_http_version", ngx_conf_set_enum_slot,
      sizeof(ngx_http_complex_value_t) + 5 * sizeof(ngx_str_t)
      + sizeof(ngx_flag_t) },

    /* keep_conn, cache_key */
    { "ngx_http_fastcgi_module",
      "fastcgi_keep_conn", ngx_conf_set_flag_slot, sizeof(ngx_flag_t),
      NULL, NULL, 0 },

    /*
     * params_source, uwsgi_lengths, uwsgi_values, cache_key, uwsgi_string,
     * modifier1
     */
    { "ngx_http_uwsgi_module",
      "uwsgi_param", ngx_http_upstream_param_set_slot,
      3 * sizeof(ngx_array_t *),
      "uwsgi_modifier1", ngx_conf_set_num_slot,
      sizeof(ngx_http_complex_value_t) + sizeof(ngx_str_t) },

    /* params_source, scgi_lengths, scgi_values, cache_key (the last) */
    { "ngx_http_scgi_module",
      "scgi_param", ngx_http_upstream_param_set_slot,
      3 * sizeof(ngx_array_t *),
      NULL, NULL, 0 },

    { NULL, NULL, NULL, 0, NULL, NULL, 0 }
};


/* where NGINX publishes proxy's structure (1.30), the compiler checks it */

#if (nginx_version >= 1030000 && NGX_HTTP_CACHE)
#include <ngx_http_proxy_module.h>

typedef char  ngx_http_esi_layout_proxy_key_follows_method[
    offsetof(ngx_http_proxy_loc_conf_t, method)
    + sizeof(ngx_http_complex_value_t *) + 2 * sizeof(ngx_str_t)
    == offsetof(ngx_http_proxy_loc_conf_t, cache_key) ? 1 : -1];
#endif


#define ngx_http_esi_layout_member(member, at, size)                        \
    { #member, offsetof(ngx_http_file_cache_header_t, member),              \
      sizeof(((ngx_http_file_cache_header_t *) 0)->member), at, size }

static ngx_http_esi_layout_member_t  ngx_http_esi_layout_members[] = {
    ngx_http_esi_layout_member(version, ESI_CACHE_FILE_VERSION_AT,
                               ESI_CACHE_FILE_VERSION_SIZE),
    ngx_http_esi_layout_member(header_start, ESI_CACHE_FILE_HEADER_START_AT,
                               ESI_CACHE_FILE_HEADER_START_SIZE),
    ngx_http_esi_layout_member(body_start, ESI_CACHE_FILE_BODY_START_AT,
                               ESI_CACHE_FILE_BODY_START_SIZE),
    ngx_http_esi_layout_member(vary_len, ESI_CACHE_FILE_VARY_LEN_AT,
                               ESI_CACHE_FILE_VARY_LEN_SIZE),
    ngx_http_esi_layout_member(vary, ESI_CACHE_FILE_VARY_AT,
                               ESI_CACHE_FILE_VARY_SIZE),
    ngx_http_esi_layout_member(variant, ESI_CACHE_FILE_VARIANT_AT,
                               ESI_CACHE_FILE_VARIANT_SIZE),
    { NULL, 0, 0, 0, 0 }
};


/*
 * Every check whose module this nginx has, each mismatch logged, so that
 * one "nginx -t" names all of them.
 */

ngx_int_t
ngx_http_esi_layout_check(ngx_conf_t *cf)
{
    ngx_int_t                         rc;
    ngx_http_esi_layout_directive_t  *d;

    rc = NGX_OK;

    for (d = ngx_http_esi_layout_directives; d->module; d++) {
        if (ngx_http_esi_layout_directive(cf, d) != NGX_OK) {
            rc = NGX_ERROR;
        }
    }

    if (ngx_http_esi_layout_cache_header(cf) != NGX_OK) {
        rc = NGX_ERROR;
    }

    return rc;
}


static ngx_int_t
ngx_http_esi_layout_directive(ngx_conf_t *cf,
    ngx_http_esi_layout_directive_t *d)
{
    ngx_uint_t      i;
    ngx_module_t   *m;
    ngx_command_t  *cmd;

    m = NULL;

    for (i = 0; cf->cycle->modules[i]; i++) {
        if (ngx_strcmp(cf->cycle->modules[i]->name, d->module) == 0) {
            m = cf->cycle->modules[i];
            break;
        }
    }

    if (m == NULL) {
        return NGX_OK;      /* not built: nothing of it is read */
    }

    cmd = ngx_http_esi_layout_command(m, d->directive);

    if (cmd == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ngx_http_esi_module: " NGINX_VER "'s %s has no "
                           "\"%s\" directive, which proves where it keeps "
                           "%s: this module cannot read it here (nginx "
                           "patched, or not the one the module was built "
                           "for)", d->module, d->directive, d->reads);
        return NGX_ERROR;
    }

    if (!ngx_http_esi_layout_stores(cmd, d->set)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ngx_http_esi_module: " NGINX_VER "'s %s sets "
                           "\"%s\" otherwise than in its location "
                           "configuration as NGINX does, so where it keeps "
                           "%s is unknown: this module cannot read it here "
                           "(nginx patched, or not the one the module was "
                           "built for)", d->module, d->directive, d->reads);
        return NGX_ERROR;
    }

    if (cmd->offset != d->offset) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ngx_http_esi_module: " NGINX_VER "'s %s keeps "
                           "\"%s\" at offset %ui of its location "
                           "configuration, not %ui: this module reads %s "
                           "as NGINX lays it out and cannot read it here "
                           "(nginx patched, or not the one the module was "
                           "built for)", d->module, d->directive,
                           cmd->offset, d->offset, d->reads);
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * esid reads the headers of the cache files of the zones it indexes at the
 * offsets of include/esi/cache_file.h; this nginx writes them as its
 * ngx_http_cache.h says.
 */

static ngx_int_t
ngx_http_esi_layout_cache_header(ngx_conf_t *cf)
{
    ngx_int_t                      rc;
    ngx_http_esi_layout_member_t  *m;

    rc = NGX_OK;

    if (NGX_HTTP_CACHE_VERSION != ESI_CACHE_FILE_VERSION) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ngx_http_esi_module: " NGINX_VER " writes cache "
                           "files of version %d, esid reads version %d: "
                           "esid cannot index this nginx's caches",
                           (int) NGX_HTTP_CACHE_VERSION,
                           (int) ESI_CACHE_FILE_VERSION);
        rc = NGX_ERROR;
    }

    for (m = ngx_http_esi_layout_members; m->member; m++) {
        if (m->offset == m->esi_offset && m->size == m->esi_size) {
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ngx_http_esi_module: " NGINX_VER "'s cache file "
                           "header (ngx_http_file_cache_header_t) keeps "
                           "\"%s\" at offset %uz (size %uz), not at %uz "
                           "(size %uz), where esid reads it: esid cannot "
                           "index this nginx's caches", m->member, m->offset,
                           m->size, m->esi_offset, m->esi_size);
        rc = NGX_ERROR;
    }

    if (sizeof(ngx_http_file_cache_header_t) != ESI_CACHE_FILE_HEADER_SIZE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ngx_http_esi_module: " NGINX_VER "'s cache file "
                           "header (ngx_http_file_cache_header_t) is %uz "
                           "bytes, not %uz, where esid reads the KEY line: "
                           "esid cannot index this nginx's caches",
                           sizeof(ngx_http_file_cache_header_t),
                           (size_t) ESI_CACHE_FILE_HEADER_SIZE);
        rc = NGX_ERROR;
    }

    return rc;
}


/*
 * The offset of module m's *_cache_key in its location configuration, for
 * the same-location purge form; an [emerg] naming the fix when this NGINX
 * does not lay it out as every NGINX from 1.22 to 1.31 does.
 */

ngx_int_t
ngx_http_esi_layout_cache_key(ngx_conf_t *cf, ngx_module_t *m,
    ngx_uint_t *offset)
{
    ngx_command_t              *below, *above;
    ngx_http_esi_layout_key_t  *k;

    for (k = ngx_http_esi_layout_keys; k->module; k++) {
        if (ngx_strcmp(m->name, k->module) == 0) {
            break;
        }
    }

    if (k->module == NULL) {
        return NGX_DECLINED;
    }

    below = ngx_http_esi_layout_command(m, k->below);
    above = k->above ? ngx_http_esi_layout_command(m, k->above) : NULL;

    if (!ngx_http_esi_layout_stores(below, k->below_set)
        || (k->above
            && (!ngx_http_esi_layout_stores(above, k->above_set)
                || above->offset != below->offset + k->below_gap
                                    + k->above_gap)))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ngx_http_esi_module: " NGINX_VER "'s %s does not "
                           "keep its cache key where \"%s\"%s%s%s prove it "
                           "in NGINX 1.22 to 1.31, so the same-location purge "
                           "cannot read it here: set \"esi_cache_purge_key\" "
                           "to this location's cache key", m->name, k->below,
                           k->above ? " and \"" : "", k->above ? k->above : "",
                           k->above ? "\"" : "");
        return NGX_ERROR;
    }

    *offset = below->offset + k->below_gap;

    return NGX_OK;
}


/* module m's directive "name", or NULL */

static ngx_command_t *
ngx_http_esi_layout_command(ngx_module_t *m, char *name)
{
    ngx_command_t  *cmd;

    for (cmd = m->commands; cmd && cmd->name.len; cmd++) {
        if (cmd->name.len == ngx_strlen(name)
            && ngx_strncmp(cmd->name.data, name, cmd->name.len) == 0)
        {
            return cmd;
        }
    }

    return NULL;
}


/* whether cmd stores in the location's configuration as NGINX's does */

static ngx_uint_t
ngx_http_esi_layout_stores(ngx_command_t *cmd, ngx_http_esi_layout_set_pt set)
{
    return cmd && cmd->set == set && cmd->conf == NGX_HTTP_LOC_CONF_OFFSET;
}
