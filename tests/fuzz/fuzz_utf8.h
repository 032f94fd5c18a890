/* fuzz_utf8.h - the fuzz targets' oracle for well-formed UTF-8 (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), written apart from the code under test so that a
 * target does not check that code with itself. */
#ifndef STRATA_FUZZ_UTF8_H
#define STRATA_FUZZ_UTF8_H

#include <stdbool.h>
#include <stddef.h>

static inline bool fuzz_valid_utf8(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) need = 2;
        else if (c == 0xE0) { need = 3; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) need = 3;
        else if (c == 0xED) { need = 3; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) need = 3;
        else if (c == 0xF0) { need = 4; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 4;
        else if (c == 0xF4) { need = 4; hi = 0x8F; }
        else return false;
        if (i + need > n) return false;
        for (size_t k = 1; k < need; k++)
            if (p[i + k] < (k == 1 ? lo : 0x80) || p[i + k] > (k == 1 ? hi : 0xBF)) return false;
        i += need;
    }
    return true;
}

#endif
