/* faultfs: make the Nth write or fsync under one folder fail, for the fault sweeps of scripts/sweeps.py.

   Loaded with LD_PRELOAD into a child process, it wraps write, pwrite, pwrite64, writev, pwritev,
   fsync and fdatasync. A call counts when its file descriptor names a path under the armed prefix
   (read from /proc/self/fd); every other call goes straight to libc. The process arms it through
   ctypes (kvfault_arm), so one process with its model loaded sweeps every write point of an
   operation: Python's file writes, os.fsync, and SQLite's own pwrite/fsync of the catalog and its WAL.

   kvfault_arm(prefix, at, err, sticky): count calls under prefix from zero; call number `at` (1-based,
   0 = never) fails with errno `err`; with `sticky` every later call fails too (a full disk stays full).
   kvfault_disarm(): stop failing and counting. kvfault_calls(), kvfault_faults(): what was counted; kvfault_first(): the call
   and path of the first failure since arming. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static char prefix[4096];
static size_t prefix_len;
static long fail_at;
static int fail_errno = 28;
static int sticky;
static long calls;
static long faults;
static char first[4200]; /* "<call> <path>" of the first call made to fail since arming */

void kvfault_arm(const char *p, long at, int err, int keep_failing) {
    __atomic_store_n(&prefix_len, 0, __ATOMIC_SEQ_CST);
    snprintf(prefix, sizeof prefix, "%s", p);
    fail_at = at;
    fail_errno = err;
    sticky = keep_failing;
    __atomic_store_n(&calls, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&faults, 0, __ATOMIC_SEQ_CST);
    first[0] = 0;
    __atomic_store_n(&prefix_len, strlen(prefix), __ATOMIC_SEQ_CST);
}

void kvfault_disarm(void) { __atomic_store_n(&prefix_len, 0, __ATOMIC_SEQ_CST); }
long kvfault_calls(void) { return __atomic_load_n(&calls, __ATOMIC_SEQ_CST); }
long kvfault_faults(void) { return __atomic_load_n(&faults, __ATOMIC_SEQ_CST); }
const char *kvfault_first(void) { return first; }

/* 1 when this call must fail (errno is then set), 0 when it goes to libc. */
static int fault(int fd, const char *call) {
    size_t n = __atomic_load_n(&prefix_len, __ATOMIC_SEQ_CST);
    if (n == 0) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t got = readlink(link, path, sizeof path - 1);
    if (got <= 0) return 0;
    path[got] = 0;
    if (strncmp(path, prefix, n) != 0 || (path[n] != 0 && path[n] != '/')) return 0;
    long k = __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST);
    if (fail_at > 0 && (k == fail_at || (sticky && k > fail_at))) {
        if (__atomic_add_fetch(&faults, 1, __ATOMIC_SEQ_CST) == 1) snprintf(first, sizeof first, "%s %s", call, path);
        errno = fail_errno;
        return 1;
    }
    return 0;
}

#define REAL(name) \
    static __typeof__(&name) real_##name; \
    if (!real_##name) real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t count) {
    REAL(write);
    if (fault(fd, "write")) return -1;
    return real_write(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite);
    if (fault(fd, "pwrite")) return -1;
    return real_pwrite(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite64);
    if (fault(fd, "pwrite64")) return -1;
    return real_pwrite64(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    REAL(writev);
    if (fault(fd, "writev")) return -1;
    return real_writev(fd, iov, iovcnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    REAL(pwritev);
    if (fault(fd, "pwritev")) return -1;
    return real_pwritev(fd, iov, iovcnt, offset);
}

int fsync(int fd) {
    REAL(fsync);
    if (fault(fd, "fsync")) return -1;
    return real_fsync(fd);
}

int fdatasync(int fd) {
    REAL(fdatasync);
    if (fault(fd, "fdatasync")) return -1;
    return real_fdatasync(fd);
}
