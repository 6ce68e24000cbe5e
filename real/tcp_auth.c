/*
 * tcp_auth.c: the job secret and the proofs that authenticate every worker
 * and store connection (spec/tcp.md TCP-17). The cryptography is OpenSSL's
 * (HMAC-SHA-256, its random generator, its constant-time compare); nothing
 * here is home-made beyond putting the bytes in order.
 *
 * The secret is at least 16 bytes, given as hex: the backend option "secret",
 * else the environment's TP_SECRET (tprun sets it for its children). The key
 * is HMAC-SHA-256(secret, "tensorplay-rpc key v1"), so the secret itself never
 * keys a proof. A proof is HMAC-SHA-256(key, label || context), cut to its
 * first 16 bytes (a 128-bit tag: a forger's chance per try is 2^-128).
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

#include "tcp_internal.h"

#define KEY_LABEL "tensorplay-rpc key v1"

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Hex text -> bytes; 0 and a reason when it is not TPI_TCP_SECRET_MIN..MAX bytes of hex. */
static int parse_secret(const char *hex, uint8_t *out, size_t *len, char *why, size_t why_len) {
    size_t n = strlen(hex);
    if (n % 2 || n / 2 < TPI_TCP_SECRET_MIN || n / 2 > TPI_TCP_SECRET_MAX) {
        tpi_format(why, why_len, "it must be %u to %u bytes written as hex (%zu characters given)",
                   TPI_TCP_SECRET_MIN, TPI_TCP_SECRET_MAX, n);
        return 0;
    }
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            tpi_format(why, why_len, "character %zu is not a hex digit",
                       hi < 0 ? 2 * i : 2 * i + 1);
            return 0;
        }
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    *len = n / 2;
    return 1;
}

tp_status tpi_tcp_auth_setup(const tp_options *opts, tpi_tcp_auth *auth, char *errmsg,
                             size_t errmsg_len) {
    memset(auth, 0, sizeof *auth);
    const char *mode = tp_options_get(opts, "auth");
    if (mode && strcmp(mode, "off") == 0)
        return TP_OK; /* TCP-17: off only when asked for by name */
    if (mode && strcmp(mode, "on") != 0) {
        tpi_format(errmsg, errmsg_len, "auth '%.32s' is not 'on' or 'off'", mode);
        return TP_EINVAL;
    }
    const char *from = "the backend option 'secret'";
    const char *hex = tp_options_get(opts, "secret");
    if (!hex || !*hex) {
        from = "TP_SECRET";
        hex = getenv("TP_SECRET");
    }
    if (!hex || !*hex) {
        tpi_format(errmsg, errmsg_len,
                   "no job secret: set TP_SECRET (tprun sets it for its processes) or the "
                   "backend option 'secret' to the same hex string on every worker, or set "
                   "the backend option auth=off on a network you trust (spec/tcp.md TCP-17)");
        return TP_EAUTH;
    }
    uint8_t secret[TPI_TCP_SECRET_MAX];
    size_t len = 0;
    char why[128];
    if (!parse_secret(hex, secret, &len, why, sizeof why)) {
        tpi_format(errmsg, errmsg_len, "the job secret in %s is not usable: %s", from, why);
        return TP_EINVAL;
    }
    unsigned int out_len = 0;
    uint8_t key[32];
    if (!HMAC(EVP_sha256(), secret, (int)len, (const unsigned char *)KEY_LABEL,
              sizeof KEY_LABEL - 1, key, &out_len) ||
        out_len != sizeof key) {
        OPENSSL_cleanse(secret, sizeof secret);
        tpi_format(errmsg, errmsg_len, "cannot derive the job key (OpenSSL HMAC failed)");
        return TP_EBACKEND;
    }
    OPENSSL_cleanse(secret, sizeof secret);
    memcpy(auth->key, key, sizeof key);
    OPENSSL_cleanse(key, sizeof key);
    auth->on = 1;
    return TP_OK;
}

