/* tokenizer_bench - encode speed of English prose on one core, against the 20 MB/s target.
 *
 *   tokenizer_bench [--tokenizer PATH ...] [--text FILE] [--seconds S] [--json FILE]
 *
 * Encodes FILE (default tests/tokenizer/prose.txt) with each tokenizer (default: every
 * fixture under tests/tokenizer/fixtures) in three ways: one call per line, one call per
 * paragraph (blank-line separated) and one call for the whole text. Every timed pass starts
 * from a freshly loaded tokenizer, so its piece cache is cold (no pass profits from having
 * seen the text before; repeated words within the text do hit): that is encode_MB/s, the
 * figure held against the target. warm_MB/s is the steady state of a long-running router:
 * the same tokenizer again, its cache warm. Each way runs for at
 * least S seconds of CPU time (default 1) after one warm-up pass, on the calling thread only.
 * MB/s is bytes over this thread's CPU time: one core's speed, which stays meaningful when
 * other processes load the machine; wall-clock MB/s is printed next to it. Prints a table
 * (MB/s, bytes, calls, tokens) and, with --json, writes the same with the machine, the figure
 * "encode_MB_s", the bound 20 MB/s and the ratio. Also times the decode of the ids.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/tokenizer.h"

#define TARGET_MB_S 20.0

static char *s_read(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    rewind(f);
    char *b = malloc((size_t)l + 1);
    if (b && fread(b, 1, (size_t)l, f) != (size_t)l) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[l] = 0;
        *n = (size_t)l;
    }
    return b;
}

static void s_cpu_name(char *out, size_t cap)
{
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += 2;
                c[strcspn(c, "\n")] = 0;
                snprintf(out, cap, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

typedef struct {
    const char **p;   /* [n] chunk starts */
    size_t *len;      /* [n] chunk lengths, bytes */
    size_t n;
} s_chunks_t;

