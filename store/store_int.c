/* store_int.c: the stores' decimal integers (store_int.h, STORE-4). */
#include "store/store_int.h"

int tpi_store_parse_i64(const char *p, size_t len, int64_t *out) {
    size_t i = 0;
    int neg = len > 0 && p[0] == '-';
    i += (size_t)neg;
    if (i == len)
        return 0;
    uint64_t limit = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
    uint64_t v = 0;
    for (; i < len; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0;
        uint64_t d = (uint64_t)(p[i] - '0');
        if (v > (limit - d) / 10u)
            return 0;
        v = v * 10u + d;
    }
    /* -2^63 has no positive counterpart: build it without overflowing. */
    *out = neg ? (v == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    return 1;
}
