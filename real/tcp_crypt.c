/*
 * tcp_crypt.c: the record layer that seals a worker connection's stream after
 * its authenticated handshake (spec/tcp.md TCP-21), when the backend option
 * encrypt=on. The cryptography is OpenSSL's: AES-256-GCM for the records,
 * HMAC-SHA-256 (tcp_auth.c) to derive their keys; nothing here is home-made
 * beyond putting the bytes in order.
 *
 * Each connection has two keys, one per direction, HMAC-SHA-256(job key,
 * label || ctx) where ctx holds both worker ids, the world size and both
 * handshake nonces (the context both proofs cover) and the label names the
 * direction. Fresh nonces on both ends make every connection's keys new, so a
 * record's nonce can be its number in its direction (a 64-bit counter from
 * 0, never sent): no (key, nonce) pair is ever used twice, and a record
 * replayed, reordered, dropped or moved to another connection or direction
 * is opened under the wrong nonce or key and fails its tag.
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <string.h>

#include "tcp_internal.h"

#define KEY_D2A "tp/conn/seal dialer-to-acceptor v1"
#define KEY_A2D "tp/conn/seal acceptor-to-dialer v1"
#define IV_SIZE 12

tp_status tpi_tcp_encrypt_setup(const tp_options *opts, const tpi_tcp_auth *auth, int *on,
                                char *errmsg, size_t errmsg_len) {
    const char *mode = tp_options_get(opts, "encrypt");
    *on = 0;
    if (!mode || strcmp(mode, "off") == 0)
        return TP_OK;
    if (strcmp(mode, "on") != 0) {
        tpi_format(errmsg, errmsg_len, "encrypt '%.32s' is not 'on' or 'off'", mode);
        return TP_EINVAL;
    }
    if (!auth->on) {
        tpi_format(errmsg, errmsg_len,
                   "encrypt=on needs authentication (auth=on, the default): the stream keys "
                   "come from its handshake (spec/tcp.md TCP-21)");
        return TP_EINVAL;
    }
    *on = 1;
    return TP_OK;
}

int tpi_tcp_seal_keys(const tpi_tcp_auth *auth, const uint8_t *ctx, size_t ctx_len,
                      uint8_t dialer_to_acceptor[TPI_TCP_SEAL_KEY_SIZE],
                      uint8_t acceptor_to_dialer[TPI_TCP_SEAL_KEY_SIZE]) {
    int d = tpi_tcp_auth_derive(auth, KEY_D2A, ctx, ctx_len, dialer_to_acceptor);
    int a = tpi_tcp_auth_derive(auth, KEY_A2D, ctx, ctx_len, acceptor_to_dialer);
    return d == 0 && a == 0 ? 0 : -1;
}

int tpi_tcp_seal_init(tpi_tcp_cipher *s, const uint8_t key[TPI_TCP_SEAL_KEY_SIZE], int sealing) {
    memset(s, 0, sizeof *s);
    EVP_CIPHER_CTX *evp = EVP_CIPHER_CTX_new();
    if (!evp)
        return -1;
    int ok = sealing ? EVP_EncryptInit_ex(evp, EVP_aes_256_gcm(), NULL, key, NULL)
                     : EVP_DecryptInit_ex(evp, EVP_aes_256_gcm(), NULL, key, NULL);
    if (ok != 1) {
        EVP_CIPHER_CTX_free(evp);
        return -1;
    }
    s->evp = evp;
    s->sealing = sealing;
    return 0;
}

void tpi_tcp_seal_clear(tpi_tcp_cipher *s) {
    EVP_CIPHER_CTX_free(s->evp); /* cleans the key schedule; NULL is a no-op */
    memset(s, 0, sizeof *s);
}

size_t tpi_tcp_sealed_size(size_t n) {
    return n + (n + TPI_TCP_SEAL_MAX - 1) / TPI_TCP_SEAL_MAX * TPI_TCP_SEAL_OVERHEAD;
}

size_t tpi_tcp_seal_len(const uint8_t head[TPI_TCP_SEAL_HEAD]) {
    uint32_t n = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 |
                 (uint32_t)head[3] << 24;
    return n >= 1 && n <= TPI_TCP_SEAL_MAX ? n : 0;
}

