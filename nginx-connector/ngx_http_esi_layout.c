
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
 * "nginx -t" fails, rather than a wrong read at run time.
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


static ngx_int_t ngx_http_esi_layout_directive(ngx_conf_t *cf,
    ngx_http_esi_layout_directive_t *d);
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

    for (cmd = m->commands; cmd && cmd->name.len; cmd++) {
        if (cmd->name.len == ngx_strlen(d->directive)
            && ngx_strncmp(cmd->name.data, d->directive, cmd->name.len) == 0)
        {
            break;
        }
    }

    if (cmd == NULL || cmd->name.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "ngx_http_esi_module: " NGINX_VER "'s %s has no "
                           "\"%s\" directive, which proves where it keeps "
                           "%s: this module cannot read it here (nginx "
                           "patched, or not the one the module was built "
                           "for)", d->module, d->directive, d->reads);
        return NGX_ERROR;
    }

    if (cmd->set != d->set || cmd->conf != NGX_HTTP_LOC_CONF_OFFSET) {
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
