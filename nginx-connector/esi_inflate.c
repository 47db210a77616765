/*
 * A gzipped body's inflate in C, for the connector.  See esi_inflate.h.
 * zlib decodes one member with windowBits 16 + MAX_WBITS (gzip wrapper,
 * zlib 1.2.0.4+); the members that follow it are each decoded after an
 * inflateReset(), as gzip(1) and NGINX's gunzip filter read them.
 */

#include <limits.h>

#include "esi_inflate.h"


/* zlib counts in uInt: a larger buffer is taken in parts */
#define esi_inflate_avail(start, end)                                        \
    ((size_t) ((end) - (start)) > UINT_MAX                                  \
     ? UINT_MAX : (uInt) ((end) - (start)))


int
esi_inflate_init(esi_inflate_t *z, alloc_func alloc, free_func free,
    void *opaque)
{
    z->zstream.next_in = Z_NULL;
    z->zstream.avail_in = 0;
    z->zstream.zalloc = alloc;
    z->zstream.zfree = free;
    z->zstream.opaque = opaque;
    z->zstream.msg = Z_NULL;
    z->total = 0;
    z->member_end = 0;

    z->rc = inflateInit2(&z->zstream, MAX_WBITS + 16);

    return z->rc;
}


int
esi_inflate(esi_inflate_t *z, unsigned char **in, unsigned char *in_end,
    unsigned char **out, unsigned char *out_end)
{
    for ( ;; ) {

        if (z->member_end && *in != in_end) {

            /* a gzip member ended and another one follows */

            z->rc = inflateReset(&z->zstream);
            if (z->rc != Z_OK) {
                return ESI_INFLATE_CORRUPT;
            }

            z->member_end = 0;
        }

        z->zstream.next_in = *in;
        z->zstream.avail_in = esi_inflate_avail(*in, in_end);
        z->zstream.next_out = *out;
        z->zstream.avail_out = esi_inflate_avail(*out, out_end);

        z->rc = inflate(&z->zstream, Z_NO_FLUSH);

        z->total += z->zstream.next_out - *out;
        *in = z->zstream.next_in;
        *out = z->zstream.next_out;

        if (z->rc == Z_STREAM_END) {
            z->member_end = 1;

        } else if (z->rc != Z_OK && z->rc != Z_BUF_ERROR) {
            return ESI_INFLATE_CORRUPT;
        }

        if (*out == out_end) {

            /* zlib may have more for the next output space */

            return ESI_INFLATE_FULL;
        }

        if (*in == in_end) {
            return ESI_INFLATE_AGAIN;
        }

        if (!z->member_end && z->zstream.avail_in && z->zstream.avail_out) {

            /* neither input nor output space left to explain the stop */

            return ESI_INFLATE_CORRUPT;
        }
    }
}


int
esi_inflate_complete(const esi_inflate_t *z)
{
    return z->member_end;
}


const char *
esi_inflate_message(const esi_inflate_t *z)
{
    return z->zstream.msg ? z->zstream.msg : "";
}


void
esi_inflate_end(esi_inflate_t *z)
{
    (void) inflateEnd(&z->zstream);
}
