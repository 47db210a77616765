/*
 * What esid reads of an NGINX cache file's header: the members of
 * ngx_http_file_cache_header_t (src/http/ngx_http_cache.h, private to
 * NGINX's cache) as NGX_HTTP_CACHE_VERSION 5 lays them out on a 64-bit
 * Linux, then the "\nKEY: <key>\n" line NGINX writes after it.  The one
 * definition of those offsets: esid's reader (daemon/variants/cache_file.cc)
 * uses them, and the module, compiled against the NGINX that writes the
 * files, checks at startup that its ngx_http_file_cache_header_t is this
 * one (nginx-connector/ngx_http_esi_layout.c), so that a moved member fails
 * "nginx -t" instead of esid misreading every file.
 */

#ifndef ESI_CACHE_FILE_H
#define ESI_CACHE_FILE_H


#define ESI_CACHE_FILE_VERSION           5    /* NGX_HTTP_CACHE_VERSION */

/* member            offset (bytes)                size (bytes) */
#define ESI_CACHE_FILE_VERSION_AT        0
#define ESI_CACHE_FILE_VERSION_SIZE                    8
#define ESI_CACHE_FILE_HEADER_START_AT   54
#define ESI_CACHE_FILE_HEADER_START_SIZE               2
#define ESI_CACHE_FILE_BODY_START_AT     56
#define ESI_CACHE_FILE_BODY_START_SIZE                 2
#define ESI_CACHE_FILE_VARY_LEN_AT       187
#define ESI_CACHE_FILE_VARY_LEN_SIZE                   1
#define ESI_CACHE_FILE_VARY_AT           188
#define ESI_CACHE_FILE_VARY_SIZE                       128
#define ESI_CACHE_FILE_VARIANT_AT        316
#define ESI_CACHE_FILE_VARIANT_SIZE                    16

/* sizeof(ngx_http_file_cache_header_t): where the KEY line starts */
#define ESI_CACHE_FILE_HEADER_SIZE       336

#define ESI_CACHE_FILE_KEY_PREFIX        "\nKEY: "


#endif /* ESI_CACHE_FILE_H */
