
/*
 * Copyright (C) The ESI project authors
 *
 * What the ESI filter and the stitch filter below postpone share: the
 * ESI filter emits a plan's gzip segments as buffers of this type, and
 * the stitch filter forwards them untouched into the response it deflates.
 */


#ifndef _NGX_HTTP_ESI_STITCH_H_INCLUDED_
#define _NGX_HTTP_ESI_STITCH_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>


typedef struct {
    ngx_buf_t                  buf;         /* first: the filter casts back */
    uint32_t                   crc;         /* CRC-32 of the run it replaces */
    off_t                      size;        /* ... and the run's length */
} ngx_http_esi_segment_t;


#define ngx_http_esi_is_segment(b)                                            \
    ((b)->tag == (ngx_buf_tag_t) &ngx_http_esi_stitch_filter_module)


extern ngx_module_t  ngx_http_esi_stitch_filter_module;


/*
 * Answers a main request's response with gzip made here when the client
 * takes it (ngx_http_gzip_ok(), as the gzip filter asks): NGX_OK, and
 * Content-Encoding is set; NGX_DECLINED when the response stays plain.
 */
ngx_int_t ngx_http_esi_stitch_start(ngx_http_request_t *r, ngx_uint_t level);

/* whether the stitch filter sits below postpone, where it must */
ngx_uint_t ngx_http_esi_stitch_placed(ngx_cycle_t *cycle);

/* whether "gzip" is on where r is: esi_stitch's default follows it */
ngx_uint_t ngx_http_esi_stitch_gzip_on(ngx_http_request_t *r);


#endif /* _NGX_HTTP_ESI_STITCH_H_INCLUDED_ */
