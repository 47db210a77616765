/*
 * Surrogate-Control in C, for the connector.  See esi_surrogate.h.
 */

#include <stdint.h>
#include <string.h>

#include "esi_surrogate.h"


#define ESI_SURROGATE_MAX_TIME                                               \
    ((time_t) (((uintmax_t) 1 << (sizeof(time_t) * 8 - 1)) - 1))

#define esi_surrogate_blank(c)  ((c) == ' ' || (c) == '\t')


static int esi_surrogate_is(const unsigned char *s, size_t len,
    const char *word);
static int esi_surrogate_caseeq(const unsigned char *a,
    const unsigned char *b, size_t n);
static time_t esi_surrogate_seconds(const unsigned char *p, size_t n);


void
esi_surrogate_init(esi_surrogate_t *sc)
{
    sc->max_age = -1;
    sc->max_age_targeted = -1;
    sc->esi = 0;
    sc->no_store = 0;
}


void
esi_surrogate_parse(esi_surrogate_t *sc, const unsigned char *value,
    size_t len, const unsigned char *name, size_t name_len)
{
    time_t                n;
    unsigned              quoted, targeted;
    const unsigned char  *p, *end, *start, *last, *target, *v, *q;

    p = value;
    end = value + len;

    while (p < end) {

        /* one directive: up to a comma outside quotes */

        start = p;
        target = NULL;
        quoted = 0;

        for ( /* void */ ; p < end; p++) {
            if (*p == '"') {
                quoted = !quoted;

            } else if (!quoted && *p == ',') {
                break;

            } else if (!quoted && *p == ';' && target == NULL) {
                target = p;
            }
        }

        /* [start, last) the directive, [target, q) its target */

        last = target ? target : p;
        q = p;

        if (p < end) {
            p++;        /* past the comma */
        }

        while (start < last && esi_surrogate_blank(*start)) {
            start++;
        }

        while (last > start && esi_surrogate_blank(last[-1])) {
            last--;
        }

        targeted = 0;

        if (target) {
            target++;

            while (target < q && esi_surrogate_blank(*target)) {
                target++;
            }

            while (q > target && esi_surrogate_blank(q[-1])) {
                q--;
            }

            if ((size_t) (q - target) != name_len || name_len == 0
                || !esi_surrogate_caseeq(target, name, name_len))
            {
                continue;
            }

            targeted = 1;
        }

        if (esi_surrogate_is(start, last - start, "no-store")) {
            sc->no_store = 1;
            continue;
        }

        v = memchr(start, '=', last - start);
        if (v == NULL) {
            continue;
        }

        if (esi_surrogate_is(start, v - start, "max-age")) {

            /* max-age=N[+M]: M is for stale content, N is ours */

            v++;
            q = memchr(v, '+', last - v);
            n = esi_surrogate_seconds(v, (q ? q : last) - v);

            if (n == -1) {
                continue;
            }

            if (targeted) {
                sc->max_age_targeted = n;

            } else {
                sc->max_age = n;
            }

            continue;
        }

        if (!esi_surrogate_is(start, v - start, "content")) {
            continue;
        }

        /* content="ESI/1.0 ESI-INLINE/1.0": a space-separated list */

        v++;

        if (v < last && *v == '"') {
            v++;
        }

        if (last > v && last[-1] == '"') {
            last--;
        }

        while (v < last) {
            while (v < last && *v == ' ') {
                v++;
            }

            for (q = v; q < last && *q != ' '; q++) {
                /* void */
            }

            if (esi_surrogate_is(v, q - v, "ESI/1.0")) {
                sc->esi = 1;
            }

            v = q;
        }
    }
}


/* whether [s, s + len) is word, in any case */

static int
esi_surrogate_is(const unsigned char *s, size_t len, const char *word)
{
    return len == strlen(word)
           && esi_surrogate_caseeq(s, (const unsigned char *) word, len);
}


/* ASCII only, as ngx_strncasecmp() compares */

static int
esi_surrogate_caseeq(const unsigned char *a, const unsigned char *b,
    size_t n)
{
    unsigned char  c1, c2;

    while (n--) {
        c1 = *a++;
        c2 = *b++;

        c1 = (c1 >= 'A' && c1 <= 'Z') ? (c1 | 0x20) : c1;
        c2 = (c2 >= 'A' && c2 <= 'Z') ? (c2 | 0x20) : c2;

        if (c1 != c2) {
            return 0;
        }
    }

    return 1;
}


/* decimal digits only, as ngx_atotm() takes them: -1 if not, or too many */

static time_t
esi_surrogate_seconds(const unsigned char *p, size_t n)
{
    time_t  value, cutoff, cutlim;

    if (n == 0) {
        return -1;
    }

    cutoff = ESI_SURROGATE_MAX_TIME / 10;
    cutlim = ESI_SURROGATE_MAX_TIME % 10;

    for (value = 0; n--; p++) {
        if (*p < '0' || *p > '9') {
            return -1;
        }

        if (value >= cutoff && (value > cutoff || *p - '0' > cutlim)) {
            return -1;
        }

        value = value * 10 + (*p - '0');
    }

    return value;
}
