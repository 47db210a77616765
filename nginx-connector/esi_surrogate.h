/*
 * Surrogate-Control (W3C Note "Edge Architecture Specification 1.0"),
 * without NGINX: what one header value says to the surrogate named name,
 * on plain pointers and lengths, nothing allocated.
 */

#ifndef ESI_SURROGATE_H
#define ESI_SURROGATE_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif


/* what Surrogate-Control says to us: untargeted or ";NAME" directives */

typedef struct {
    time_t      max_age;            /* -1: none */
    time_t      max_age_targeted;
    unsigned    esi:1;              /* content="ESI/1.0" */
    unsigned    no_store:1;
} esi_surrogate_t;


/* nothing said yet */
void esi_surrogate_init(esi_surrogate_t *sc);

/*
 * Adds what one value says: comma-separated directives, each with an
 * optional ";target"; those without a target or for name (not empty) are
 * taken.  Anything else, malformed or unknown, is skipped.  A max-age is a
 * number of seconds that fits a time_t.
 */
void esi_surrogate_parse(esi_surrogate_t *sc, const unsigned char *value,
    size_t len, const unsigned char *name, size_t name_len);


#ifdef __cplusplus
}
#endif

#endif /* ESI_SURROGATE_H */
