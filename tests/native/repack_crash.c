/* LD_PRELOAD shim for the tests: makes llama.cpp crash the way it does on CPUs with AMX
 * (llama.cpp issue 20824), on any machine.
 *
 * A model loaded with extra buffer types (use_extra_bufts = true: repacked weights) asks the CPU
 * backend for `ggml_backend_dev_get_extra_bufts`; this shim notes that, and the process's next
 * graph computation dies by SIGSEGV. A model loaded without repacking never asks, so it runs.
 * Both calls go from libllama to libggml-base through the PLT, where LD_PRELOAD interposes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <string.h>

static int repacked = 0;

/* libggml-base is loaded by ctypes' dlopen (a local scope), so RTLD_NEXT does not see it. */
static void *real_symbol(const char *name) {
    void *sym = dlsym(RTLD_NEXT, name);
    const char *libs[] = {"libggml-base.so.0", "libggml-base.so", "libggml-base.dylib", 0};
    for (int i = 0; !sym && libs[i]; i++) {
        void *lib = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
        if (lib) sym = dlsym(lib, name);
    }
    return sym;
}

void *ggml_backend_reg_get_proc_address(void *reg, const char *name) {
    static void *(*real)(void *, const char *) = 0;
    if (!real) real = (void *(*)(void *, const char *))real_symbol("ggml_backend_reg_get_proc_address");
    if (name && strcmp(name, "ggml_backend_dev_get_extra_bufts") == 0) repacked = 1;
    return real(reg, name);
}

int ggml_backend_sched_graph_compute_async(void *sched, void *graph) {
    static int (*real)(void *, void *) = 0;
    if (!real) real = (int (*)(void *, void *))real_symbol("ggml_backend_sched_graph_compute_async");
    if (repacked) raise(SIGSEGV);
    return real(sched, graph);
}
