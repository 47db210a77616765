/*
 * Inflates a gzipped body for the connector, without NGINX: the caller owns
 * the input and output buffers and supplies zlib's allocator; this unit
 * decides what the bytes mean at the edges of a gzip member: another member
 * that follows (RFC 1952 allows any number), a body that stops inside one,
 * bytes that are not gzip.  A call writes at most the output space it is
 * given, however far a few input bytes would inflate.
 */

#ifndef ESI_INFLATE_H
#define ESI_INFLATE_H

#include <stdint.h>

#include <zlib.h>

#ifdef __cplusplus
extern "C" {
#endif


#define ESI_INFLATE_AGAIN    0      /* all input taken: more, or the end */
#define ESI_INFLATE_FULL     1      /* the output space is full: more of it */
#define ESI_INFLATE_CORRUPT  2      /* not gzip, or broken: give up */


typedef struct {
    z_stream        zstream;
    uint64_t        total;          /* bytes inflated, every member */
    int             rc;             /* zlib's last answer, for the log */
    unsigned        member_end:1;   /* the input so far ends a member */
} esi_inflate_t;


/* Z_OK, or zlib's error; alloc and free get opaque, as zlib's do. */
int esi_inflate_init(esi_inflate_t *z, alloc_func alloc, free_func free,
    void *opaque);

/*
 * Inflates from *in up to in_end into *out up to out_end, and advances both
 * past what it read and wrote.  ESI_INFLATE_AGAIN leaves *in at in_end,
 * ESI_INFLATE_FULL leaves *out at out_end (input may remain).
 */
int esi_inflate(esi_inflate_t *z, unsigned char **in, unsigned char *in_end,
    unsigned char **out, unsigned char *out_end);

/* 1 when the input so far is whole gzip members, at least one. */
int esi_inflate_complete(const esi_inflate_t *z);

/* zlib's words for the last error, or "". */
const char *esi_inflate_message(const esi_inflate_t *z);

void esi_inflate_end(esi_inflate_t *z);


#ifdef __cplusplus
}
#endif

#endif /* ESI_INFLATE_H */
