/* demo.c - the demo model (shipped trained in models/demo) and its default config; see demo.h. */
#include "services/strata/demo.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "model/packed.h"

static bool s_is_model_dir(const char *d)
{
    static const char *const need[] = {"config.json", "model.safetensors", "tokenizer.json", NULL};
    char p[PATH_MAX + 32];
    for (const char *const *n = need; *n; n++) {
        snprintf(p, sizeof p, "%s/%s", d, *n);
        if (access(p, R_OK) != 0) return false;
    }
    return true;
}

int demo_model_find(char *out, size_t cap, strata_errbuf_t *eb)
{
    char exe[PATH_MAX], rel[PATH_MAX + 64];
    const char *cand[4];
    int n = 0;
    const char *env = getenv("STRATA_DEMO_MODEL");
    if (env && *env) {
        if (!s_is_model_dir(env))
            return strata_seterr(eb, STRATA_EINVAL_INPUT,
                                 "STRATA_DEMO_MODEL=%s: not a model folder (config.json, model.safetensors, tokenizer.json)", env);
        cand[n++] = env;
    }
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l > 0) {
        exe[l] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(rel, sizeof rel, "%s/../share/strata/demo-model", exe);
        cand[n++] = rel;
    }
    cand[n++] = STRATA_DEMO_SRC_DIR;
    cand[n++] = STRATA_DEMO_DATA_DIR;
    for (int i = 0; i < n; i++) {
        if (!s_is_model_dir(cand[i])) continue;
        if (!realpath(cand[i], exe)) continue;
        if ((size_t)snprintf(out, cap, "%s", exe) >= cap) return strata_seterr(eb, STRATA_EINVAL_INPUT, "path too long");
        return 0;
    }
    return strata_seterr(eb, STRATA_EINVAL_INPUT,
                         "the demo model is not installed: looked in %s/../share/strata/demo-model, %s and %s "
                         "(set STRATA_DEMO_MODEL to its folder)",
                         l > 0 ? exe : "(the binary's folder)", STRATA_DEMO_SRC_DIR, STRATA_DEMO_DATA_DIR);
}

static int s_rmrf(const char *path)
{
    char cmd[PATH_MAX + 32];
    if (strchr(path, '\'')) return STRATA_EINVAL_INPUT;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    return system(cmd) == 0 ? 0 : STRATA_EIO;
}

int demo_model_write(const char *dir, strata_errbuf_t *eb)
{
    int rc = 0;
    char src[PATH_MAX], hf[PATH_MAX], packed[PATH_MAX], tmp[PATH_MAX], a[PATH_MAX + 64], b[PATH_MAX + 64];
    model_t m;
    memset(&m, 0, sizeof m);
    bool loaded = false;
    snprintf(hf, sizeof hf, "%s/hf", dir);
    snprintf(packed, sizeof packed, "%s/model", dir);
    if (packed_is_packed(packed)) return 0;
    if ((rc = demo_model_find(src, sizeof src, eb)) < 0) return rc;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return strata_seterr(eb, -errno, "mkdir %s: %s", dir, strerror(errno));

    /* the HF folder, copied under a temporary name and renamed when complete */
    snprintf(tmp, sizeof tmp, "%s/.hf-%d", dir, (int)getpid());
    s_rmrf(tmp);
    if (mkdir(tmp, 0755) < 0) return strata_seterr(eb, -errno, "mkdir %s: %s", tmp, strerror(errno));
    if ((rc = packed_copy_side_files(src, tmp, NULL, eb)) < 0) goto fail;
    snprintf(a, sizeof a, "%s/model.safetensors", src);
    snprintf(b, sizeof b, "%s/model.safetensors", tmp);
    if ((rc = packed_copy_file(a, b, true, NULL, eb)) < 0) goto fail;
    s_rmrf(hf);
    if (rename(tmp, hf) < 0) {
        rc = strata_seterr(eb, -errno, "rename %s -> %s: %s", tmp, hf, strerror(errno));
        goto fail;
    }

    /* pack it (bf16 of bf16 weights: lossless, so hf/ and model/ give the same outputs) */
    if ((rc = model_load(&m, hf, eb)) < 0) goto fail;
    loaded = true;
    snprintf(tmp, sizeof tmp, "%s/.model-%d", dir, (int)getpid());
    s_rmrf(tmp);
    if (mkdir(tmp, 0755) < 0) {
        rc = strata_seterr(eb, -errno, "mkdir %s: %s", tmp, strerror(errno));
        goto fail;
    }
    packed_write_opts_t o;
    packed_write_opts_default(&o, WF_BF16);
    o.threads = 1;
    packed_write_stats_t st;
    if ((rc = packed_write(&m, hf, tmp, &o, &st, eb)) < 0) goto fail;
    s_rmrf(packed);
    if (rename(tmp, packed) < 0) {
        rc = strata_seterr(eb, -errno, "rename %s -> %s: %s", tmp, packed, strerror(errno));
        goto fail;
    }
    log_info("demo model from %s: %s (HF) and %s (packed, %.1f MiB)", src, hf, packed, st.file_bytes / 1048576.0);
fail:
    if (loaded) model_free(&m);
    if (rc < 0) s_rmrf(tmp);
    return rc;
}

int demo_config_write(const char *path, const char *name, const char *run_dir, const char *model_dir, int port,
                      strata_errbuf_t *eb)
{
    char tmp[PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return strata_seterr(eb, -errno, "%s: %s", tmp, strerror(errno));
    fprintf(f,
            "; strata demo group, written by `strata up --demo` (the model: models/demo/SOURCE.md).\n"
            "; No cpu pinning, so it runs on any machine; see deploy/*.ini for pinned examples.\n"
            "[group]\n"
            "name = %s\n"
            "run_dir = %s\n"
            "model = %s\n"
            "\n"
            "[router]\n"
            "endpoint = tcp://127.0.0.1:%d\n"
            "cpus =\n"
            "\n"
            "[scheduler]\n"
            "max_batch_tokens = 256\n"
            "max_seqs = 64\n"
            "kv_blocks = 1024\n"
            "block_size = 16\n"
            "\n"
            "[executor]\n"
            "backend = cpu\n"
            "threads = 0\n"
            "\n"
            "[prefetcher.0]\n"
            "numa_node = -1\n"
            "\n"
            "[launcher]\n"
            "restart_backoff_ms = 200\n"
            "restart_backoff_max_ms = 5000\n"
            "ready_timeout_s = 60\n",
            name, run_dir, model_dir, port);
    if (fclose(f) != 0) return strata_seterr(eb, STRATA_EIO, "%s: write failed", tmp);
    if (rename(tmp, path) < 0) return strata_seterr(eb, -errno, "rename %s: %s", path, strerror(errno));
    return 0;
}
