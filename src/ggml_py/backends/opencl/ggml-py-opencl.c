/* OpenCL shim of ggml_py: see ggml-py-opencl.h.
 *
 * Declares just the OpenCL types and constants it uses (values from the Khronos
 * specification), so no OpenCL headers are needed. Only called with the GIL
 * held, hence the plain static state.
 */
#include "ggml-py-opencl.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- OpenCL types and constants (cl.h subset) ---- */

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_device_type;
typedef cl_bitfield cl_mem_flags;
typedef cl_bitfield cl_command_queue_properties;
typedef cl_uint cl_bool;
typedef cl_uint cl_platform_info;
typedef cl_uint cl_device_info;
typedef cl_uint cl_program_build_info;
typedef intptr_t cl_context_properties;
typedef struct _cl_platform_id * cl_platform_id;
typedef struct _cl_device_id * cl_device_id;
typedef struct _cl_context * cl_context;
typedef struct _cl_command_queue * cl_command_queue;
typedef struct _cl_mem * cl_mem;
typedef struct _cl_program * cl_program;
typedef struct _cl_kernel * cl_kernel;
typedef struct _cl_event * cl_event;

#define CL_SUCCESS 0
#define CL_TRUE 1
#define CL_DEVICE_TYPE_ALL 0xFFFFFFFFu
#define CL_PLATFORM_NAME 0x0902
#define CL_DEVICE_TYPE 0x1000
#define CL_DEVICE_MAX_COMPUTE_UNITS 0x1002
#define CL_DEVICE_MAX_WORK_GROUP_SIZE 0x1004
#define CL_DEVICE_MAX_MEM_ALLOC_SIZE 0x1010
#define CL_DEVICE_MEM_BASE_ADDR_ALIGN 0x1019
#define CL_DEVICE_GLOBAL_MEM_SIZE 0x101F
#define CL_DEVICE_LOCAL_MEM_SIZE 0x1023
#define CL_DEVICE_NAME 0x102B
#define CL_DEVICE_VENDOR 0x102C
#define CL_DRIVER_VERSION 0x102D
#define CL_DEVICE_VERSION 0x102F
#define CL_DEVICE_OPENCL_C_VERSION 0x103D
#define CL_CONTEXT_PLATFORM 0x1084
#define CL_MEM_READ_WRITE (1u << 0)
#define CL_MEM_ALLOC_HOST_PTR (1u << 4)
#define CL_DEVICE_TYPE_CPU (1u << 1)
#define CL_PROGRAM_BUILD_LOG 0x1183
#define CL_BUILD_PROGRAM_FAILURE (-11)

#define CL_API_CALL
typedef void (CL_API_CALL * ctx_notify_fn)(const char *, const void *, size_t, void *);
typedef void (CL_API_CALL * build_notify_fn)(cl_program, void *);

/* ---- entry points, resolved with dlsym ---- */

