/* standin_hip.c -- a stand-in HIP runtime + hiprtc for driving the REAL hip-python wrappers without a GPU.
 *
 * What it is.  One shared library that the tests build with the system `cc` and install twice, as
 * `libamdhip64.so` and `libhiprtc.so` (one file, two names), in a directory laid out like a ROCm tree
 * (`<root>/lib`).  hip-python opens those libraries lazily, at the first call of a wrapper:
 *   - hip-python 6.x/7.x: `dlopen("libamdhip64.so" / "libhiprtc.so", RTLD_NOW)` by bare name, so the
 *     loader finds them through LD_LIBRARY_PATH;
 *   - hip-python 10.x (rocm-bindings-*): `rocm.bindings.util.paths.get_library_path`, which tries
 *     $ROCM_PATH/lib/<name> (then /opt/rocm/lib, then the bare name).
 * Every symbol is resolved with dlsym on the first call of its wrapper; both conventions ask for the same
 * C entry points (hipGetDeviceProperties is `hipGetDevicePropertiesR0600`, filling hipDeviceProp_tR0600,
 * whose layout is copied below from hip-python's `.pxd`, identical in 7.2.2 and 10.0).
 *
 * What it models.
 *   - devices: MXSTANDIN_DEVICE_COUNT (default 1) devices of arch MXSTANDIN_ARCH (default
 *     "gfx950:sramecc+:xnack-"), with CDNA-like properties (wave 64, 1024 threads per block, grid
 *     limits 2^31-1 x 65535 x 65535 -- overridable with MXSTANDIN_GRID_Y);
 *   - "device" memory is host memory (aligned_alloc); every allocation is tracked, and hipFree / hipMemcpy
 *     / hipMemset / kernel pointer arguments outside an allocation fail with hipErrorInvalidValue;
 *   - hipModuleLoadData accepts an AMDGPU ELF code object whose e_flags name the device's gfx target
 *     (else hipErrorNoBinaryForGpu); hipModuleGetFunction needs the kernel's `<name>.kd` symbol;
 *   - hipModuleLaunchKernel takes its arguments through `extra` (HIP_LAUNCH_PARAM_BUFFER_POINTER/SIZE,
 *     which is how hip-python passes a tuple of ctypes values), checks block/grid limits, appends a line
 *     `launch <name> <gx> <gy> <gz> <bx> <by> <bz> <shared> <hex of the argument bytes>` to the file
 *     named by MXSTANDIN_LOG, and calls the hook set with standin_set_launch_hook (the tests run the
 *     kernel there with a CPU mirror; the hook receives the code object so it can read the argument
 *     layout from the kernel-argument metadata);
 *   - events record the host clock; streams are tokens; everything is synchronous;
 *   - hiprtc compiles by running clang (MXSTANDIN_CLANG, default clang-22) with
 *     `-x hip --cuda-device-only --no-gpu-bundle-output -nogpulib -nogpuinc`, force-including the file
 *     named by MXSTANDIN_HIPRTC_PRELUDE (what real hiprtc predefines: __global__, threadIdx, ...),
 *     then the program's options (`--gpu-architecture=X` is read as `--offload-arch=X`; no arch means
 *     the device's).  The log is clang's output; each compile appends `hiprtc <name> <options...>` to
 *     MXSTANDIN_LOG;
 *   - MXSTANDIN_FAIL=<entry point> makes that entry point return an error (hipErrorInvalidDevice for
 *     hip*, HIPRTC_ERROR_INTERNAL_ERROR for hiprtc*): an initialisation failure that is not "no ROCm".
 * What it does not model.  Asynchrony, multiple contexts, texture/graph/IPC APIs, kernelParams launches
 * (returns hipErrorNotSupported), hipDeviceGetAttribute (hipErrorNotSupported), header arguments of
 * hiprtcCreateProgram, name expressions and linking.  Nothing here executes GPU code.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ types and codes (hip-python's values) */
