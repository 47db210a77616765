/*
 * Tag lists and Magento's tag patterns, without NGINX: what the purge
 * module reads of a purge request's tag headers and of an upstream's, on
 * plain pointers and lengths.  Nothing is allocated: tags point into the
 * caller's bytes, and a joined list goes into the caller's buffer.
 */

#ifndef ESI_TAGS_H
#define ESI_TAGS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif


/* Surrogate-Key, xkey, Cache-Tags...: tags separated by any of these */
#define esi_tags_separator(c)  ((c) == ' ' || (c) == '\t' || (c) == ',')


/*
 * The next tag of a list from *pos up to end: 1 with *tag and *len set
 * (never empty, no separator in it) and *pos past it, 0 when no tag is
 * left.
 */
int esi_tags_next(unsigned char **pos, unsigned char *end,
    unsigned char **tag, size_t *len);

/*
 * X-Magento-Tags-Pattern as Magento 2 sends it, "((^|,)TAG(,|$))" per tag
 * joined with "|", a tag at a time: *pos starts at start; 1 with the next
 * tag (never empty, nothing a regular expression reads as more than
 * itself), 0 at the end, -1 when the pattern is not of that shape (an
 * empty one neither).
 */
int esi_tags_magento_next(unsigned char *start, unsigned char *end,
    unsigned char **pos, unsigned char **tag, size_t *len);

/*
 * Appends the tags of one header value to the list of len bytes in dst,
 * space separated and followed by a space: the new length, at most
 * len + n + 1.
 */
size_t esi_tags_join(unsigned char *dst, size_t len,
    const unsigned char *value, size_t n);

/*
 * The length of the whole tags of a joined list (no trailing space) that
 * fit in max bytes: len when it fits, else the space that ends the last
 * tag to fit, 0 when not even the first does.
 */
size_t esi_tags_fit(const unsigned char *tags, size_t len, size_t max);


#ifdef __cplusplus
}
#endif

#endif /* ESI_TAGS_H */
