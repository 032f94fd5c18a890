/* fuzz_msg.h - the body shared by the proto/msg.c decoder fuzz targets (one per family).
 *
 * Whatever a decoder accepts must re-encode, decode again and re-encode to the same bytes;
 * whatever it refuses must carry an error code and a message. ASan/UBSan catch the rest. */
#ifndef STRATA_FUZZ_MSG_H
#define STRATA_FUZZ_MSG_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/msg.h"

static inline void fuzz_msg_one(msg_family_t fam, const uint8_t *data, size_t size)
{
    msg_t m, m2;
    msg_err_t err;
    msg_buf_t b1 = {0}, b2 = {0};
    int rc = msg_decode(fam, data, size, &m, &err);
    if (rc == 0) {
        STRATA_ASSERT(msg_type_family(m.type) == fam);
        STRATA_ASSERT(msg_encode(&m, &b1) == 0);
        STRATA_ASSERT(msg_decode(fam, b1.data, b1.size, &m2, &err) == 0);
        STRATA_ASSERT(m2.type == m.type && m2.has_id == m.has_id && m2.id == m.id);
        STRATA_ASSERT(msg_encode(&m2, &b2) == 0);
        STRATA_ASSERT(b1.size == b2.size && memcmp(b1.data, b2.data, b1.size) == 0);
        msg_free(&m2);
    } else {
        STRATA_ASSERT(err.code > MSG_E_NONE && err.code < MSG_E_COUNT);
        STRATA_ASSERT(err.text[0] != 0);
        STRATA_ASSERT(memchr(err.text, 0, sizeof err.text) != NULL);
    }
    msg_free(&m);
    msg_buf_free(&b1);
    msg_buf_free(&b2);
}

/* Targets with two directions: the first input byte picks one. */
static inline void fuzz_msg_two(msg_family_t in, msg_family_t out, const uint8_t *data, size_t size)
{
    if (size < 1) return;
    fuzz_msg_one((data[0] & 1) ? out : in, data + 1, size - 1);
}

#endif
