/*
 * Linked into the sanitized nginx only (nginx-connector/CMakeLists.txt).
 *
 * GCC's UBSan runtime reads UBSAN_OPTIONS lazily, at its first report, and
 * from /proc/self/environ, which nginx has overwritten with its process
 * title by then (ngx_init_setproctitle(), ngx_setproctitle()).  The options
 * would be lost: no log_path, no suppressions, no stack traces; and as the
 * runtime then sets the report path of ASan's too, ASan's later reports
 * would go to stderr as well.  This keeps UBSAN_OPTIONS from before main()
 * and hands them to the runtime through its hook.
 */

#include <stdlib.h>
#include <string.h>


const char *__ubsan_default_options(void);


static char  esi_ubsan_options[4096];


__attribute__((constructor)) static void
esi_ubsan_options_save(void)
{
    const char  *options;

    options = getenv("UBSAN_OPTIONS");

    if (options != NULL) {
        strncpy(esi_ubsan_options, options, sizeof(esi_ubsan_options) - 1);
    }
}


const char *
__ubsan_default_options(void)
{
    return esi_ubsan_options;
}
