/* fuzz_groupconfig.c - libFuzzer target for the group config parser (common/config.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    char *t = malloc(size + 1);
    if (!t) return 0;
    memcpy(t, data, size);
    t[size] = 0;
    strata_config_t c;
    strata_errbuf_t eb = {{0}};
    int rc = config_parse(&c, t, "fuzz.ini", &eb);
    if (rc == 0) {
        /* a config that parsed is consistent: strings terminated, counts in range */
        if (c.n_prefetchers < 0 || c.n_prefetchers > CONFIG_MAX_PREFETCHERS) abort();
        if (strnlen(c.run_dir, sizeof c.run_dir) == sizeof c.run_dir) abort();
        if (strnlen(c.executor.endpoint, sizeof c.executor.endpoint) == sizeof c.executor.endpoint) abort();
        if (c.launcher.restart_backoff_max_ms < c.launcher.restart_backoff_ms) abort();
        if (c.http.port < 1 || c.http.port > 65535 || !c.http.host[0] || c.http.max_connections < 1) abort();
        if (strnlen(c.http.api_key, sizeof c.http.api_key) == sizeof c.http.api_key) abort();
        if (c.http.api_key[0] && c.http.api_key_file[0]) abort();
    } else if (!eb.msg[0]) {
        abort(); /* every error carries a message */
    }
    free(t);
    return 0;
}
