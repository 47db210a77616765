
/*
 * Copyright (C) The ESI project authors
 *
 * The module: its directives, configuration and $esi_status.
 */


#include "ngx_http_esi.h"


static ngx_int_t ngx_http_esi_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);
static ngx_int_t ngx_http_esi_preconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_esi_init_process(ngx_cycle_t *cycle);
static ngx_int_t ngx_http_esi_add_variables(ngx_conf_t *cf);
static void *ngx_http_esi_create_main_conf(ngx_conf_t *cf);
static char *ngx_http_esi_init_main_conf(ngx_conf_t *cf, void *conf);
static void *ngx_http_esi_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_esi_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_esi_daemon_user(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_esi_plan_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_esi_tag_size_bounds(ngx_conf_t *cf, void *post,
    void *data);
static char *ngx_http_esi_plan_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_esi_cookies_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_uint_t ngx_http_esi_stitch_available(ngx_conf_t *cf);
static ngx_int_t ngx_http_esi_stitch_check(ngx_conf_t *cf,
    ngx_http_esi_loc_conf_t *elcf);


static ngx_conf_enum_t  ngx_http_esi_fallback_modes[] = {
    { ngx_string("passthrough"), NGX_HTTP_ESI_PASSTHROUGH },
    { ngx_string("abort"), NGX_HTTP_ESI_ABORT },
    { ngx_null_string, 0 }
};


static ngx_conf_num_bounds_t  ngx_http_esi_stitch_level_bounds = {
    ngx_conf_check_num_bounds, 1, 9
};


/* where a location without esi_plan keeps its plans; esid sizes it */
static ngx_http_esi_plan_zone_t  ngx_http_esi_default_plan =
    { ngx_string("default"), 0 };


static ngx_conf_post_t  ngx_http_esi_tag_size_post =
    { ngx_http_esi_tag_size_bounds };


static ngx_command_t  ngx_http_esi_filter_commands[] = {

    { ngx_string("esi"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_HTTP_LIF_CONF
                        |NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, enable),
      NULL },

    { ngx_string("esi_types"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_types_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, types_keys),
      &ngx_http_html_default_types[0] },

    { ngx_string("esi_silent_errors"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, silent_errors),
      NULL },

    { ngx_string("esi_buffer_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, buffer_size),
      NULL },

    { ngx_string("esi_max_depth"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_depth),
      NULL },

    { ngx_string("esi_max_includes"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_includes),
      NULL },

    { ngx_string("esi_max_request_includes"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_request_includes),
      NULL },

    { ngx_string("esi_max_page_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_off_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_page_size),
      NULL },

    { ngx_string("esi_max_tag_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_size_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_tag_size),
      &ngx_http_esi_tag_size_post },

    { ngx_string("esi_max_fragment_size"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_off_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, max_fragment_size),
      NULL },

    { ngx_string("esi_fallback"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, fallback),
      &ngx_http_esi_fallback_modes },

    { ngx_string("esi_daemon"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_main_conf_t, daemon),
      NULL },

    { ngx_string("esi_daemon_user"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_esi_daemon_user,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_daemon_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_MAIN_CONF_OFFSET,
      offsetof(ngx_http_esi_main_conf_t, timeout),
      NULL },

    { ngx_string("esi_plan_zone"),
      NGX_HTTP_MAIN_CONF|NGX_CONF_TAKE1,
      ngx_http_esi_plan_zone,
      NGX_HTTP_MAIN_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_plan"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_http_esi_plan_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_plan_reuse"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, plan_reuse),
      NULL },

    { ngx_string("esi_stitch"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, stitch),
      NULL },

    { ngx_string("esi_stitch_level"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, stitch_level),
      &ngx_http_esi_stitch_level_bounds },

    { ngx_string("esi_cookies"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_1MORE,
      ngx_http_esi_cookies_conf,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("esi_surrogate"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, surrogate),
      NULL },

    { ngx_string("esi_surrogate_control"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, surrogate_control),
      NULL },

    { ngx_string("esi_include_access"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_FLAG,
      ngx_conf_set_flag_slot,
      NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_http_esi_loc_conf_t, include_access),
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_esi_module_ctx = {
    ngx_http_esi_preconfiguration,         /* preconfiguration */
    ngx_http_esi_filter_init,              /* postconfiguration */

    ngx_http_esi_create_main_conf,         /* create main configuration */
    ngx_http_esi_init_main_conf,           /* init main configuration */

    NULL,                                  /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_esi_create_loc_conf,          /* create location configuration */
    ngx_http_esi_merge_loc_conf            /* merge location configuration */
};


ngx_module_t  ngx_http_esi_module = {
    NGX_MODULE_V1,
    &ngx_http_esi_module_ctx,              /* module context */
    ngx_http_esi_filter_commands,          /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_esi_init_process,             /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_esi_daemon_exit_process,      /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/*
 * The worker's connection to esid, and the files that take its answers:
 * ngx_http_esi_daemon.c hands each answer to the handler its kind has
 * registered, and knows nothing of streams, plans or purges itself.
 */

static ngx_int_t
ngx_http_esi_init_process(ngx_cycle_t *cycle)
{
    ngx_http_esi_daemon_t  *d;

    if (ngx_http_esi_daemon_init_process(cycle) != NGX_OK) {
        return NGX_ERROR;
    }

    d = &ngx_http_esi_daemon;

    if (d->conf == NULL) {
        return NGX_OK;
    }

    if (ngx_http_esi_stream_register(d, cycle, ngx_http_esi_filter_process)
        != NGX_OK
        || ngx_http_esi_splice_register(d, cycle) != NGX_OK
        || ngx_http_esi_plan_register(d, cycle) != NGX_OK
        || ngx_http_esi_replay_register(d, cycle) != NGX_OK
        || ngx_http_esi_purge_register(d, cycle) != NGX_OK
        || ngx_http_esi_purge_index_register(d, cycle) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_http_esi_daemon_connect(d);

    return NGX_OK;
}


/* the per-worker connection to esid */


static ngx_str_t  ngx_http_esi_status_names[] = {
    ngx_null_string,
    ngx_string("processed"),
    ngx_string("passthrough"),
    ngx_string("aborted")
};


static ngx_http_variable_t  ngx_http_esi_vars[] = {

    { ngx_string("esi_status"), NULL, ngx_http_esi_status_variable, 0,
      NGX_HTTP_VAR_NOCACHEABLE, 0 },

      ngx_http_null_variable
};


static ngx_int_t
ngx_http_esi_status_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data)
{
    ngx_http_esi_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_esi_module);

    if (ctx == NULL || ctx->status == NGX_HTTP_ESI_STATUS_NONE) {
        v->not_found = 1;
        return NGX_OK;
    }

    v->len = ngx_http_esi_status_names[ctx->status].len;
    v->data = ngx_http_esi_status_names[ctx->status].data;
    v->valid = 1;
    v->no_cacheable = 0;
    v->not_found = 0;

    return NGX_OK;
}


/*
 * Before anything is configured: the private structures of other modules
 * the connector reads are laid out as it expects (ngx_http_esi_layout.c).
 */

static ngx_int_t
ngx_http_esi_preconfiguration(ngx_conf_t *cf)
{
    if (ngx_http_esi_layout_check(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_esi_add_variables(cf);
}


static ngx_int_t
ngx_http_esi_add_variables(ngx_conf_t *cf)
{
    ngx_http_variable_t  *var, *v;

    for (v = ngx_http_esi_vars; v->name.len; v++) {
        var = ngx_http_add_variable(cf, &v->name, v->flags);
        if (var == NULL) {
            return NGX_ERROR;
        }

        var->get_handler = v->get_handler;
        var->data = v->data;
    }

    return NGX_OK;
}


static void *
ngx_http_esi_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_esi_main_conf_t  *emcf;

    emcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_esi_main_conf_t));
    if (emcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     emcf->daemon = { 0, NULL };
     *     emcf->url = { 0 };
     */

    emcf->daemon_user = (ngx_uid_t) NGX_CONF_UNSET_UINT;
    emcf->timeout = NGX_CONF_UNSET_MSEC;
    emcf->used = 0;

    if (ngx_array_init(&emcf->plan_zones, cf->pool, 2,
                       sizeof(ngx_http_esi_plan_zone_t *))
        != NGX_OK)
    {
        return NULL;
    }

    return emcf;
}


static char *
ngx_http_esi_init_main_conf(ngx_conf_t *cf, void *conf)
{
    ngx_http_esi_main_conf_t *emcf = conf;

    ngx_conf_init_msec_value(emcf->timeout, 2000);

    if (emcf->daemon.data == NULL) {
        ngx_str_set(&emcf->daemon, "unix:/run/esid/esid.sock");
    }

    emcf->url.url = emcf->daemon;
    emcf->url.no_resolve = 1;

    if (ngx_parse_url(cf->pool, &emcf->url) != NGX_OK
        || emcf->url.naddrs == 0
        || emcf->url.addrs[0].sockaddr->sa_family != AF_UNIX)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"esi_daemon\" must be \"unix:PATH\", not \"%V\"",
                           &emcf->daemon);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/*
 * esi_daemon_user NAME: the user esid may run as besides root and the
 * owner of its socket's directory (ngx_http_esi_daemon_peer_trusted()),
 * looked up now so that "nginx -t" names an unknown one
 */

static char *
ngx_http_esi_daemon_user(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_main_conf_t *emcf = conf;

    int             rc;
    char            lookup[4096];
    ngx_str_t      *value;
    struct passwd   pw, *pwp;

    if (emcf->daemon_user != (ngx_uid_t) NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    rc = getpwnam_r((const char *) value[1].data, &pw, lookup,
                    sizeof(lookup), &pwp);

    if (pwp == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, rc,
                           "\"esi_daemon_user\": no user \"%V\"",
                           &value[1]);
        return NGX_CONF_ERROR;
    }

    emcf->daemon_user = pw.pw_uid;

    return NGX_CONF_OK;
}


static void *
ngx_http_esi_create_loc_conf(ngx_conf_t *cf)
{
    ngx_http_esi_loc_conf_t  *elcf;

    elcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_esi_loc_conf_t));
    if (elcf == NULL) {
        return NULL;
    }

    /*
     * set by ngx_pcalloc():
     *
     *     elcf->types = { NULL };
     *     elcf->types_keys = NULL;
     *     elcf->surrogate = { 0, NULL };
     *     elcf->capability = { 0, NULL };
     */

    elcf->enable = NGX_CONF_UNSET;
    elcf->silent_errors = NGX_CONF_UNSET;
    elcf->fallback = NGX_CONF_UNSET_UINT;
    elcf->buffer_size = NGX_CONF_UNSET_SIZE;
    elcf->max_depth = NGX_CONF_UNSET;
    elcf->max_includes = NGX_CONF_UNSET_UINT;
    elcf->max_request_includes = NGX_CONF_UNSET_UINT;
    elcf->max_page_size = NGX_CONF_UNSET;
    elcf->max_tag_size = NGX_CONF_UNSET_SIZE;
    elcf->max_fragment_size = NGX_CONF_UNSET;
    elcf->plan = NGX_CONF_UNSET_PTR;
    elcf->plan_reuse = NGX_CONF_UNSET_MSEC;
    elcf->stitch = NGX_CONF_UNSET;
    elcf->stitch_level = NGX_CONF_UNSET_UINT;
    elcf->cookies = NGX_CONF_UNSET_PTR;
    elcf->surrogate_control = NGX_CONF_UNSET;
    elcf->include_access = NGX_CONF_UNSET;

    return elcf;
}


static char *
ngx_http_esi_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_esi_loc_conf_t *prev = parent;
    ngx_http_esi_loc_conf_t *conf = child;

    ngx_http_esi_main_conf_t  *emcf;

    ngx_conf_merge_value(conf->enable, prev->enable, 0);
    ngx_conf_merge_value(conf->silent_errors, prev->silent_errors, 0);
    ngx_conf_merge_uint_value(conf->fallback, prev->fallback,
                              NGX_HTTP_ESI_PASSTHROUGH);
    ngx_conf_merge_size_value(conf->buffer_size, prev->buffer_size,
                              16 * 1024);
    ngx_conf_merge_value(conf->max_depth, prev->max_depth, 5);
    ngx_conf_merge_uint_value(conf->max_includes, prev->max_includes, 256);
    ngx_conf_merge_uint_value(conf->max_request_includes,
                              prev->max_request_includes, 256);
    ngx_conf_merge_off_value(conf->max_page_size, prev->max_page_size,
                             64 * 1024 * 1024);
    ngx_conf_merge_size_value(conf->max_tag_size, prev->max_tag_size,
                              8 * 1024);
    ngx_conf_merge_off_value(conf->max_fragment_size,
                             prev->max_fragment_size, 16 * 1024 * 1024);
    ngx_conf_merge_ptr_value(conf->plan, prev->plan,
                             &ngx_http_esi_default_plan);
    ngx_conf_merge_msec_value(conf->plan_reuse, prev->plan_reuse, 1000);
    ngx_conf_merge_value(conf->stitch, prev->stitch,
                         NGX_HTTP_ESI_STITCH_GZIP);
    ngx_conf_merge_uint_value(conf->stitch_level, prev->stitch_level, 6);
    ngx_conf_merge_ptr_value(conf->cookies, prev->cookies, NULL);
    ngx_conf_merge_str_value(conf->surrogate, prev->surrogate, "");
    ngx_conf_merge_value(conf->surrogate_control, prev->surrogate_control, 0);
    ngx_conf_merge_value(conf->include_access, prev->include_access, 0);

    if (conf->surrogate.len) {
        conf->capability.len = conf->surrogate.len
                               + sizeof("=\"ESI/1.0\"") - 1;
        conf->capability.data = ngx_pnalloc(cf->pool, conf->capability.len);
        if (conf->capability.data == NULL) {
            return NGX_CONF_ERROR;
        }

        ngx_sprintf(conf->capability.data, "%V=\"ESI/1.0\"",
                    &conf->surrogate);
    }

    if (conf->buffer_size < 8) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"esi_buffer_size\" is too small");
        return NGX_CONF_ERROR;
    }

    if (conf->stitch == 1 && ngx_http_esi_stitch_check(cf, conf) != NGX_OK) {
        return NGX_CONF_ERROR;
    }

    if (conf->stitch == NGX_HTTP_ESI_STITCH_GZIP
        && !ngx_http_esi_stitch_available(cf))
    {
        conf->stitch = 0;
    }

    if (ngx_http_merge_types(cf, &conf->types_keys, &conf->types,
                             &prev->types_keys, &prev->types,
                             ngx_http_html_default_types)
        != NGX_OK)
    {
        return NGX_CONF_ERROR;
    }

    emcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_module);

    if (conf->enable) {
        emcf->used = 1;
    }

    return NGX_CONF_OK;
}


/* a zone esid indexes: announced on every connection, its files reported */

/* esi_plan_zone name:size */

static char *
ngx_http_esi_plan_zone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_main_conf_t *emcf = conf;

    u_char                    *colon;
    ssize_t                    size;
    ngx_str_t                 *value, name, s;
    ngx_uint_t                 i;
    ngx_http_esi_plan_zone_t  *zone, **zones;

    value = cf->args->elts;

    colon = ngx_strlchr(value[1].data, value[1].data + value[1].len, ':');

    if (colon == NULL || colon == value[1].data) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid plan zone \"%V\", expected name:size",
                           &value[1]);
        return NGX_CONF_ERROR;
    }

    name.data = value[1].data;
    name.len = colon - value[1].data;

    if (name.len == ngx_http_esi_default_plan.name.len
        && ngx_strncmp(name.data, ngx_http_esi_default_plan.name.data,
                       name.len)
           == 0)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "plan zone \"default\" is esid's own: its "
                           "size is esid's plan_store setting");
        return NGX_CONF_ERROR;
    }

    s.data = colon + 1;
    s.len = value[1].data + value[1].len - s.data;

    size = ngx_parse_size(&s);

    if (size == NGX_ERROR || size < (ssize_t) (64 * 1024)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid plan zone size \"%V\", at least 64k",
                           &s);
        return NGX_CONF_ERROR;
    }

    zones = emcf->plan_zones.elts;

    for (i = 0; i < emcf->plan_zones.nelts; i++) {
        if (zones[i]->name.len == name.len
            && ngx_strncmp(zones[i]->name.data, name.data, name.len) == 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "duplicate plan zone \"%V\"", &name);
            return NGX_CONF_ERROR;
        }
    }

    zone = ngx_palloc(cf->pool, sizeof(ngx_http_esi_plan_zone_t));
    if (zone == NULL) {
        return NGX_CONF_ERROR;
    }

    zones = ngx_array_push(&emcf->plan_zones);
    if (zones == NULL) {
        return NGX_CONF_ERROR;
    }

    *zones = zone;
    zone->name = name;
    zone->size = size;

    return NGX_CONF_OK;
}