typedef int hipError_t;
enum {
    hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorOutOfMemory = 2, hipErrorNotInitialized = 3,
    hipErrorInvalidConfiguration = 9, hipErrorNoDevice = 100, hipErrorInvalidDevice = 101,
    hipErrorInvalidImage = 200, hipErrorNoBinaryForGpu = 209, hipErrorInvalidHandle = 400,
    hipErrorNotFound = 500, hipErrorLaunchFailure = 719, hipErrorNotSupported = 801,
};
typedef int hiprtcResult;
enum {
    HIPRTC_SUCCESS = 0, HIPRTC_ERROR_OUT_OF_MEMORY = 1, HIPRTC_ERROR_INVALID_INPUT = 3,
    HIPRTC_ERROR_INVALID_PROGRAM = 4, HIPRTC_ERROR_COMPILATION = 6, HIPRTC_ERROR_INTERNAL_ERROR = 11,
};
#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void *)1)
#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void *)2)
#define HIP_LAUNCH_PARAM_END ((void *)3)

typedef struct { char bytes[16]; } hipUUID_t;
typedef struct { unsigned int bits; } hipDeviceArch_t; /* 17 one-bit fields in one unsigned int */

typedef struct hipDeviceProp_tR0600 {
    char name[256]; hipUUID_t uuid; char luid[8]; unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem, sharedMemPerBlock; int regsPerBlock, warpSize; size_t memPitch;
    int maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3], clockRate; size_t totalConstMem;
    int major, minor; size_t textureAlignment, texturePitchAlignment;
    int deviceOverlap, multiProcessorCount, kernelExecTimeoutEnabled, integrated, canMapHostMemory, computeMode;
    int maxTexture1D, maxTexture1DMipmap, maxTexture1DLinear, maxTexture2D[2], maxTexture2DMipmap[2];
    int maxTexture2DLinear[3], maxTexture2DGather[2], maxTexture3D[3], maxTexture3DAlt[3], maxTextureCubemap;
    int maxTexture1DLayered[2], maxTexture2DLayered[3], maxTextureCubemapLayered[2];
    int maxSurface1D, maxSurface2D[2], maxSurface3D[3], maxSurface1DLayered[2], maxSurface2DLayered[3];
    int maxSurfaceCubemap, maxSurfaceCubemapLayered[2]; size_t surfaceAlignment;
    int concurrentKernels, ECCEnabled, pciBusID, pciDeviceID, pciDomainID, tccDriver, asyncEngineCount;
    int unifiedAddressing, memoryClockRate, memoryBusWidth, l2CacheSize, persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor, streamPrioritiesSupported, globalL1CacheSupported, localL1CacheSupported;
    size_t sharedMemPerMultiprocessor; int regsPerMultiprocessor, managedMemory, isMultiGpuBoard;
    int multiGpuBoardGroupID, hostNativeAtomicSupported, singleToDoublePrecisionPerfRatio;
    int pageableMemoryAccess, concurrentManagedAccess, computePreemptionSupported;
    int canUseHostPointerForRegisteredMem, cooperativeLaunch, cooperativeMultiDeviceLaunch;
    size_t sharedMemPerBlockOptin; int pageableMemoryAccessUsesHostPageTables, directManagedMemAccessFromHost;
    int maxBlocksPerMultiProcessor, accessPolicyMaxWindowSize; size_t reservedSharedMemPerBlock;
    int hostRegisterSupported, sparseHipArraySupported, hostRegisterReadOnlySupported;
    int timelineSemaphoreInteropSupported, memoryPoolsSupported, gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions; int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes; int deferredMappingHipArraySupported, ipcEventSupported;
    int clusterLaunch, unifiedFunctionPointers, reserved[63], hipReserved[32];
    char gcnArchName[256]; size_t maxSharedMemoryPerMultiProcessor; int clockInstructionRate;
    hipDeviceArch_t arch; unsigned int *hdpMemFlushCntl, *hdpRegFlushCntl;
    int cooperativeMultiDeviceUnmatchedFunc, cooperativeMultiDeviceUnmatchedGridDim;
    int cooperativeMultiDeviceUnmatchedBlockDim, cooperativeMultiDeviceUnmatchedSharedMem, isLargeBar, asicRevision;
} hipDeviceProp_tR0600;

/* ------------------------------------------------------------------ configuration and bookkeeping */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static const char *env_or(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return (v && *v) ? v : fallback;
}

static int fails(const char *entry) { /* MXSTANDIN_FAIL: comma-separated entry points that return an error */
    const char *list = getenv("MXSTANDIN_FAIL");
    size_t n = strlen(entry);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, entry, n) == 0) return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}
