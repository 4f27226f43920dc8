/* A minimal OpenCL shim for ggml_py's OpenCL backend.
 *
 * The OpenCL library is opened at run time (dlopen) so that ggml_py builds and
 * installs without OpenCL headers or an ICD loader; the backend is simply
 * unavailable when the library, a platform or a device is missing.
 *
 * Every function returns a status: GPO_OK (0), an OpenCL error code (< 0) or one
 * of the GPO_E* codes below. On failure a message is left in gpo_last_error().
 * OpenCL objects are passed around as opaque pointers.
 */
#ifndef GGML_PY_OPENCL_H
#define GGML_PY_OPENCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPO_OK 0
#define GPO_ENOLIB 1          /* the OpenCL library could not be opened */
#define GPO_ENOSYM 2          /* the library lacks an entry point we need */
#define GPO_ENOPLATFORM 3     /* no OpenCL platform */
#define GPO_ENODEVICE 4       /* no device (or the index is out of range) */
#define GPO_ENOMEM 5          /* host allocation failed */

#define GPO_STR_LEN 256

typedef struct gpo_device_info {
    char name[GPO_STR_LEN];
    char vendor[GPO_STR_LEN];
    char version[GPO_STR_LEN];          /* CL_DEVICE_VERSION */
    char driver_version[GPO_STR_LEN];
    char c_version[GPO_STR_LEN];        /* CL_DEVICE_OPENCL_C_VERSION */
    char platform[GPO_STR_LEN];
    uint64_t device_type;               /* CL_DEVICE_TYPE bits */
    uint64_t global_mem;
    uint64_t max_alloc;
    uint64_t local_mem;
    uint32_t compute_units;
    uint32_t base_addr_align_bits;      /* CL_DEVICE_MEM_BASE_ADDR_ALIGN */
    uint64_t max_work_group;
} gpo_device_info;

typedef struct gpo_ctx gpo_ctx;       /* one device: context + in-order queue */

/* Open the library: `path` if non-NULL, else $GGML_PY_OPENCL_LIBRARY, else
 * libOpenCL.so.1, then libOpenCL.so. Idempotent once it succeeded. */
int gpo_load(const char * path);
const char * gpo_library_path(void);
const char * gpo_last_error(void);
const char * gpo_error_name(int status);

/* Devices over all platforms, in platform order. */
int gpo_device_count(int * n);
int gpo_device_info_get(int index, gpo_device_info * info);

int gpo_ctx_create(int index, gpo_ctx ** out);
void gpo_ctx_release(gpo_ctx * ctx);

int gpo_mem_create(gpo_ctx * ctx, size_t size, void ** mem);
void gpo_mem_release(void * mem);
int gpo_write(gpo_ctx * ctx, void * mem, size_t offset, size_t size, const void * src);
int gpo_read(gpo_ctx * ctx, void * mem, size_t offset, size_t size, void * dst);
int gpo_copy(gpo_ctx * ctx, void * src, size_t src_offset, void * dst, size_t dst_offset,
             size_t size);

/* Build a program. On a build failure *log receives the build log (free with
 * gpo_free); it may be set on success too (warnings). */
int gpo_program_build(gpo_ctx * ctx, const char * source, const char * options,
                      void ** program, char ** log);
void gpo_program_release(void * program);
int gpo_kernel_create(void * program, const char * name, void ** kernel);
void gpo_kernel_release(void * kernel);
int gpo_kernel_arg(void * kernel, unsigned index, size_t size, const void * value);
int gpo_kernel_arg_mem(void * kernel, unsigned index, void * mem);
int gpo_enqueue(gpo_ctx * ctx, void * kernel, unsigned dims, const size_t * global,
                const size_t * local);

int gpo_finish(gpo_ctx * ctx);
int gpo_marker(gpo_ctx * ctx, void ** event);           /* a new event after queued work */
int gpo_wait_event(gpo_ctx * ctx, void * event);        /* later work waits for event */
int gpo_event_sync(void * event);                       /* host waits for event */
void gpo_event_release(void * event);

void gpo_free(void * p);

#ifdef __cplusplus
}
#endif

#endif