/* esi_plan zone | off; the zone must have been declared above */

static char *
ngx_http_esi_tag_size_bounds(ngx_conf_t *cf, void *post, void *data)
{
    size_t  *sp = data;

    if (*sp < NGX_HTTP_ESI_TAG_SIZE_MIN || *sp > NGX_HTTP_ESI_TAG_SIZE_MAX) {
        return "must be between 256 and 1m";
    }

    return NGX_CONF_OK;
}


static char *
ngx_http_esi_plan_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_loc_conf_t *elcf = conf;

    ngx_str_t                 *value;
    ngx_uint_t                 i;
    ngx_http_esi_plan_zone_t **zones;
    ngx_http_esi_main_conf_t  *emcf;

    if (elcf->plan != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (value[1].len == 3 && ngx_strncmp(value[1].data, "off", 3) == 0) {
        elcf->plan = NULL;
        return NGX_CONF_OK;
    }

    if (value[1].len == ngx_http_esi_default_plan.name.len
        && ngx_strncmp(value[1].data, ngx_http_esi_default_plan.name.data,
                       value[1].len)
           == 0)
    {
        elcf->plan = &ngx_http_esi_default_plan;
        return NGX_CONF_OK;
    }

    emcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_esi_module);
    zones = emcf->plan_zones.elts;

    for (i = 0; i < emcf->plan_zones.nelts; i++) {
        if (zones[i]->name.len == value[1].len
            && ngx_strncmp(zones[i]->name.data, value[1].data, value[1].len)
               == 0)
        {
            elcf->plan = zones[i];
            return NGX_CONF_OK;
        }
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "unknown plan zone \"%V\": declare it with "
                       "\"esi_plan_zone %V:size\" above", &value[1],
                       &value[1]);

    return NGX_CONF_ERROR;
}


