/* results.h - the results row (bench/README.md, "Results"): the envelope every benchmark row
 * carries so that a figure can live in bench/results/ apart from the design, and the append of
 * a row to a results file (JSON lines: one compact object a line).
 *
 * The envelope, next to the tool's own fields:
 *   case        stable name of what was measured ("mixtral-8x7b int4 24G batch 1 decode, prompt
 *               128 gen 128 [strata bench]"): rows of one case are comparable, the latest wins
 *   date        ISO 8601 UTC of the run
 *   commit      the tree that was built: $STRATA_COMMIT, else the build's `git describe --always
 *               --dirty` (compiled into ceilings and gpu_decode), else git in the working
 *               directory; null when none is known
 *   machine     CPU model, CPUs, RAM, NUMA nodes, GPU and memory, pinned H2D GB/s
 *   command     the command line
 *   model       {shape, format, attn_format, route_skew}
 *   gpu_budget  --gpu-mem in bytes; null without a budget (every expert resident)
 *   figure, unit         the measured number, e.g. decode tok/s
 *   bound, bound_name    the bound it is measured against and which one ("pcie_only",
 *                        "bw_added", "host_shared", "cpu_memory", "three_tier"; roofline.h); null
 *                        without one
 *   ratio                figure / bound, or null
 *
 * Header-only (static functions): the tools that write rows, gpu_decode and `strata bench`,
 * are each built from their own list of sources, and this adds none to them. */
#ifndef STRATA_BENCH_RESULTS_H
#define STRATA_BENCH_RESULTS_H

#include <dirent.h>
#include <stdbool.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *case_name;
    const char *commit;      /* NULL or "": null */
    const char *machine;
    const char *command;
    const char *shape, *format, *attn_format, *route_skew;
    double gpu_budget;       /* bytes; <= 0: null */
    double figure;
    const char *unit;
    double bound;            /* <= 0 or NAN: null, and so are bound_name and ratio */
    const char *bound_name;
} results_envelope_t;

/* "2026-11-30T14:05:09Z" into buf[21+]: now, UTC. */
static inline void results_date(char *buf, size_t cap)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* The commit of the tree that was built into buf ("" when unknown): $STRATA_COMMIT, else
 * `built` (a build's own describe, may be NULL or ""), else `git describe --always --dirty`
 * run in dir (NULL: the working directory). */
static inline void results_commit(char *buf, size_t cap, const char *built, const char *dir)
{
    const char *e = getenv("STRATA_COMMIT");
    buf[0] = 0;
    if (e && *e) {
        snprintf(buf, cap, "%s", e);
        return;
    }
    if (built && *built) {
        snprintf(buf, cap, "%s", built);
        return;
    }
    char cmd[4200];
    if (dir) snprintf(cmd, sizeof cmd, "git -C '%s' describe --always --dirty 2>/dev/null", dir);
    else snprintf(cmd, sizeof cmd, "git describe --always --dirty 2>/dev/null");
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (!fgets(buf, (int)cap, p)) buf[0] = 0;
    if (pclose(p) != 0) buf[0] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
}

/* "24G", "1536M", or "resident" (no budget). */
static inline void results_budget_name(char *buf, size_t cap, double bytes)
{
    const double G = 1024.0 * 1024.0 * 1024.0, M = 1024.0 * 1024.0;
    if (!(bytes > 0)) snprintf(buf, cap, "resident");
    else if (fmod(bytes, G) == 0) snprintf(buf, cap, "%.0fG", bytes / G);
    else if (fmod(bytes, M) == 0) snprintf(buf, cap, "%.0fM", bytes / M);
    else snprintf(buf, cap, "%.0fB", bytes);
}

/* The machine in words into buf: "CPU model, N CPUs, R GiB RAM, K NUMA node(s)", then with a GPU
 * ", GPU (M GB), PCIe P GB/s pinned H2D" (gpu NULL: none; gpu_mem and pcie_bw in bytes and
 * bytes/s, 0: left out). */
static inline void results_machine(char *buf, size_t cap, const char *gpu, double gpu_mem, double pcie_bw)
{
    char model[256] = "unknown CPU", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *c = strchr(line, ':');
        if (!c) continue;
        c++;
        while (*c == ' ' || *c == '\t') c++;
        snprintf(model, sizeof model, "%s", c);
        model[strcspn(model, "\r\n")] = 0;
        break;
    }
    if (f) fclose(f);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0 * 1024.0);
    int nodes = 0;
    DIR *d = opendir("/sys/devices/system/node");
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, "node", 4) && de->d_name[4] >= '0' && de->d_name[4] <= '9') nodes++;
    if (d) closedir(d);
    int n = snprintf(buf, cap, "%s, %ld CPUs, %.0f GiB RAM, %d NUMA node%s", model, cpus, ram, nodes > 0 ? nodes : 1,
                     nodes > 1 ? "s" : "");
    if (gpu && *gpu && n >= 0 && (size_t)n < cap) {
        n += snprintf(buf + n, cap - (size_t)n, ", %s", gpu);
        if (gpu_mem > 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, " (%.0f GB)", gpu_mem / 1e9);
        if (pcie_bw > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ", PCIe %.2f GB/s pinned H2D", pcie_bw / 1e9);
    }
}