#define GPO_FUNCS(X) \
    X(cl_int, clGetPlatformIDs, (cl_uint, cl_platform_id *, cl_uint *)) \
    X(cl_int, clGetPlatformInfo, (cl_platform_id, cl_platform_info, size_t, void *, size_t *)) \
    X(cl_int, clGetDeviceIDs, (cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *)) \
    X(cl_int, clGetDeviceInfo, (cl_device_id, cl_device_info, size_t, void *, size_t *)) \
    X(cl_context, clCreateContext, (const cl_context_properties *, cl_uint, const cl_device_id *, \
                                    ctx_notify_fn, void *, cl_int *)) \
    X(cl_int, clReleaseContext, (cl_context)) \
    X(cl_command_queue, clCreateCommandQueue, (cl_context, cl_device_id, \
                                               cl_command_queue_properties, cl_int *)) \
    X(cl_int, clReleaseCommandQueue, (cl_command_queue)) \
    X(cl_mem, clCreateBuffer, (cl_context, cl_mem_flags, size_t, void *, cl_int *)) \
    X(cl_int, clReleaseMemObject, (cl_mem)) \
    X(cl_int, clEnqueueWriteBuffer, (cl_command_queue, cl_mem, cl_bool, size_t, size_t, \
                                     const void *, cl_uint, const cl_event *, cl_event *)) \
    X(cl_int, clEnqueueReadBuffer, (cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, \
                                    cl_uint, const cl_event *, cl_event *)) \
    X(cl_int, clEnqueueCopyBuffer, (cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, \
                                    cl_uint, const cl_event *, cl_event *)) \
    X(cl_int, clEnqueueFillBuffer, (cl_command_queue, cl_mem, const void *, size_t, size_t, \
                                    size_t, cl_uint, const cl_event *, cl_event *)) \
    X(cl_program, clCreateProgramWithSource, (cl_context, cl_uint, const char **, \
                                              const size_t *, cl_int *)) \
    X(cl_int, clBuildProgram, (cl_program, cl_uint, const cl_device_id *, const char *, \
                               build_notify_fn, void *)) \
    X(cl_int, clGetProgramBuildInfo, (cl_program, cl_device_id, cl_program_build_info, size_t, \
                                      void *, size_t *)) \
    X(cl_int, clReleaseProgram, (cl_program)) \
    X(cl_kernel, clCreateKernel, (cl_program, const char *, cl_int *)) \
    X(cl_int, clReleaseKernel, (cl_kernel)) \
    X(cl_int, clSetKernelArg, (cl_kernel, cl_uint, size_t, const void *)) \
    X(cl_int, clEnqueueNDRangeKernel, (cl_command_queue, cl_kernel, cl_uint, const size_t *, \
                                       const size_t *, const size_t *, cl_uint, const cl_event *, \
                                       cl_event *)) \
    X(cl_int, clFinish, (cl_command_queue)) \
    X(cl_int, clEnqueueMarkerWithWaitList, (cl_command_queue, cl_uint, const cl_event *, \
                                            cl_event *)) \
    X(cl_int, clEnqueueBarrierWithWaitList, (cl_command_queue, cl_uint, const cl_event *, \
                                             cl_event *)) \
    X(cl_int, clWaitForEvents, (cl_uint, const cl_event *)) \
    X(cl_int, clReleaseEvent, (cl_event))

#define GPO_DECL(ret, name, args) static ret (CL_API_CALL * p_##name) args;
GPO_FUNCS(GPO_DECL)

struct gpo_ctx {
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    int host_memory;        /* a CPU device: its memory is the process's */
};

static void * g_lib = NULL;
static char g_lib_path[1024];
static char g_err[4096];

static int fail(int status, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return status;
}

/* a failed OpenCL call: "<what>: <CL_NAME> (<code>)" */
static int cl_fail(cl_int err, const char * what) {
    return fail(err, "%s: %s (%d)", what, gpo_error_name(err), (int)err);
}

const char * gpo_last_error(void) { return g_err; }
const char * gpo_library_path(void) { return g_lib ? g_lib_path : ""; }
void gpo_free(void * p) { free(p); }