long tpi_tcp_sealed_next(const uint8_t *p, size_t have) {
    if (have < TPI_TCP_SEAL_HEAD)
        return 0;
    size_t n = tpi_tcp_seal_len(p); /* the head alone decides: nothing past it is read */
    if (n == 0)
        return -1;
    size_t whole = TPI_TCP_SEAL_HEAD + n + TPI_TCP_SEAL_TAG;
    return have >= whole ? (long)whole : 0;
}

/* The record's nonce: its number in this direction, little-endian, then zeros.
 * -1 when the counter is spent (2^64 records: never, but never wrap). */
static int next_iv(tpi_tcp_cipher *s, uint8_t iv[IV_SIZE]) {
    if (s->seq == UINT64_MAX)
        return -1;
    for (int i = 0; i < 8; i++)
        iv[i] = (uint8_t)(s->seq >> (8 * i));
    memset(iv + 8, 0, IV_SIZE - 8);
    s->seq++;
    return 0;
}

int tpi_tcp_seal(tpi_tcp_cipher *s, const struct iovec *iov, int niov, size_t n, uint8_t *out) {
    TPI_ASSERT(s->evp && s->sealing);
    EVP_CIPHER_CTX *evp = s->evp;
    int i = 0;
    size_t off = 0; /* into iov[i] */
    while (n > 0) {
        size_t m = n < TPI_TCP_SEAL_MAX ? n : TPI_TCP_SEAL_MAX;
        uint8_t iv[IV_SIZE];
        int len = 0;
        for (int k = 0; k < 4; k++)
            out[k] = (uint8_t)(m >> (8 * k));
        if (next_iv(s, iv) != 0 || EVP_EncryptInit_ex(evp, NULL, NULL, NULL, iv) != 1 ||
            EVP_EncryptUpdate(evp, NULL, &len, out, TPI_TCP_SEAL_HEAD) != 1)
            return -1;
        uint8_t *body = out + TPI_TCP_SEAL_HEAD;
        size_t done = 0;
        while (done < m) {
            TPI_ASSERT(i < niov);
            size_t piece = iov[i].iov_len - off;
            if (piece > m - done)
                piece = m - done;
            if (piece > 0 &&
                (EVP_EncryptUpdate(evp, body + done, &len, (const uint8_t *)iov[i].iov_base + off,
                                   (int)piece) != 1 ||
                 (size_t)len != piece))
                return -1;
            done += piece;
            off += piece;
            if (off == iov[i].iov_len) {
                i++;
                off = 0;
            }
        }
        uint8_t none[16]; /* GCM's final step writes nothing */
        if (EVP_EncryptFinal_ex(evp, none, &len) != 1 || len != 0 ||
            EVP_CIPHER_CTX_ctrl(evp, EVP_CTRL_GCM_GET_TAG, TPI_TCP_SEAL_TAG, body + m) != 1)
            return -1;
        out += TPI_TCP_SEAL_HEAD + m + TPI_TCP_SEAL_TAG;
        n -= m;
    }
    return 0;
}

int tpi_tcp_open(tpi_tcp_cipher *s, const uint8_t *rec, uint8_t *plain) {
    TPI_ASSERT(s->evp && !s->sealing);
    EVP_CIPHER_CTX *evp = s->evp;
    size_t n = tpi_tcp_seal_len(rec);
    TPI_ASSERT(n > 0); /* the caller checked the head before reading the rest */
    uint8_t iv[IV_SIZE], tag[TPI_TCP_SEAL_TAG], none[16];
    int len = 0;
    memcpy(tag, rec + TPI_TCP_SEAL_HEAD + n, sizeof tag);
    if (next_iv(s, iv) != 0 || EVP_DecryptInit_ex(evp, NULL, NULL, NULL, iv) != 1 ||
        EVP_DecryptUpdate(evp, NULL, &len, rec, TPI_TCP_SEAL_HEAD) != 1 ||
        EVP_DecryptUpdate(evp, plain, &len, rec + TPI_TCP_SEAL_HEAD, (int)n) != 1 ||
        (size_t)len != n || EVP_CIPHER_CTX_ctrl(evp, EVP_CTRL_GCM_SET_TAG, sizeof tag, tag) != 1)
        return -1;
    /* The tag is checked here, in constant time, before the plaintext is used. */
    return EVP_DecryptFinal_ex(evp, none, &len) == 1 ? 0 : -1;
}