#define HIP_ENTRY(name) do { if (fails(name)) return hipErrorInvalidDevice; } while (0)
#define RTC_ENTRY(name) do { if (fails(name)) return HIPRTC_ERROR_INTERNAL_ERROR; } while (0)

static int device_count(void) { return atoi(env_or("MXSTANDIN_DEVICE_COUNT", "1")); }
static const char *arch_full(void) { return env_or("MXSTANDIN_ARCH", "gfx950:sramecc+:xnack-"); }
static int current_device = 0;

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char *fmt, ...) {
    const char *path = getenv("MXSTANDIN_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

typedef struct Alloc { char *base; size_t size; struct Alloc *next; } Alloc;
static Alloc *allocs = NULL;

/* Every handle this library gave out (stream, event, module, function, program) with its kind: a handle is
 * looked up here before it is dereferenced, so a stale or foreign one is an error code, not a crash. */
enum { H_STREAM = 1, H_EVENT, H_MODULE, H_FUNCTION, H_PROGRAM };
typedef struct Handle { void *p; int kind; struct Handle *next; } Handle;
static Handle *handles = NULL;

static void *add_handle(void *p, int kind) {
    Handle *h = malloc(sizeof *h);
    h->p = p; h->kind = kind;
    pthread_mutex_lock(&lock);
    h->next = handles; handles = h;
    pthread_mutex_unlock(&lock);
    return p;
}

static void *get_handle(void *p, int kind) { /* p if it is a live handle of this kind, else NULL */
    void *found = NULL;
    pthread_mutex_lock(&lock);
    for (Handle *h = handles; h && p; h = h->next)
        if (h->p == p && h->kind == kind) { found = p; break; }
    pthread_mutex_unlock(&lock);
    return found;
}

static int drop_handle(void *p, int kind) { /* 1 if p was a live handle of this kind (now forgotten) */
    int ok = 0;
    pthread_mutex_lock(&lock);
    for (Handle **hh = &handles; *hh; hh = &(*hh)->next)
        if ((*hh)->p == p && (*hh)->kind == kind) { Handle *h = *hh; *hh = h->next; free(h); ok = 1; break; }
    pthread_mutex_unlock(&lock);
    return ok;
}

static Alloc *find_alloc(const void *p, size_t n) { /* the allocation holding [p, p+n), or NULL */
    const char *c = (const char *)p;
    for (Alloc *a = allocs; a; a = a->next)
        if (c >= a->base && c + n <= a->base + a->size && (n > 0 || c < a->base + a->size)) return a;
    return NULL;
}

/* ------------------------------------------------------------------ device and version queries */
hipError_t hipInit(unsigned int flags) { (void)flags; HIP_ENTRY("hipInit"); return hipSuccess; }

hipError_t hipGetDeviceCount(int *count) {
    HIP_ENTRY("hipGetDeviceCount");
    if (!count) return hipErrorInvalidValue;
    *count = device_count();
    return *count > 0 ? hipSuccess : hipErrorNoDevice;
}

hipError_t hipSetDevice(int dev) {
    HIP_ENTRY("hipSetDevice");
    if (dev < 0 || dev >= device_count()) return hipErrorInvalidDevice;
    current_device = dev;
    return hipSuccess;
}

hipError_t hipGetDevice(int *dev) { HIP_ENTRY("hipGetDevice"); if (!dev) return hipErrorInvalidValue; *dev = current_device; return hipSuccess; }

static int arch_number(void) { /* gfx942 -> 942 (also the major/minor the real runtime reports: 9, 4) */
    const char *a = arch_full();
    return strncmp(a, "gfx", 3) == 0 ? (int)strtol(a + 3, NULL, 16) : 0;
}

hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600 *p, int dev) {
    HIP_ENTRY("hipGetDevicePropertiesR0600");
    if (!p) return hipErrorInvalidValue;
    if (dev < 0 || dev >= device_count()) return hipErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->gcnArchName, sizeof p->gcnArchName, "%s", arch_full());
    char arch[64];
    snprintf(arch, sizeof arch, "%s", arch_full());
    arch[strcspn(arch, ":")] = 0;
    snprintf(p->name, sizeof p->name, "Stand-in Instinct (%s)", arch);
    p->totalGlobalMem = (size_t)1 << 34;
    p->sharedMemPerBlock = 64 * 1024;
    p->regsPerBlock = 512 * 64;
    p->warpSize = 64;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = p->maxThreadsDim[2] = 1024;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = atoi(env_or("MXSTANDIN_GRID_Y", "65535"));
    p->maxGridSize[2] = 65535;
    p->clockRate = 2100000;
    int num = arch_number();
    p->major = num >> 8;
    p->minor = (num >> 4) & 0xf;
    p->multiProcessorCount = atoi(env_or("MXSTANDIN_CUS", "8"));
    p->maxThreadsPerMultiProcessor = 2048;
    p->sharedMemPerMultiprocessor = p->maxSharedMemoryPerMultiProcessor = 64 * 1024;
    p->l2CacheSize = 4 << 20;
    p->pciBusID = 0x40 + dev;
    p->asicRevision = 1;
    p->arch.bits = 0x1ffff;
    return hipSuccess;
}