const char * gpo_error_name(int s) {
    switch (s) {
    case 0: return "CL_SUCCESS";
    case -1: return "CL_DEVICE_NOT_FOUND";
    case -2: return "CL_DEVICE_NOT_AVAILABLE";
    case -3: return "CL_COMPILER_NOT_AVAILABLE";
    case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5: return "CL_OUT_OF_RESOURCES";
    case -6: return "CL_OUT_OF_HOST_MEMORY";
    case -11: return "CL_BUILD_PROGRAM_FAILURE";
    case -14: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case -30: return "CL_INVALID_VALUE";
    case -32: return "CL_INVALID_PLATFORM";
    case -33: return "CL_INVALID_DEVICE";
    case -34: return "CL_INVALID_CONTEXT";
    case -36: return "CL_INVALID_COMMAND_QUEUE";
    case -38: return "CL_INVALID_MEM_OBJECT";
    case -43: return "CL_INVALID_BUILD_OPTIONS";
    case -44: return "CL_INVALID_PROGRAM";
    case -45: return "CL_INVALID_PROGRAM_EXECUTABLE";
    case -46: return "CL_INVALID_KERNEL_NAME";
    case -48: return "CL_INVALID_KERNEL";
    case -49: return "CL_INVALID_ARG_INDEX";
    case -50: return "CL_INVALID_ARG_VALUE";
    case -51: return "CL_INVALID_ARG_SIZE";
    case -52: return "CL_INVALID_KERNEL_ARGS";
    case -53: return "CL_INVALID_WORK_DIMENSION";
    case -54: return "CL_INVALID_WORK_GROUP_SIZE";
    case -55: return "CL_INVALID_WORK_ITEM_SIZE";
    case -57: return "CL_INVALID_EVENT_WAIT_LIST";
    case -58: return "CL_INVALID_EVENT";
    case -59: return "CL_INVALID_OPERATION";
    case -61: return "CL_INVALID_BUFFER_SIZE";
    case -63: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    case GPO_ENOLIB: return "GPO_ENOLIB";
    case GPO_ENOSYM: return "GPO_ENOSYM";
    case GPO_ENOPLATFORM: return "GPO_ENOPLATFORM";
    case GPO_ENODEVICE: return "GPO_ENODEVICE";
    case GPO_ENOMEM: return "GPO_ENOMEM";
    default: return "unknown OpenCL error";
    }
}

/* ---- library ---- */

static int resolve_all(void * lib) {
#define GPO_RESOLVE(ret, name, args) \
    *(void **)(&p_##name) = dlsym(lib, #name); \
    if (!p_##name) return fail(GPO_ENOSYM, "%s has no entry point " #name, g_lib_path);
    GPO_FUNCS(GPO_RESOLVE)
    return GPO_OK;
}

int gpo_load(const char * path) {
    if (g_lib) {
        return GPO_OK;
    }
    const char * candidates[3];
    int n = 0;
    if (path && *path) {
        candidates[n++] = path;
    } else {
        const char * env = getenv("GGML_PY_OPENCL_LIBRARY");
        if (env && *env) {
            candidates[n++] = env;       /* an explicit choice: no fallback */
        } else {
            candidates[n++] = "libOpenCL.so.1";
            candidates[n++] = "libOpenCL.so";
        }
    }
    char tried[2048] = "";
    for (int i = 0; i < n; i++) {
        void * lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char * e = dlerror();
            size_t used = strlen(tried);
            snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "",
                     e ? e : candidates[i]);
            continue;
        }
        snprintf(g_lib_path, sizeof g_lib_path, "%s", candidates[i]);
        int s = resolve_all(lib);
        if (s != GPO_OK) {
            dlclose(lib);
            return s;
        }
        g_lib = lib;
        return GPO_OK;
    }
    return fail(GPO_ENOLIB, "cannot open the OpenCL library (%s)", tried);
}

/* ---- devices ---- */

/* the index-th device over all platforms, and its platform */
static int find_device(int index, cl_platform_id * platform, cl_device_id * device, int * count) {
    cl_uint np = 0;
    cl_int err = p_clGetPlatformIDs(0, NULL, &np);
    if (err == -1001 || (err == CL_SUCCESS && np == 0)) {
        return fail(GPO_ENOPLATFORM, "no OpenCL platform found (library %s)", g_lib_path);
    }
    if (err != CL_SUCCESS) {
        return cl_fail(err, "clGetPlatformIDs");
    }
    cl_platform_id plats[16];
    if (np > 16) np = 16;
    err = p_clGetPlatformIDs(np, plats, NULL);
    if (err != CL_SUCCESS) {
        return cl_fail(err, "clGetPlatformIDs");
    }
    int seen = 0;
    for (cl_uint p = 0; p < np; p++) {
        cl_uint nd = 0;
        err = p_clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd);
        if (err != CL_SUCCESS || nd == 0) {
            continue;                    /* CL_DEVICE_NOT_FOUND: a platform without devices */
        }
        cl_device_id devs[64];
        if (nd > 64) nd = 64;
        if (p_clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs, NULL) != CL_SUCCESS) {
            continue;
        }
        if (index >= seen && index < seen + (int)nd) {
            *platform = plats[p];
            *device = devs[index - seen];
            return GPO_OK;
        }
        seen += (int)nd;
    }
    if (count) {
        *count = seen;
        return GPO_OK;
    }
    if (seen == 0) {
        return fail(GPO_ENODEVICE, "no OpenCL device found on %u platform(s)", np);
    }
    return fail(GPO_ENODEVICE, "no OpenCL device %d (there are %d)", index, seen);
}

