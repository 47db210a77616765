/*
 * Tag lists and Magento's tag patterns in C, for the connector.  See
 * esi_tags.h.
 */

#include <string.h>

#include "esi_tags.h"


/* strchr() finds the terminating NUL too: a NUL is no tag byte either */
#define esi_tags_regex_special(c)                                            \
    (strchr("().*+?[]{}|\\^$", (c)) != NULL)


int
esi_tags_next(unsigned char **pos, unsigned char *end,
    unsigned char **tag, size_t *len)
{
    unsigned char  *s, *e;

    s = *pos;

    while (s < end && esi_tags_separator(*s)) {
        s++;
    }

    for (e = s; e < end && !esi_tags_separator(*e); e++) {
        /* void */
    }

    *pos = e;

    if (e == s) {
        return 0;
    }

    *tag = s;
    *len = e - s;

    return 1;
}


int
esi_tags_magento_next(unsigned char *start, unsigned char *end,
    unsigned char **pos, unsigned char **tag, size_t *len)
{
    unsigned char  *s, *e;

    static const char  open[] = "((^|,)", close[] = "(,|$))";

    s = *pos;

    if (s != start) {
        if (s == end) {
            return 0;
        }

        if (*s++ != '|') {
            return -1;
        }
    }

    if ((size_t) (end - s) < sizeof(open) - 1
        || memcmp(s, open, sizeof(open) - 1) != 0)
    {
        return -1;
    }

    s += sizeof(open) - 1;

    for (e = s; e < end && !esi_tags_regex_special(*e); e++) {
        /* void */
    }

    if (e == s
        || (size_t) (end - e) < sizeof(close) - 1
        || memcmp(e, close, sizeof(close) - 1) != 0)
    {
        return -1;
    }

    *tag = s;
    *len = e - s;
    *pos = e + sizeof(close) - 1;

    return 1;
}


size_t
esi_tags_join(unsigned char *dst, size_t len, const unsigned char *value,
    size_t n)
{
    const unsigned char  *p, *end;

    end = value + n;

    for (p = value; p < end; p++) {
        if (esi_tags_separator(*p)) {
            if (len && dst[len - 1] != ' ') {
                dst[len++] = ' ';
            }

        } else {
            dst[len++] = *p;
        }
    }

    if (len && dst[len - 1] != ' ') {
        dst[len++] = ' ';
    }

    return len;
}


size_t
esi_tags_fit(const unsigned char *tags, size_t len, size_t max)
{
    if (len <= max) {
        return len;
    }

    for (len = max; len && tags[len] != ' '; len--) {
        /* void */
    }

    return len;
}
