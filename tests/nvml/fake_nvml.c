/* A stand-in for libnvidia-ml.so.1, so ddpq's NVML path runs through the real
 * nvidia-ml-py bindings on a machine without a GPU or driver.
 *
 * Only the entry points ddpq.worker.devices reaches through pynvml exist; a
 * missing one makes pynvml raise NVMLError_FunctionNotFound, which is what a
 * too-old real driver does too. Struct layouts mirror pynvml's ctypes
 * definitions (and nvml.h), because pynvml reads our memory through them.
 *
 * Configured at every nvmlInit (ddpq's worker calls it at each look), from the
 * environment and, over it, the file FAKE_NVML_FILE names (lines NAME=VALUE, the
 * same names; a test rewrites it while a daemon runs):
 *   FAKE_NVML_GPUS=N                  number of GPUs (default 2, at most 64)
 *   FAKE_NVML_MEM_MB=M[,M...]         total memory of each GPU (default 24576; a
 *                                     list gives GPU 0, 1, ... theirs, the last repeats)
 *   FAKE_NVML_PROCS=gpu:pid:mb,...    compute processes; mb "na" = not available
 *   FAKE_NVML_FAIL=1|init             nvmlInit fails: driver not loaded
 *   FAKE_NVML_FAIL=procs              the process query fails: GPU is lost
 *   FAKE_NVML_UTIL_FILE=path          compute utilisation (see the block at the end)
 * An unreadable FAKE_NVML_FILE, or a line of it that is not NAME=VALUE, fails nvmlInit.
 * Build with -DFAKE_NVML_NO_V3 to drop nvmlDeviceGetComputeRunningProcesses_v3,
 * like drivers older than 510.
 */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_UNKNOWN = 999,
};
#define MAX_GPUS 64
#define MAX_PROCS 256
#define MIB (1024ULL * 1024ULL)

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
/* Same layout for _v2 and _v3 (pynvml aliases them): 24 bytes with padding. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct fake_device { unsigned int index; } *nvmlDevice_t;

static struct fake_device devices[MAX_GPUS];
static nvmlProcessInfo_t procs[MAX_PROCS];
static unsigned int proc_gpu[MAX_PROCS];
static unsigned int n_gpus, n_procs, init_count;
static unsigned long long mem_total[MAX_GPUS];
static int fail_procs;

/* The settings of the file FAKE_NVML_FILE names, read at nvmlInit. */
#define MAX_SETTINGS 8
static char file_names[MAX_SETTINGS][32], file_values[MAX_SETTINGS][4096];
static unsigned int n_file;

static const char *env_or(const char *name, const char *dflt) {
    for (unsigned int i = 0; i < n_file; i++)
        if (strcmp(file_names[i], name) == 0) return *file_values[i] ? file_values[i] : dflt;
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static int read_file(void) {
    const char *path = getenv("FAKE_NVML_FILE");
    char line[4200];
    n_file = 0;
    if (!path || !*path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        char *eq = strchr(line, '=');
        line[strcspn(line, "\r\n")] = 0;
        if (!*line) continue;
        if (!eq || eq - line >= 32 || strlen(eq + 1) >= 4096 || n_file >= MAX_SETTINGS) {
            fclose(f);
            return -1;
        }
        *eq = 0;
        strcpy(file_names[n_file], line);
        strcpy(file_values[n_file], eq + 1);
        n_file++;
    }
    fclose(f);
    return 0;
}

/* "16384" or "16384,81920,...": each GPU's, the last repeated. */
static int parse_mem(const char *spec) {
    unsigned long long last = 0;
    const char *p = spec;
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        if (*p) {
            char *end;
            last = strtoull(p, &end, 10);
            if (end == p || (*end && *end != ',')) return -1;
            p = *end ? end + 1 : end;
        }
        mem_total[i] = last * MIB;
    }
    return 0;
}

/* A malformed FAKE_NVML_PROCS fails init loudly instead of silently testing
 * fewer processes than the test author meant. */