int gpo_device_count(int * n) {
    cl_platform_id p;
    cl_device_id d;
    *n = 0;
    if (!g_lib) return fail(GPO_ENOLIB, "the OpenCL library is not loaded");
    int s = find_device(-1, &p, &d, n);
    return s == GPO_ENOPLATFORM ? GPO_OK : s;   /* no platform: zero devices */
}

static void dev_str(cl_device_id d, cl_device_info what, char * out) {
    out[0] = 0;
    if (p_clGetDeviceInfo(d, what, GPO_STR_LEN - 1, out, NULL) != CL_SUCCESS) out[0] = 0;
    out[GPO_STR_LEN - 1] = 0;
}

static uint64_t dev_u64(cl_device_id d, cl_device_info what) {
    cl_ulong v = 0;
    p_clGetDeviceInfo(d, what, sizeof v, &v, NULL);
    return v;
}

static uint32_t dev_u32(cl_device_id d, cl_device_info what) {
    cl_uint v = 0;
    p_clGetDeviceInfo(d, what, sizeof v, &v, NULL);
    return v;
}

int gpo_device_info_get(int index, gpo_device_info * info) {
    cl_platform_id p;
    cl_device_id d;
    if (!g_lib) return fail(GPO_ENOLIB, "the OpenCL library is not loaded");
    int s = find_device(index, &p, &d, NULL);
    if (s != GPO_OK) return s;
    memset(info, 0, sizeof *info);
    dev_str(d, CL_DEVICE_NAME, info->name);
    dev_str(d, CL_DEVICE_VENDOR, info->vendor);
    dev_str(d, CL_DEVICE_VERSION, info->version);
    dev_str(d, CL_DRIVER_VERSION, info->driver_version);
    dev_str(d, CL_DEVICE_OPENCL_C_VERSION, info->c_version);
    if (p_clGetPlatformInfo(p, CL_PLATFORM_NAME, GPO_STR_LEN - 1, info->platform, NULL) != CL_SUCCESS)
        info->platform[0] = 0;
    info->device_type = dev_u64(d, CL_DEVICE_TYPE);
    info->global_mem = dev_u64(d, CL_DEVICE_GLOBAL_MEM_SIZE);
    info->max_alloc = dev_u64(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    info->local_mem = dev_u64(d, CL_DEVICE_LOCAL_MEM_SIZE);
    info->compute_units = dev_u32(d, CL_DEVICE_MAX_COMPUTE_UNITS);
    info->base_addr_align_bits = dev_u32(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN);
    size_t wg = 0;
    p_clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    info->max_work_group = wg;
    return GPO_OK;
}

/* ---- context and queue ---- */

int gpo_ctx_create(int index, gpo_ctx ** out) {
    cl_platform_id p;
    cl_device_id d;
    cl_int err = CL_SUCCESS;
    *out = NULL;
    if (!g_lib) return fail(GPO_ENOLIB, "the OpenCL library is not loaded");
    int s = find_device(index, &p, &d, NULL);
    if (s != GPO_OK) return s;
    gpo_ctx * c = calloc(1, sizeof *c);
    if (!c) return fail(GPO_ENOMEM, "out of host memory");
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)p, 0};
    c->device = d;
    c->host_memory = (dev_u64(d, CL_DEVICE_TYPE) & CL_DEVICE_TYPE_CPU) != 0;
    c->context = p_clCreateContext(props, 1, &d, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        free(c);
        return cl_fail(err, "clCreateContext");
    }
    /* in-order: graph nodes run in the order they are enqueued */
    c->queue = p_clCreateCommandQueue(c->context, d, 0, &err);
    if (err != CL_SUCCESS) {
        p_clReleaseContext(c->context);
        free(c);
        return cl_fail(err, "clCreateCommandQueue");
    }
    *out = c;
    return GPO_OK;
}

