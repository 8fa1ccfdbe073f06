/* geo-ring: let UML 6.1 (832-byte XSTATE buffer) run on hosts with a larger XSAVE area.
 *
 * UML 6.1 saves and restores a guest's FPU state with PTRACE_{GET,SET}REGSET NT_X86_XSTATE using a
 * fixed 832-byte buffer (x87/SSE + AVX). On hosts whose XSAVE area is larger (AVX-512: 2.7 KB, AMX:
 * 11 KB) the host kernel rejects every SETREGSET that is not exactly the full size (EFAULT), and the
 * guest's init dies at once ("ptrace set fp regs failed, errno = 14"). Making UML fall back to FXSAVE
 * (PTRACE_SETFPREGS) boots, but then the upper halves of YMM/ZMM registers are lost on every guest
 * page fault: glibc's AVX2/EVEX string functions corrupt data, Python crashes in startup.
 *
 * netem.uml LD_PRELOADs this into the UML process (compiled with the host's cc at each start): it
 * forwards the two XSTATE requests with a full-size buffer kept per UML save-buffer address, and
 * copies the 832 bytes UML knows about in and out, so guest processes keep their complete state.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>

#define GETREGSET 0x4204
#define SETREGSET 0x4205
#define NT_X86_XSTATE 0x202
#define SLOTS 8192
#define PROBE_BYTES 65536

typedef long (*ptrace_fn)(int, pid_t, void *, void *);
static ptrace_fn real_ptrace;
static size_t full_size;
/* one full-size image per UML save buffer (one per guest thread): keeps the state UML cannot hold */
static struct { void *key; unsigned char *image; int valid; } slots[SLOTS];

static long raw(int req, pid_t pid, void *addr, void *data) {
    if (!real_ptrace) real_ptrace = (ptrace_fn)dlsym(RTLD_NEXT, "ptrace");
    return real_ptrace(req, pid, addr, data);
}

static int learn_size(pid_t pid) {
    if (full_size) return 0;
    void *probe = mmap(NULL, PROBE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe == MAP_FAILED) return -1;
    struct iovec iov = { probe, PROBE_BYTES };
    long r = raw(GETREGSET, pid, (void *)NT_X86_XSTATE, &iov);
    if (r == 0) full_size = iov.iov_len;
    munmap(probe, PROBE_BYTES);
    return r == 0 ? 0 : -1;
}

static int slot_for(void *key) {
    size_t h = ((uintptr_t)key >> 4) % SLOTS;
    for (size_t i = 0; i < SLOTS; i++) {
        size_t j = (h + i) % SLOTS;
        if (slots[j].key == key) return (int)j;
        if (slots[j].key == NULL) {
            void *p = mmap(NULL, full_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) return -1;
            slots[j].key = key; slots[j].image = p; slots[j].valid = 0;
            return (int)j;
        }
    }
    return -1;
}

long ptrace(int req, ...) {
    va_list ap;
    va_start(ap, req);
    pid_t pid = va_arg(ap, pid_t);
    void *addr = va_arg(ap, void *);
    void *data = va_arg(ap, void *);
    va_end(ap);
    if ((req != GETREGSET && req != SETREGSET) || (uintptr_t)addr != NT_X86_XSTATE)
        return raw(req, pid, addr, data);
    struct iovec *user = data;
    if (learn_size(pid) != 0 || user->iov_len >= full_size)
        return raw(req, pid, addr, data);
    int s = slot_for(user->iov_base);
    if (s < 0) { errno = ENOMEM; return -1; }
    struct iovec iov = { slots[s].image, full_size };
    if (req == GETREGSET) {
        long r = raw(GETREGSET, pid, addr, &iov);
        if (r == 0) { memcpy(user->iov_base, slots[s].image, user->iov_len); slots[s].valid = 1; }
        return r;
    }
    if (!slots[s].valid) {  /* first restore into this buffer: start from the tracee's current state */
        if (raw(GETREGSET, pid, addr, &iov) != 0) return -1;
        iov.iov_len = full_size;
        slots[s].valid = 1;
    }
    memcpy(slots[s].image, user->iov_base, user->iov_len);
    return raw(SETREGSET, pid, addr, &iov);
}
