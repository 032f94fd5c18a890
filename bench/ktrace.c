/* ktrace.c - per-kernel times of any CUDA program, inside CUDA graphs too, without nsys: a
 * CUPTI activity-trace injection library. The GPU host has no Nsight tools; this is how the
 * per-kernel figures in ARCHITECTURE.md were taken. Run a program with
 *
 *   CUDA_INJECTION64_PATH=/path/libstrata_ktrace.so STRATA_KTRACE_OUT=trace.txt PROGRAM ...
 *
 * and read trace.txt with bench/ktrace.py ("%p" in the path becomes the process id: a process
 * group started with the variables set writes a file per process). Each kernel is one line
 *   K start_ns end_ns stream grid_x grid_y grid_z block_x name(mangled)
 * and, with STRATA_KTRACE_MEMCPY=1, each copy one line
 *   M start_ns end_ns stream bytes copy_kind
 * Tracing adds host time to every launch (a graph launch is one), so the gaps between steps
 * grow; the times inside a graph stay as they are. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KT_BUF_BYTES (8u << 20)

static FILE *s_out;

static void CUPTIAPI s_buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, KT_BUF_BYTES);
    *size = *buf ? KT_BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI s_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (s_out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            fprintf(s_out, "K %llu %llu %u %d %d %d %d %s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->streamId, k->gridX, k->gridY, k->gridZ, k->blockX,
                    k->name ? k->name : "?");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            fprintf(s_out, "M %llu %llu %u %llu %d\n", (unsigned long long)m->start, (unsigned long long)m->end,
                    m->streamId, (unsigned long long)m->bytes, (int)m->copyKind);
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "ktrace: %zu records dropped\n", dropped);
    free(buf);
}

static void s_finish(void)
{
    cuptiActivityFlushAll(1);
    if (s_out) fclose(s_out);
    s_out = NULL;
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this library; nonzero is success. */
int InitializeInjection(void)
{
    const char *path = getenv("STRATA_KTRACE_OUT");
    if (!path || !*path) path = "ktrace.txt";
    /* "%p" in the path becomes the process id: a process group traced through one variable
     * writes a file per process */
    char buf[4096];
    const char *pp = strstr(path, "%p");
    if (pp && snprintf(buf, sizeof buf, "%.*s%d%s", (int)(pp - path), path, (int)getpid(), pp + 2) < (int)sizeof buf)
        path = buf;
    if (!(s_out = fopen(path, "w"))) {
        fprintf(stderr, "ktrace: cannot write %s\n", path);
        return 0;
    }
    if (cuptiActivityRegisterCallbacks(s_buffer_requested, s_buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "ktrace: CUPTI refused the activity trace\n");
        fclose(s_out);
        s_out = NULL;
        return 0;
    }
    const char *mc = getenv("STRATA_KTRACE_MEMCPY");
    if (mc && *mc == '1') cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    atexit(s_finish);
    return 1;
}