/* esi_cookies name ...: a "*" among them stands alone, for all */

static char *
ngx_http_esi_cookies_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_esi_loc_conf_t *elcf = conf;

    ngx_str_t   *value, *name;
    ngx_uint_t   i;

    if (elcf->cookies != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    elcf->cookies = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                     sizeof(ngx_str_t));
    if (elcf->cookies == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {
        if (value[i].len == 1 && value[i].data[0] == '*') {
            elcf->cookies->nelts = 0;
            name = ngx_array_push(elcf->cookies);
            *name = value[i];
            return NGX_CONF_OK;
        }

        name = ngx_array_push(elcf->cookies);
        if (name == NULL) {
            return NGX_CONF_ERROR;
        }

        *name = value[i];
    }

    return NGX_CONF_OK;
}


/* what esi_stitch on requires of the build, without its errors */

static ngx_uint_t
ngx_http_esi_stitch_available(ngx_conf_t *cf)
{
#if (NGX_ZLIB && NGX_HTTP_GZIP)
    return ngx_http_esi_stitch_placed(cf->cycle);
#else
    return 0;
#endif
}


/* esi_stitch keeps its segments with the plans, and weaves below postpone */

static ngx_int_t
ngx_http_esi_stitch_check(ngx_conf_t *cf, ngx_http_esi_loc_conf_t *elcf)
{
#if (NGX_ZLIB && NGX_HTTP_GZIP)

    if (elcf->plan == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"esi_stitch\" requires \"esi_plan\": its "
                           "segments are kept with the plans");
        return NGX_ERROR;
    }

    if (!ngx_http_esi_stitch_placed(cf->cycle)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"esi_stitch\" requires its second filter below "
                           "postpone, and this nginx places it elsewhere");
        return NGX_ERROR;
    }

    return NGX_OK;

#else

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "\"esi_stitch\" requires an nginx built with zlib "
                       "and the gzip or gunzip module");
    return NGX_ERROR;

#endif
}