static int runtime_version(void) { return atoi(env_or("MXSTANDIN_RUNTIME_VERSION", "70253211")); }
hipError_t hipRuntimeGetVersion(int *v) { HIP_ENTRY("hipRuntimeGetVersion"); if (!v) return hipErrorInvalidValue; *v = runtime_version(); return hipSuccess; }
hipError_t hipDriverGetVersion(int *v) { HIP_ENTRY("hipDriverGetVersion"); if (!v) return hipErrorInvalidValue; *v = runtime_version(); return hipSuccess; }
hipError_t hipDeviceGetAttribute(int *v, int attr, int dev) { (void)v; (void)attr; (void)dev; return hipErrorNotSupported; }
hipError_t hipGetLastError(void) { return hipSuccess; }
hipError_t hipPeekAtLastError(void) { return hipSuccess; }
hipError_t hipDeviceSynchronize(void) { HIP_ENTRY("hipDeviceSynchronize"); return hipSuccess; }

const char *hipGetErrorName(hipError_t e) {
    switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNotInitialized: return "hipErrorNotInitialized";
    case hipErrorInvalidConfiguration: return "hipErrorInvalidConfiguration";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    case hipErrorNoBinaryForGpu: return "hipErrorNoBinaryForGpu";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    default: return "hipErrorUnknown";
    }
}

const char *hipGetErrorString(hipError_t e) {
    switch (e) {
    case hipSuccess: return "no error";
    case hipErrorInvalidValue: return "invalid argument (stand-in runtime)";
    case hipErrorInvalidDevice: return "invalid device ordinal (stand-in runtime)";
    case hipErrorNoDevice: return "no ROCm-capable device is detected (stand-in runtime)";
    case hipErrorNoBinaryForGpu: return "no kernel image is available for execution on the device (stand-in runtime)";
    case hipErrorNotFound: return "named symbol not found (stand-in runtime)";
    default: return hipGetErrorName(e);
    }
}

/* ------------------------------------------------------------------ memory (host memory, tracked) */
hipError_t hipMalloc(void **ptr, size_t size) {
    HIP_ENTRY("hipMalloc");
    if (!ptr) return hipErrorInvalidValue;
    size_t rounded = (size + 255) / 256 * 256;
    Alloc *a = malloc(sizeof *a);
    char *base = aligned_alloc(256, rounded ? rounded : 256);
    if (!a || !base) { free(a); free(base); return hipErrorOutOfMemory; }
    memset(base, 0xA5, rounded ? rounded : 256); /* fresh device memory is not zero */
    a->base = base; a->size = size;
    pthread_mutex_lock(&lock);
    a->next = allocs; allocs = a;
    pthread_mutex_unlock(&lock);
    *ptr = base;
    return hipSuccess;
}

hipError_t hipFree(void *ptr) {
    HIP_ENTRY("hipFree");
    if (!ptr) return hipSuccess;
    pthread_mutex_lock(&lock);
    for (Alloc **pp = &allocs; *pp; pp = &(*pp)->next)
        if ((*pp)->base == ptr) {
            Alloc *a = *pp;
            *pp = a->next;
            pthread_mutex_unlock(&lock);
            free(a->base);
            free(a);
            return hipSuccess;
        }
    pthread_mutex_unlock(&lock);
    return hipErrorInvalidValue;
}

static int on_device(const void *p, size_t n) {
    pthread_mutex_lock(&lock);
    int ok = find_alloc(p, n) != NULL;
    pthread_mutex_unlock(&lock);
    return ok;
}

