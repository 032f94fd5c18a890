/* fuzz_msg_prefetch.c - libFuzzer target: prefetcher status decoders; byte 0 picks the direction (MSG_FAM_PF_IN / _OUT). */
#include "tests/fuzz/fuzz_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_msg_two(MSG_FAM_PF_IN, MSG_FAM_PF_OUT, data, size);
    return 0;
}
