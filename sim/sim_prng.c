/*
 * sim_prng.c: the simulator's only randomness (spec/sim.md SIM-2).
 *
 * xoshiro256** (Blackman and Vigna) gives each stream its numbers; the four
 * state words come from splitmix64 run on a mix of the seed and the stream
 * number, so every stream of every seed starts from its own well-spread state
 * and drawing from one stream never moves another.
 */
#include "sim_internal.h"

uint64_t tpi_sim_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void tpi_sim_prng_seed(tpi_sim_prng *p, uint64_t seed, uint64_t stream) {
    TPI_ASSERT(p);
    /* Mix the stream number first so that (seed, stream) pairs do not alias
     * through a simple xor. */
    uint64_t st = stream;
    uint64_t mixed = tpi_sim_splitmix64(&st);
    uint64_t sm = seed ^ mixed;
    for (int i = 0; i < 4; i++)
        p->s[i] = tpi_sim_splitmix64(&sm);
    /* The all-zero state is xoshiro's one fixed point; splitmix64 is a
     * bijection of its counter, so four zeros in a row cannot happen. */
    TPI_ASSERT(p->s[0] | p->s[1] | p->s[2] | p->s[3]);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t tpi_sim_prng_next(tpi_sim_prng *p) {
    uint64_t *s = p->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t tpi_sim_prng_below(tpi_sim_prng *p, uint64_t n) {
    TPI_ASSERT(n > 0);
    /* Reject the low values that would make some residues more likely:
     * 2^64 mod n of them (computed as -n mod n in 64-bit arithmetic). */
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t r = tpi_sim_prng_next(p);
        if (r >= threshold)
            return r % n;
    }
}