static int parse_procs(const char *spec) {
    char buf[4096], *save = NULL;
    n_procs = 0;
    if (strlen(spec) >= sizeof buf) return -1;
    strcpy(buf, spec);
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        unsigned int gpu, pid;
        char mb[32];
        if (n_procs >= MAX_PROCS || sscanf(tok, "%u:%u:%31s", &gpu, &pid, mb) != 3) return -1;
        if (gpu >= n_gpus) return -1;
        proc_gpu[n_procs] = gpu;
        procs[n_procs].pid = pid;
        procs[n_procs].usedGpuMemory =
            strcmp(mb, "na") == 0 ? ~0ULL : strtoull(mb, NULL, 10) * MIB;
        procs[n_procs].gpuInstanceId = procs[n_procs].computeInstanceId = ~0U;
        n_procs++;
    }
    return 0;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (read_file() != 0) return NVML_ERROR_UNKNOWN;
    const char *fail = env_or("FAKE_NVML_FAIL", "");
    if (strcmp(fail, "1") == 0 || strcmp(fail, "init") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    fail_procs = strcmp(fail, "procs") == 0;
    n_gpus = (unsigned int)strtoul(env_or("FAKE_NVML_GPUS", "2"), NULL, 10);
    if (n_gpus > MAX_GPUS) return NVML_ERROR_UNKNOWN;
    for (unsigned int i = 0; i < n_gpus; i++) devices[i].index = i;
    if (parse_mem(env_or("FAKE_NVML_MEM_MB", "24576")) != 0) return NVML_ERROR_UNKNOWN;
    if (parse_procs(env_or("FAKE_NVML_PROCS", "")) != 0) return NVML_ERROR_UNKNOWN;
    init_count++;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    init_count--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

#define CHECK_DEVICE(d) \
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED; \
    if ((d) == NULL || (d) < devices || (d) >= devices + n_gpus) return NVML_ERROR_INVALID_ARGUMENT

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = n_gpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
    if (index >= n_gpus || !device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t put_string(char *buf, unsigned int len, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    return (unsigned int)snprintf(buf, len, "%s", s) >= len ? NVML_ERROR_INSUFFICIENT_SIZE
                                                           : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    char s[64];
    CHECK_DEVICE(d);
    snprintf(s, sizeof s, "GPU-fa4e0000-0000-0000-0000-%012u", d->index);
    return put_string(uuid, len, s);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    CHECK_DEVICE(d);
    return put_string(name, len, "Fake NVML GPU");
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *memory) {
    CHECK_DEVICE(d);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    /* Used memory is what the listed processes hold, so tests can check both. */
    unsigned long long used = 0;
    for (unsigned int i = 0; i < n_procs; i++)
        if (proc_gpu[i] == d->index && procs[i].usedGpuMemory != ~0ULL) used += procs[i].usedGpuMemory;
    unsigned long long total = mem_total[d->index];
    memory->total = total;
    memory->used = used;
    memory->free = used > total ? 0 : total - used;
    return NVML_SUCCESS;
}

/* NVML's two-call protocol: a too-small buffer (or none) gets the needed
 * count and INSUFFICIENT_SIZE, except that no processes at all is SUCCESS. */
static nvmlReturn_t running_processes(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *out) {
    CHECK_DEVICE(d);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (fail_procs) return NVML_ERROR_GPU_IS_LOST;
    unsigned int n = 0;
    for (unsigned int i = 0; i < n_procs; i++) n += proc_gpu[i] == d->index;
    if (n == 0 || out == NULL || *count < n) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    n = 0;
    for (unsigned int i = 0; i < n_procs; i++)
        if (proc_gpu[i] == d->index) out[n++] = procs[i];
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    return running_processes(d, count, infos);
}
#ifndef FAKE_NVML_NO_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    return running_processes(d, count, infos);
}
#endif

/* ---- Utilisation (interactive sessions' idle reclaim) ----------------------
 * nvmlDeviceGetUtilizationRates reads FAKE_NVML_UTIL_FILE at every call, so a
 * test can change it while a daemon runs: one number per GPU, in index order,
 * separated by spaces, commas or newlines ("0 35" = GPU 0 idle, GPU 1 at 35%).
 * No file, or no number for a GPU: 0%. The name "na" for a GPU: not supported.
 */
#define NVML_ERROR_NOT_SUPPORTED 3
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    CHECK_DEVICE(d);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = u->memory = 0;
    const char *path = env_or("FAKE_NVML_UTIL_FILE", "");
    FILE *f = *path ? fopen(path, "r") : NULL;
    if (!f) return NVML_SUCCESS;
    char word[32];
    nvmlReturn_t r = NVML_SUCCESS;
    for (unsigned int i = 0; fscanf(f, " %31[^ ,\n]%*[ ,\n]", word) == 1; i++) {
        if (i != d->index) continue;
        if (strcmp(word, "na") == 0) r = NVML_ERROR_NOT_SUPPORTED;
        else u->gpu = (unsigned int)strtoul(word, NULL, 10);
        break;
    }
    fclose(f);
    return r;
}