hipError_t hipMemcpy(void *dst, const void *src, size_t n, int kind) {
    HIP_ENTRY("hipMemcpy");
    if (n == 0) return hipSuccess;
    if (!dst || !src || kind < 0 || kind > 4) return hipErrorInvalidValue;
    int dst_dev = kind == 1 || kind == 3, src_dev = kind == 2 || kind == 3;
    if ((dst_dev && !on_device(dst, n)) || (src_dev && !on_device(src, n))) return hipErrorInvalidValue;
    memmove(dst, src, n);
    return hipSuccess;
}

hipError_t hipMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
    (void)stream;
    return hipMemcpy(dst, src, n, kind);
}

hipError_t hipMemset(void *dst, int value, size_t n) {
    HIP_ENTRY("hipMemset");
    if (n && !on_device(dst, n)) return hipErrorInvalidValue;
    memset(dst, value, n);
    return hipSuccess;
}

hipError_t hipMemsetAsync(void *dst, int value, size_t n, void *stream) { (void)stream; return hipMemset(dst, value, n); }

/* ------------------------------------------------------------------ streams and events (synchronous) */
typedef struct { int unused; } Stream;
typedef struct { double ms; int recorded; } Event;

static int bad_stream(void *s) { return s && !get_handle(s, H_STREAM); } /* NULL is the null stream */

hipError_t hipStreamCreate(void **s) {
    HIP_ENTRY("hipStreamCreate");
    if (!s) return hipErrorInvalidValue;
    *s = add_handle(calloc(1, sizeof(Stream)), H_STREAM);
    return hipSuccess;
}
hipError_t hipStreamCreateWithFlags(void **s, unsigned int flags) { (void)flags; return hipStreamCreate(s); }
hipError_t hipStreamDestroy(void *s) { if (!drop_handle(s, H_STREAM)) return hipErrorInvalidHandle; free(s); return hipSuccess; }
hipError_t hipStreamSynchronize(void *s) { return bad_stream(s) ? hipErrorInvalidHandle : hipSuccess; }
hipError_t hipStreamQuery(void *s) { return bad_stream(s) ? hipErrorInvalidHandle : hipSuccess; }

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}
hipError_t hipEventCreate(void **e) {
    HIP_ENTRY("hipEventCreate");
    if (!e) return hipErrorInvalidValue;
    *e = add_handle(calloc(1, sizeof(Event)), H_EVENT);
    return hipSuccess;
}
hipError_t hipEventCreateWithFlags(void **e, unsigned int flags) { (void)flags; return hipEventCreate(e); }
hipError_t hipEventRecord(void *e, void *stream) {
    Event *ev = get_handle(e, H_EVENT);
    if (!ev || bad_stream(stream)) return hipErrorInvalidHandle;
    ev->ms = now_ms();
    ev->recorded = 1;
    return hipSuccess;
}
hipError_t hipEventSynchronize(void *e) { return get_handle(e, H_EVENT) ? hipSuccess : hipErrorInvalidHandle; }
hipError_t hipEventQuery(void *e) { return get_handle(e, H_EVENT) ? hipSuccess : hipErrorInvalidHandle; }
hipError_t hipEventElapsedTime(float *ms, void *start, void *stop) {
    Event *a = get_handle(start, H_EVENT), *b = get_handle(stop, H_EVENT);
    if (!ms || !a || !b) return hipErrorInvalidHandle;
    if (!a->recorded || !b->recorded) return hipErrorInvalidValue;
    *ms = (float)(b->ms - a->ms);
    return hipSuccess;
}
hipError_t hipEventDestroy(void *e) { if (!drop_handle(e, H_EVENT)) return hipErrorInvalidHandle; free(e); return hipSuccess; }

/* ------------------------------------------------------------------ code objects */
typedef struct { unsigned char *image; size_t size; } Module;
typedef struct { Module *module; char name[512]; } Function;

static uint64_t rd(const unsigned char *p, int n) { uint64_t v = 0; for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* Size of a little-endian ELF64 image: the end of its section header table or of its last section. */
static size_t elf_size(const unsigned char *e) {
    uint64_t shoff = rd(e + 0x28, 8), shentsize = rd(e + 0x3A, 2), shnum = rd(e + 0x3C, 2);
    size_t end = shoff + shentsize * shnum;
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *sh = e + shoff + i * shentsize;
        uint64_t type = rd(sh + 4, 4), off = rd(sh + 0x18, 8), size = rd(sh + 0x20, 8);
        if (type != 8 /* SHT_NOBITS */ && off + size > end) end = off + size;
    }
    return end;
}