void tpi_tcp_auth_clear(tpi_tcp_auth *auth) {
    OPENSSL_cleanse(auth, sizeof *auth);
}

int tpi_tcp_auth_same(const tpi_tcp_auth *a, const tpi_tcp_auth *b) {
    return a->on == b->on && CRYPTO_memcmp(a->key, b->key, sizeof a->key) == 0;
}

int tpi_tcp_auth_nonce(uint8_t nonce[TPI_TCP_NONCE_SIZE]) {
    return RAND_bytes(nonce, TPI_TCP_NONCE_SIZE) == 1 ? 0 : -1;
}

int tpi_tcp_auth_derive(const tpi_tcp_auth *auth, const char *label, const uint8_t *ctx,
                        size_t ctx_len, uint8_t key[32]) {
    TPI_ASSERT(auth->on && label && ctx_len <= TPI_TCP_AUTH_CTX_MAX);
    uint8_t msg[64 + TPI_TCP_AUTH_CTX_MAX];
    size_t n = strlen(label);
    TPI_ASSERT(n <= 64);
    memcpy(msg, label, n);
    memcpy(msg + n, ctx, ctx_len);
    unsigned int out_len = 0;
    /* OpenSSL 3's HMAC allocates its context, so it fails when memory is
     * out. Zeros then: a proof no peer accepts, a key no peer shares, should
     * a caller ignore the status. */
    int ok = HMAC(EVP_sha256(), auth->key, sizeof auth->key, msg, n + ctx_len, key, &out_len) &&
             out_len == 32;
    OPENSSL_cleanse(msg, sizeof msg);
    if (!ok)
        memset(key, 0, 32);
    return ok ? 0 : -1;
}

int tpi_tcp_auth_proof(const tpi_tcp_auth *auth, const char *label, const uint8_t *ctx,
                       size_t ctx_len, uint8_t proof[TPI_TCP_PROOF_SIZE]) {
    uint8_t mac[32];
    int rc = tpi_tcp_auth_derive(auth, label, ctx, ctx_len, mac);
    memcpy(proof, mac, TPI_TCP_PROOF_SIZE);
    OPENSSL_cleanse(mac, sizeof mac);
    return rc;
}

int tpi_tcp_auth_check(const tpi_tcp_auth *auth, const char *label, const uint8_t *ctx,
                       size_t ctx_len, const uint8_t proof[TPI_TCP_PROOF_SIZE]) {
    uint8_t want[TPI_TCP_PROOF_SIZE];
    if (tpi_tcp_auth_proof(auth, label, ctx, ctx_len, want) != 0)
        return -1;
    static const uint8_t zeros[TPI_TCP_PROOF_SIZE];
    int ok = CRYPTO_memcmp(want, proof, TPI_TCP_PROOF_SIZE) == 0 &&
             CRYPTO_memcmp(want, zeros, TPI_TCP_PROOF_SIZE) != 0;
    OPENSSL_cleanse(want, sizeof want);
    return ok;
}

tp_status tp_job_secret_new(char *hex, size_t len) {
    if (!hex || len < 2 * TPI_TCP_JOB_SECRET_BYTES + 1)
        return tpi_fail(TP_EINVAL, "job secret: a buffer of %u bytes is needed",
                        2 * TPI_TCP_JOB_SECRET_BYTES + 1);
    uint8_t b[TPI_TCP_JOB_SECRET_BYTES];
    if (RAND_bytes(b, sizeof b) != 1)
        return tpi_fail(TP_EBACKEND, "job secret: OpenSSL's random generator failed");
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof b; i++) {
        hex[2 * i] = digits[b[i] >> 4];
        hex[2 * i + 1] = digits[b[i] & 15];
    }
    hex[2 * sizeof b] = '\0';
    OPENSSL_cleanse(b, sizeof b);
    return TP_OK;
}