void gpo_ctx_release(gpo_ctx * c) {
    if (!c) return;
    p_clFinish(c->queue);
    p_clReleaseCommandQueue(c->queue);
    p_clReleaseContext(c->context);
    free(c);
}

/* ---- memory ---- */

/* The allocation is made real here, so that running out of memory is an error of
 * this call and not of a later write: drivers may allocate lazily (PoCL on the CPU
 * allocates at first use and aborts the process when it cannot). On a CPU device the
 * memory is host memory, and CL_MEM_ALLOC_HOST_PTR makes the driver allocate it at
 * creation; on every device a zero fill then commits it. */
int gpo_mem_create(gpo_ctx * c, size_t size, void ** mem) {
    cl_int err = CL_SUCCESS;
    cl_uint flags = CL_MEM_READ_WRITE | (c->host_memory ? CL_MEM_ALLOC_HOST_PTR : 0);
    cl_mem m = p_clCreateBuffer(c->context, flags, size, NULL, &err);
    *mem = NULL;
    if (err != CL_SUCCESS) {
        return cl_fail(err, "clCreateBuffer");
    }
    const unsigned char zero = 0;
    err = p_clEnqueueFillBuffer(c->queue, m, &zero, 1, 0, size, 0, NULL, NULL);
    if (err == CL_SUCCESS) {
        err = p_clFinish(c->queue);
    }
    if (err != CL_SUCCESS) {
        p_clReleaseMemObject(m);
        return cl_fail(err, "clEnqueueFillBuffer");
    }
    *mem = m;
    return GPO_OK;
}

void gpo_mem_release(void * mem) {
    if (mem) p_clReleaseMemObject((cl_mem)mem);
}

int gpo_write(gpo_ctx * c, void * mem, size_t offset, size_t size, const void * src) {
    if (size == 0) return GPO_OK;
    cl_int err = p_clEnqueueWriteBuffer(c->queue, (cl_mem)mem, CL_TRUE, offset, size, src, 0,
                                        NULL, NULL);
    return err == CL_SUCCESS ? GPO_OK : cl_fail(err, "clEnqueueWriteBuffer");
}

int gpo_read(gpo_ctx * c, void * mem, size_t offset, size_t size, void * dst) {
    if (size == 0) return GPO_OK;
    cl_int err = p_clEnqueueReadBuffer(c->queue, (cl_mem)mem, CL_TRUE, offset, size, dst, 0,
                                       NULL, NULL);
    return err == CL_SUCCESS ? GPO_OK : cl_fail(err, "clEnqueueReadBuffer");
}

int gpo_copy(gpo_ctx * c, void * src, size_t src_offset, void * dst, size_t dst_offset,
             size_t size) {
    if (size == 0) return GPO_OK;
    cl_int err = p_clEnqueueCopyBuffer(c->queue, (cl_mem)src, (cl_mem)dst, src_offset, dst_offset,
                                       size, 0, NULL, NULL);
    return err == CL_SUCCESS ? GPO_OK : cl_fail(err, "clEnqueueCopyBuffer");
}

/* ---- programs and kernels ---- */