/* argv as one shell line into buf (prefix, e.g. "strata", first when not NULL): arguments with
 * characters the shell would read are single-quoted. */
static inline void results_command(char *buf, size_t cap, const char *prefix, int argc, char **argv)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = -1; i < argc && n + 1 < cap; i++) {
        const char *a = i < 0 ? prefix : argv[i];
        if (!a) continue;
        bool plain = *a != 0;
        for (const char *c = a; *c && plain; c++)
            plain = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./,:=+@%", *c) != NULL;
        if (n > 0 && n + 1 < cap) buf[n++] = ' ';
        if (plain) {
            n += (size_t)snprintf(buf + n, cap - n, "%s", a);
        } else {
            if (n + 1 < cap) buf[n++] = '\'';
            for (const char *c = a; *c && n + 5 < cap; c++) {
                if (*c == '\'') {
                    memcpy(buf + n, "'\\''", 4);
                    n += 4;
                } else {
                    buf[n++] = *c;
                }
            }
            if (n + 1 < cap) buf[n++] = '\'';
        }
        if (n >= cap) n = cap - 1;
        buf[n] = 0;
    }
}

static inline json_t *results_str(const char *s) { return s && *s ? json_string(s) : json_null(); }

/* Set the envelope's fields on row, first in its key order, replacing fields of the same name. */
static inline void results_envelope(json_t *row, const results_envelope_t *e)
{
    char date[32];
    results_date(date, sizeof date);
    bool b = isfinite(e->bound) && e->bound > 0;
    json_t *env = json_object();
    json_object_set_new(env, "case", results_str(e->case_name));
    json_object_set_new(env, "date", json_string(date));
    json_object_set_new(env, "commit", results_str(e->commit));
    json_object_set_new(env, "machine", results_str(e->machine));
    json_object_set_new(env, "command", results_str(e->command));
    json_object_set_new(env, "model",
                        json_pack("{s:o,s:o,s:o,s:o}", "shape", results_str(e->shape), "format", results_str(e->format),
                                  "attn_format", results_str(e->attn_format), "route_skew",
                                  results_str(e->route_skew ? e->route_skew : "uniform")));
    json_object_set_new(env, "gpu_budget", e->gpu_budget > 0 ? json_integer((json_int_t)e->gpu_budget) : json_null());
    json_object_set_new(env, "figure", isfinite(e->figure) ? json_real(e->figure) : json_null());
    json_object_set_new(env, "unit", results_str(e->unit));
    json_object_set_new(env, "bound", b ? json_real(e->bound) : json_null());
    json_object_set_new(env, "bound_name", b ? results_str(e->bound_name) : json_null());
    json_object_set_new(env, "ratio", b && isfinite(e->figure) ? json_real(e->figure / e->bound) : json_null());
    json_object_update_missing(env, row);
    json_object_clear(row);
    json_object_update(row, env);
    json_decref(env);
}

/* Append every row of the array rows to path as JSON lines (the file is created if missing).
 * 0, or -1 with errno set. */
static inline int results_append(const char *path, json_t *rows)
{
    FILE *f = fopen(path, "a");
    if (!f) return -1;
    int rc = 0;
    for (size_t i = 0; i < json_array_size(rows) && rc == 0; i++) {
        char *s = json_dumps(json_array_get(rows, i), JSON_COMPACT);
        if (!s || fprintf(f, "%s\n", s) < 0) rc = -1;
        free(s);
    }
    if (fclose(f) != 0) rc = -1;
    return rc;
}

#endif