/* mode 0: lines, 1: paragraphs, 2: whole text */
static s_chunks_t s_split(const char *text, size_t n, int mode)
{
    s_chunks_t c = {malloc((n + 1) * sizeof(char *)), malloc((n + 1) * sizeof(size_t)), 0};
    if (mode == 2) {
        c.p[0] = text;
        c.len[0] = n;
        c.n = 1;
        return c;
    }
    size_t s = 0;
    for (size_t i = 0; i <= n; i++) {
        bool end = i == n || (text[i] == '\n' && (mode == 0 || (i + 1 < n && text[i + 1] == '\n')));
        if (!end) continue;
        if (i > s) {
            c.p[c.n] = text + s;
            c.len[c.n++] = i - s;
        }
        s = i + 1;
    }
    return c;
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time of this thread: the speed of one core, even when other processes share the
 * machine (wall-clock MB/s is printed too). */
static double s_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *text_path = "tests/tokenizer/prose.txt", *json_path = NULL;
    const char *toks[32];
    int ntok = 0;
    double seconds = 1.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: tokenizer_bench [--tokenizer PATH ...] [--text FILE] [--seconds S] [--json FILE]\n"
                   "\n"
                   "Encode speed of English prose on one core, per line, per paragraph and whole, against\n"
                   "the %.0f MB/s target. Run from the source root for the defaults:\n"
                   "  --tokenizer PATH  a tokenizer.json or model folder (repeatable; default: every fixture\n"
                   "                    in tests/tokenizer/fixtures)\n"
                   "  --text FILE       the text (default tests/tokenizer/prose.txt)\n"
                   "  --seconds S       minimum time per measurement (default 1)\n"
                   "  --json FILE       also write the results as JSON\n",
                   TARGET_MB_S);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tokenizer_bench: %s needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--tokenizer") && ntok < 32) toks[ntok++] = argv[++i];
        else if (!strcmp(argv[i], "--text")) text_path = argv[++i];
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json_path = argv[++i];
        else {
            fprintf(stderr, "tokenizer_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    static const char *const dflt[] = {"bl_qwen2", "bl_olmoe",  "bl_llama3", "sp_llama",
                                       "sp_mistral", "sp_meta", "bert_bpe",  "suffix_bpe"};
    static char dpaths[8][256];
    if (!ntok)
        for (int i = 0; i < 8; i++) {
            snprintf(dpaths[i], sizeof dpaths[i], "tests/tokenizer/fixtures/%s", dflt[i]);
            toks[ntok++] = dpaths[i];
        }
    size_t tn = 0;
    char *text = s_read(text_path, &tn);
    if (!text) {
        fprintf(stderr, "tokenizer_bench: cannot read %s (run from the source root or pass --text)\n", text_path);
        return 2;
    }
    char cpu[256], host[256] = "unknown";
    s_cpu_name(cpu, sizeof cpu);
    gethostname(host, sizeof host);
    printf("machine: %s, cpu: %s, one thread; text: %s (%zu bytes); target %.0f MB/s\n", host, cpu, text_path, tn,
           TARGET_MB_S);
    printf("%-12s %-9s %11s %9s %9s %10s %7s %8s %6s %9s\n", "tokenizer", "calls", "encode_MB/s", "wall_MB/s",
           "warm_MB/s", "bytes", "calls", "tokens", "ratio", "dec_MB/s");
    json_t *jres = json_array();
    int rc = 0;
    double worst = 1e30;
    static const char *const modes[] = {"per-line", "per-para", "whole"};
    for (int t = 0; t < ntok; t++) {
        tok_t *tok = NULL;
        strata_errbuf_t eb;
        if (tok_load(&tok, toks[t], &eb)) {
            fprintf(stderr, "tokenizer_bench: %s\n", eb.msg);
            rc = 2;
            break;
        }
        for (int m = 0; m < 3; m++) {
            s_chunks_t c = s_split(text, tn, m);
            size_t bytes = 0, tokens = 0;
            for (size_t k = 0; k < c.n; k++) bytes += c.len[k];
            int32_t *all = NULL;
            size_t nall = 0;
            /* untimed pass: token counts, the ids for the decode timing, warm instruction caches */
            for (size_t k = 0; k < c.n; k++) {
                int32_t *ids;
                size_t n;
                if (tok_encode(tok, c.p[k], c.len[k], false, &ids, &n)) rc = 1;
                tokens += n;
                if (m == 2) {
                    all = ids;
                    nall = n;
                } else {
                    free(ids);
                }
            }
            /* Timed passes, each on a freshly loaded tokenizer so that no piece cache carries
             * over from an earlier pass of the same text (the load is not timed). */
            double spent = 0, wall = 0;
            size_t reps = 0;
            do {
                tok_t *fresh = NULL;
                if (tok_load(&fresh, toks[t], &eb)) {
                    rc = 1;
                    break;
                }
                double t0 = s_cpu(), w0 = s_now();
                for (size_t k = 0; k < c.n; k++) {
                    int32_t *ids;
                    size_t n;
                    if (tok_encode(fresh, c.p[k], c.len[k], false, &ids, &n)) rc = 1;
                    free(ids);
                }
                spent += s_cpu() - t0;
                wall += s_now() - w0;
                reps++;
                tok_free(fresh);
            } while (spent < seconds);
            double mbs = (double)bytes * reps / spent / 1e6;
            double wall_mbs = (double)bytes * reps / wall / 1e6;
            /* steady state: the same tokenizer again, its cache warm from the untimed pass */
            double wspent = 0;
            size_t wreps = 0;
            do {
                double t0 = s_cpu();
                for (size_t k = 0; k < c.n; k++) {
                    int32_t *ids;
                    size_t n;
                    if (tok_encode(tok, c.p[k], c.len[k], false, &ids, &n)) rc = 1;
                    free(ids);
                }
                wspent += s_cpu() - t0;
                wreps++;
            } while (wspent < seconds / 2);
            double warm_mbs = (double)bytes * wreps / wspent / 1e6;
            double dec_mbs = 0;
            if (m == 2 && all) {
                size_t dreps = 0;
                double d0 = s_cpu(), d1;
                do {
                    char *out;
                    size_t on;
                    if (tok_decode(tok, all, nall, false, &out, &on)) rc = 1;
                    free(out);
                    dreps++;
                    d1 = s_cpu();
                } while (d1 - d0 < seconds / 2);
                dec_mbs = (double)bytes * dreps / (d1 - d0) / 1e6;
            }
            free(all);
            if (mbs < worst) worst = mbs;
            const char *name = strrchr(toks[t], '/') ? strrchr(toks[t], '/') + 1 : toks[t];
            printf("%-12s %-9s %11.2f %9.2f %9.2f %10zu %7zu %8zu %6.2f %9.2f\n", name, modes[m], mbs, wall_mbs,
                   warm_mbs, bytes, c.n, tokens, mbs / TARGET_MB_S, dec_mbs);
            json_array_append_new(jres, json_pack("{s:s, s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:f}",
                                                  "tokenizer", toks[t], "mode", modes[m], "figure", "encode_MB_s",
                                                  "value", mbs, "wall_MB_s", wall_mbs, "warm_MB_s", warm_mbs,
                                                  "bound", TARGET_MB_S, "ratio", mbs / TARGET_MB_S, "bytes",
                                                  (json_int_t)bytes, "calls", (json_int_t)c.n, "tokens",
                                                  (json_int_t)tokens, "decode_MB_s", dec_mbs));
            free(c.p);
            free(c.len);
        }
        tok_free(tok);
    }
    printf("slowest: %.2f MB/s (target %.0f MB/s: %s)\n", worst, TARGET_MB_S, worst >= TARGET_MB_S ? "met" : "NOT met");
    if (json_path && !rc) {
        json_t *root = json_pack("{s:s, s:{s:s, s:s, s:i}, s:s, s:I, s:s, s:f, s:f, s:o}", "bench", "tokenizer_bench",
                                 "machine", "hostname", host, "cpu", cpu, "threads", 1, "text", text_path,
                                 "text_bytes", (json_int_t)tn, "figure", "encode_MB_s", "bound", TARGET_MB_S,
                                 "slowest_ratio", worst / TARGET_MB_S, "results", jres);
        jres = NULL;
        if (!root || json_dump_file(root, json_path, JSON_INDENT(2))) {
            fprintf(stderr, "tokenizer_bench: cannot write %s\n", json_path);
            rc = 1;
        }
        json_decref(root);
    }
    json_decref(jres);
    free(text);
    return rc;
}