static char * build_log(cl_program prog, cl_device_id d) {
    size_t n = 0;
    if (p_clGetProgramBuildInfo(prog, d, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS)
        return NULL;
    char * log = malloc(n + 1);
    if (!log) return NULL;
    if (p_clGetProgramBuildInfo(prog, d, CL_PROGRAM_BUILD_LOG, n, log, NULL) != CL_SUCCESS) n = 0;
    log[n] = 0;
    return log;
}

int gpo_program_build(gpo_ctx * c, const char * source, const char * options, void ** program,
                      char ** log) {
    cl_int err = CL_SUCCESS;
    *program = NULL;
    *log = NULL;
    cl_program prog = p_clCreateProgramWithSource(c->context, 1, &source, NULL, &err);
    if (err != CL_SUCCESS) return cl_fail(err, "clCreateProgramWithSource");
    err = p_clBuildProgram(prog, 1, &c->device, options ? options : "", NULL, NULL);
    *log = build_log(prog, c->device);
    if (err != CL_SUCCESS) {
        p_clReleaseProgram(prog);
        return cl_fail(err, "clBuildProgram");
    }
    *program = prog;
    return GPO_OK;
}

void gpo_program_release(void * program) {
    if (program) p_clReleaseProgram((cl_program)program);
}

int gpo_kernel_create(void * program, const char * name, void ** kernel) {
    cl_int err = CL_SUCCESS;
    *kernel = p_clCreateKernel((cl_program)program, name, &err);
    if (err != CL_SUCCESS) {
        *kernel = NULL;
        return fail(err, "clCreateKernel(%s): %s (%d)", name, gpo_error_name(err), (int)err);
    }
    return GPO_OK;
}

void gpo_kernel_release(void * kernel) {
    if (kernel) p_clReleaseKernel((cl_kernel)kernel);
}

int gpo_kernel_arg(void * kernel, unsigned index, size_t size, const void * value) {
    cl_int err = p_clSetKernelArg((cl_kernel)kernel, index, size, value);
    if (err != CL_SUCCESS)
        return fail(err, "clSetKernelArg(%u, %zu bytes): %s (%d)", index, size,
                    gpo_error_name(err), (int)err);
    return GPO_OK;
}

int gpo_kernel_arg_mem(void * kernel, unsigned index, void * mem) {
    cl_mem m = (cl_mem)mem;
    return gpo_kernel_arg(kernel, index, sizeof m, &m);
}

int gpo_enqueue(gpo_ctx * c, void * kernel, unsigned dims, const size_t * global,
                const size_t * local) {
    cl_int err = p_clEnqueueNDRangeKernel(c->queue, (cl_kernel)kernel, dims, NULL, global, local,
                                          0, NULL, NULL);
    return err == CL_SUCCESS ? GPO_OK : cl_fail(err, "clEnqueueNDRangeKernel");
}

/* ---- synchronisation ---- */

int gpo_finish(gpo_ctx * c) {
    cl_int err = p_clFinish(c->queue);
    return err == CL_SUCCESS ? GPO_OK : cl_fail(err, "clFinish");
}

int gpo_marker(gpo_ctx * c, void ** event) {
    cl_event ev = NULL;
    cl_int err = p_clEnqueueMarkerWithWaitList(c->queue, 0, NULL, &ev);
    *event = ev;
    return err == CL_SUCCESS ? GPO_OK : cl_fail(err, "clEnqueueMarkerWithWaitList");
}

int gpo_wait_event(gpo_ctx * c, void * event) {
    cl_event ev = (cl_event)event;
    cl_int err = p_clEnqueueBarrierWithWaitList(c->queue, 1, &ev, NULL);
    return err == CL_SUCCESS ? GPO_OK : cl_fail(err, "clEnqueueBarrierWithWaitList");
}

int gpo_event_sync(void * event) {
    cl_event ev = (cl_event)event;
    cl_int err = p_clWaitForEvents(1, &ev);
    return err == CL_SUCCESS ? GPO_OK : cl_fail(err, "clWaitForEvents");
}

void gpo_event_release(void * event) {
    if (event) p_clReleaseEvent((cl_event)event);
}