/* EF_AMDGPU_MACH of a gfx target (the ones mxcore builds; 0 = unknown) */
static unsigned mach_of(int num) {
    switch (num) {
    case 0x90a: return 0x3f;
    case 0x940: return 0x40;
    case 0x941: return 0x4b;
    case 0x942: return 0x4c;
    case 0x950: return 0x4f;
    default: return 0;
    }
}

hipError_t hipModuleLoadData(void **module, const void *image) {
    HIP_ENTRY("hipModuleLoadData");
    const unsigned char *e = image;
    if (!module || !e) return hipErrorInvalidValue;
    if (memcmp(e, "\177ELF", 4) != 0 || e[4] != 2 /* ELFCLASS64 */ || rd(e + 0x12, 2) != 224 /* EM_AMDGPU */)
        return hipErrorInvalidImage;
    unsigned mach = (unsigned)rd(e + 0x30, 4) & 0xff;
    if (mach != mach_of(arch_number())) return hipErrorNoBinaryForGpu;
    Module *m = calloc(1, sizeof *m);
    m->size = elf_size(e);
    m->image = malloc(m->size);
    memcpy(m->image, e, m->size);
    *module = add_handle(m, H_MODULE);
    return hipSuccess;
}

hipError_t hipModuleUnload(void *module) {
    Module *m = module;
    if (!drop_handle(m, H_MODULE)) return hipErrorInvalidHandle; /* its functions stay valid handles: not modelled */
    free(m->image);
    free(m);
    return hipSuccess;
}

hipError_t hipModuleGetFunction(void **fn, void *module, const char *name) {
    HIP_ENTRY("hipModuleGetFunction");
    Module *m = get_handle(module, H_MODULE);
    if (!fn || !name || !m) return hipErrorInvalidHandle;
    char want[600];
    int n = snprintf(want, sizeof want, "%c%s.kd", 0, name) + 1; /* "\0<name>.kd\0" in a string table */
    if (n >= (int)sizeof want || !memmem(m->image, m->size, want, (size_t)n)) return hipErrorNotFound;
    Function *f = calloc(1, sizeof *f);
    f->module = m;
    snprintf(f->name, sizeof f->name, "%s", name);
    *fn = add_handle(f, H_FUNCTION);
    return hipSuccess;
}

/* ------------------------------------------------------------------ launches */
typedef int (*standin_launch_hook)(const char *name, const unsigned *grid, const unsigned *block,
                                   const void *args, size_t args_size, const void *code, size_t code_size);
static standin_launch_hook launch_hook = NULL;

/* Set (or clear, with NULL) the function every launch calls after it is logged; a non-zero return makes
 * the launch fail with hipErrorLaunchFailure. */
void standin_set_launch_hook(standin_launch_hook hook) { launch_hook = hook; }

/* 1 when [p, p+n) lies in one stand-in allocation: for hooks that check pointer arguments. */
int standin_is_device_pointer(const void *p, size_t n) { return on_device(p, n); }

/* Bytes from p to the end of its allocation (0 when p is not stand-in device memory): how far a kernel
 * executed by a hook may read from a pointer argument. */
size_t standin_extent(const void *p) {
    pthread_mutex_lock(&lock);
    Alloc *a = find_alloc(p, 1);
    size_t n = a ? (size_t)(a->base + a->size - (const char *)p) : 0;
    pthread_mutex_unlock(&lock);
    return n;
}

