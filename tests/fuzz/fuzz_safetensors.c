/* fuzz_safetensors.c - libFuzzer target for the safetensors header parser
 * (common/safetensors.c). The input is a whole file image; whatever parses must describe
 * tensors that lie inside the image, with consistent sizes, findable by name. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 20) return 0;
    st_file_t *f = NULL;
    strata_errbuf_t eb = {{0}};
    int rc = st_parse(&f, data, size, "fuzz.safetensors", &eb);
    if (rc < 0) {
        if (f || !eb.msg[0]) abort(); /* every error carries a message and leaves no file */
        return 0;
    }
    uint64_t covered = 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_tensor(f, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size || t->end - t->begin != t->nbytes) abort();
        uint64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
        if (n * st_dtype_size(t->dtype) != t->nbytes) abort();
        if (st_find(f, t->name) != t) abort();
        if (i && strcmp(st_tensor(f, i - 1)->name, t->name) >= 0) abort();
        for (size_t k = 0; k < t->nbytes; k++) sink ^= p[k]; /* ASan checks every byte */
        covered += t->nbytes;
    }
    (void)sink;
    if (st_count(f) && covered > size) abort();
    st_close(f);
    return 0;
}
