/* fuzz_msg_reply.c - libFuzzer target: the client's decoder of router replies (MSG_FAM_REPLY). */
#include "tests/fuzz/fuzz_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_msg_one(MSG_FAM_REPLY, data, size);
    return 0;
}