hipError_t hipModuleLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    HIP_ENTRY("hipModuleLaunchKernel");
    Function *f = get_handle(fn, H_FUNCTION);
    if (!f || !get_handle(f->module, H_MODULE)) return hipErrorInvalidHandle;
    if (bad_stream(stream)) return hipErrorInvalidHandle;
    if (params) return hipErrorNotSupported; /* only `extra` launches are modelled */
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024 || shared > 64 * 1024 ||
        gx > 0x7fffffffu || gy > (unsigned)atoi(env_or("MXSTANDIN_GRID_Y", "65535")) || gz > 65535)
        return hipErrorInvalidConfiguration;
    const unsigned char *args = NULL;
    size_t size = 0;
    for (int i = 0; extra && extra[i] != HIP_LAUNCH_PARAM_END; i += 2) {
        if (i > 16) return hipErrorInvalidValue;
        if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_POINTER) args = extra[i + 1];
        else if (extra[i] == HIP_LAUNCH_PARAM_BUFFER_SIZE) size = *(size_t *)extra[i + 1];
        else return hipErrorInvalidValue;
    }
    if (size && !args) return hipErrorInvalidValue;
    char *hex = malloc(2 * size + 1);
    for (size_t i = 0; i < size; i++) sprintf(hex + 2 * i, "%02x", args[i]);
    hex[2 * size] = 0;
    log_line("launch %s %u %u %u %u %u %u %u %s", f->name, gx, gy, gz, bx, by, bz, shared, size ? hex : "-");
    free(hex);
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    if (launch_hook && launch_hook(f->name, grid, block, args, size, f->module->image, f->module->size) != 0)
        return hipErrorLaunchFailure;
    return hipSuccess;
}

/* ------------------------------------------------------------------ hiprtc: clang as the compiler */
typedef struct { char *source, *name, *log, *code; size_t log_size, code_size; } Program;

hiprtcResult hiprtcVersion(int *major, int *minor) {
    RTC_ENTRY("hiprtcVersion");
    if (!major || !minor) return HIPRTC_ERROR_INVALID_INPUT;
    *major = runtime_version() / 10000000;
    *minor = runtime_version() / 100000 % 100;
    return HIPRTC_SUCCESS;
}

const char *hiprtcGetErrorString(hiprtcResult r) {
    switch (r) {
    case HIPRTC_SUCCESS: return "HIPRTC_SUCCESS";
    case HIPRTC_ERROR_INVALID_INPUT: return "HIPRTC_ERROR_INVALID_INPUT";
    case HIPRTC_ERROR_INVALID_PROGRAM: return "HIPRTC_ERROR_INVALID_PROGRAM";
    case HIPRTC_ERROR_COMPILATION: return "HIPRTC_ERROR_COMPILATION";
    default: return "HIPRTC_ERROR_INTERNAL_ERROR";
    }
}

static Program *program(void *p) { return get_handle(p, H_PROGRAM); }

hiprtcResult hiprtcCreateProgram(void **prog, const char *src, const char *name, int nheaders,
                                 const char **headers, const char **include_names) {
    (void)headers; (void)include_names;
    RTC_ENTRY("hiprtcCreateProgram");
    if (!prog || !src || nheaders < 0) return HIPRTC_ERROR_INVALID_INPUT;
    if (nheaders > 0) return HIPRTC_ERROR_INVALID_INPUT; /* headers are not modelled */
    Program *p = calloc(1, sizeof *p);
    p->source = strdup(src);
    p->name = strdup(name ? name : "default_program");
    *prog = add_handle(p, H_PROGRAM);
    return HIPRTC_SUCCESS;
}

hiprtcResult hiprtcDestroyProgram(void **prog) {
    Program *p = prog ? *prog : NULL;
    if (!drop_handle(p, H_PROGRAM)) return HIPRTC_ERROR_INVALID_PROGRAM;
    free(p->source); free(p->name); free(p->log); free(p->code); free(p);
    *prog = NULL;
    return HIPRTC_SUCCESS;
}

static char *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    *size = got;
    return buf;
}

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

