/*
 * replay_main.c: a main() for the fuzz harnesses, without a fuzzing engine.
 *
 * With arguments, every file named (and every regular file under each
 * directory named, in sorted order) is fed to LLVMFuzzerTestOneInput: the
 * replay test that runs the committed corpora as regression tests. A
 * harness that finds a bug aborts, which fails the test. Fails when no
 * input was found at all, so a missing corpus cannot pass silently.
 *
 * Without arguments, one input is read from stdin: AFL++'s default mode.
 * Built with afl-clang-fast (scripts/fuzz.sh), it runs AFL++'s persistent
 * loop instead, many inputs per process.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef __AFL_FUZZ_TESTCASE_LEN
#include <unistd.h> /* read(), used by AFL++'s persistent-mode macros */
__AFL_FUZZ_INIT();
#endif

/* Reads a whole stream; NULL on failure. *len set. */
static uint8_t *read_stream(FILE *fp, size_t *len) {
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, fp);
        if (n < cap)
            break;
        uint8_t *grown = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
        if (!grown) {
            free(buf);
            return NULL;
        }
        buf = grown;
        cap *= 2;
    }
    if (buf && ferror(fp)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int run_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    size_t len = 0;
    uint8_t *data = read_stream(fp, &len);
    fclose(fp);
    if (!data) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        return -1;
    }
    LLVMFuzzerTestOneInput(data, len);
    free(data);
    return 1;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Runs path (a file or a directory, recursively). Returns inputs run, -1 on error. */
static long run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: no such file or directory: %s\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return S_ISREG(st.st_mode) ? run_file(path) : 0;
    DIR *dir = opendir(path);
    if (!dir) {
        fprintf(stderr, "replay: cannot open directory %s\n", path);
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    long total = 0;
    struct dirent *e;
    while (total >= 0 && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue; /* ., .., and hidden files such as AFL's .state */
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) {
                total = -1;
                break;
            }
            names = grown;
        }
        size_t len = strlen(path) + 1 + strlen(e->d_name) + 1;
        if (!(names[n] = malloc(len))) {
            total = -1;
            break;
        }
        snprintf(names[n++], len, "%s/%s", path, e->d_name);
    }
    closedir(dir);
    if (total >= 0)
        qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 0; i < n; i++) {
        long r = total >= 0 ? run_path(names[i]) : 0;
        total = r < 0 ? -1 : total + r;
        free(names[i]);
    }
    free(names);
    return total;
}

int main(int argc, char **argv) {
    if (argc < 2) {
#ifdef __AFL_FUZZ_TESTCASE_LEN
        __AFL_INIT();
        const uint8_t *buf = __AFL_FUZZ_TESTCASE_BUF;
        while (__AFL_LOOP(10000))
            LLVMFuzzerTestOneInput(buf, (size_t)__AFL_FUZZ_TESTCASE_LEN);
        return 0;
#else
        size_t len = 0;
        uint8_t *data = read_stream(stdin, &len);
        if (!data)
            return 1;
        LLVMFuzzerTestOneInput(data, len);
        free(data);
        return 0;
#endif
    }
    long total = 0;
    for (int i = 1; i < argc; i++) {
        long r = run_path(argv[i]);
        if (r < 0)
            return 1;
        total += r;
    }
    fprintf(stderr, "replay: %ld inputs ran\n", total);
    return total > 0 ? 0 : 1;
}