hiprtcResult hiprtcCompileProgram(void *prog, int nopts, const char **opts) {
    RTC_ENTRY("hiprtcCompileProgram");
    Program *p = program(prog);
    if (!p) return HIPRTC_ERROR_INVALID_PROGRAM;
    if (nopts < 0 || (nopts > 0 && !opts)) return HIPRTC_ERROR_INVALID_INPUT;
    char dir[4096], src[4200], out[4200], logp[4200], arch_opt[96];
    snprintf(dir, sizeof dir, "%s/standin_hiprtc_XXXXXX", env_or("TMPDIR", "/tmp"));
    if (!mkdtemp(dir)) return HIPRTC_ERROR_INTERNAL_ERROR;
    snprintf(src, sizeof src, "%s/%s", dir, "program.hip");
    snprintf(out, sizeof out, "%s/%s", dir, "program.co");
    snprintf(logp, sizeof logp, "%s/%s", dir, "log.txt");
    if (write_file(src, p->source) != 0) return HIPRTC_ERROR_INTERNAL_ERROR;

    const char **argv = calloc((size_t)nopts + 24, sizeof *argv);
    char **owned = calloc((size_t)nopts + 1, sizeof *owned);
    int argc = 0, has_arch = 0;
    argv[argc++] = env_or("MXSTANDIN_CLANG", "clang-22");
    const char *base[] = {"-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpulib", "-nogpuinc"};
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) argv[argc++] = base[i];
    const char *prelude = getenv("MXSTANDIN_HIPRTC_PRELUDE");
    if (prelude && *prelude) { argv[argc++] = "-include"; argv[argc++] = prelude; }
    size_t logged = strlen(p->name) + 8;
    for (int i = 0; i < nopts; i++) {
        const char *o = opts[i];
        logged += strlen(o) + 1;
        if (strncmp(o, "--gpu-architecture=", 19) == 0) {
            owned[i] = malloc(strlen(o) + 8);
            sprintf(owned[i], "--offload-arch=%s", o + 19);
            o = owned[i];
        }
        if (strncmp(o, "--offload-arch=", 15) == 0) has_arch = 1;
        argv[argc++] = o;
    }
    if (!has_arch) {
        snprintf(arch_opt, sizeof arch_opt, "--offload-arch=%s", arch_full());
        arch_opt[strcspn(arch_opt, ":")] = 0; /* the feature suffixes are not part of the offload arch */
        argv[argc++] = arch_opt;
    }
    argv[argc++] = src;
    argv[argc++] = "-o";
    argv[argc++] = out;
    argv[argc] = NULL;

    char *line = malloc(logged + 1);
    strcpy(line, p->name);
    for (int i = 0; i < nopts; i++) { strcat(line, " "); strcat(line, opts[i]); }
    log_line("hiprtc %s", line);
    free(line);

    int status = -1;
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
        execvp(argv[0], (char *const *)argv);
        static const char msg[] = "stand-in hiprtc: cannot run the compiler (MXSTANDIN_CLANG, default clang-22)\n";
        ssize_t ignored = write(2, msg, sizeof msg - 1);
        (void)ignored;
        _exit(127);
    }
    if (pid > 0) while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    for (int i = 0; i < nopts; i++) free(owned[i]);
    free(owned);
    free(argv);

    free(p->log);
    free(p->code);
    p->code = NULL;
    p->code_size = 0;
    p->log = slurp(logp, &p->log_size);
    if (!p->log) { p->log = strdup(""); p->log_size = 0; }
    int ok = pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok) p->code = slurp(out, &p->code_size);
    unlink(src); unlink(out); unlink(logp); rmdir(dir);
    return ok && p->code ? HIPRTC_SUCCESS : HIPRTC_ERROR_COMPILATION;
}

hiprtcResult hiprtcGetProgramLogSize(void *prog, size_t *size) {
    Program *p = program(prog);
    if (!p || !size) return HIPRTC_ERROR_INVALID_INPUT;
    *size = (p->log ? p->log_size : 0) + 1; /* with the terminating NUL, like hiprtc */
    return HIPRTC_SUCCESS;
}

hiprtcResult hiprtcGetProgramLog(void *prog, char *log) {
    Program *p = program(prog);
    if (!p || !log) return HIPRTC_ERROR_INVALID_INPUT;
    if (p->log) memcpy(log, p->log, p->log_size);
    log[p->log ? p->log_size : 0] = 0;
    return HIPRTC_SUCCESS;
}

hiprtcResult hiprtcGetCodeSize(void *prog, size_t *size) {
    Program *p = program(prog);
    if (!p || !size) return HIPRTC_ERROR_INVALID_INPUT;
    if (!p->code) return HIPRTC_ERROR_INVALID_PROGRAM;
    *size = p->code_size;
    return HIPRTC_SUCCESS;
}

hiprtcResult hiprtcGetCode(void *prog, char *code) {
    Program *p = program(prog);
    if (!p || !code) return HIPRTC_ERROR_INVALID_INPUT;
    if (!p->code) return HIPRTC_ERROR_INVALID_PROGRAM;
    memcpy(code, p->code, p->code_size);
    return HIPRTC_SUCCESS;
}
