/*
 * A stand-in for Nsight Systems' NVTX injection library, for tests/nvtx.rs.
 *
 * NVTX3's injection side (spoken by liboxccl_profiler.so, plugins/profiler/src/
 * nvtx.rs) dlopens the library named by NVTX_INJECTION64_PATH at the first NVTX call and calls its
 * InitializeInjectionNvtx2 with a getter of export tables. This library asks
 * for the callbacks table, takes the function tables of the CORE and CORE2
 * modules, and puts its own handlers in the slots the profiler can reach:
 * domain creation, registered strings, domain and global start/end ranges,
 * and push/pop (which the profiler must not use). Each call becomes one line
 * in the file named by OXCCL_NVTX_LOG:
 *
 *   init
 *   domain <name>
 *   string <domain> <text>
 *   start <domain> registered|ascii|other <message> <id>
 *   end <domain> <id>
 *   global-start <message> <id> | global-end <id> | push <domain> | pop <domain>
 *
 * The ids and layouts below are NVTX's injection ABI, written out here rather
 * than included. They are documented in NVIDIA's NVTX repository
 * (github.com/NVIDIA/NVTX, c/include/nvtx3/, also shipped in the nvtx-sys
 * crate): NvtxExportTableID, NvtxCallbackModule, NvtxCallbackIdCore,
 * NvtxCallbackIdCore2, NvtxExportTableCallbacks and NvtxFunctionTable in
 * nvtxDetail/nvtxTypes.h; nvtxEventAttributes_v2 and nvtxMessageType_t in
 * nvToolsExt.h. They are append-only by NVTX's own rule ("new constants must
 * only be added directly above this line").
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NvtxExportTableID */
#define ETID_CALLBACKS 1

/* NvtxCallbackModule */
#define MODULE_CORE 1
#define MODULE_CORE2 5

/* NvtxCallbackIdCore */
#define CORE_RANGE_START_EX 4
#define CORE_RANGE_START_A 5
#define CORE_RANGE_END 7
#define CORE_RANGE_PUSH_EX 8
#define CORE_RANGE_PUSH_A 9
#define CORE_RANGE_POP 11

/* NvtxCallbackIdCore2 */
#define CORE2_DOMAIN_RANGE_START_EX 2
#define CORE2_DOMAIN_RANGE_END 3
#define CORE2_DOMAIN_RANGE_PUSH_EX 4
#define CORE2_DOMAIN_RANGE_POP 5
#define CORE2_DOMAIN_REGISTER_STRING_A 10
#define CORE2_DOMAIN_CREATE_A 12

/* nvtxMessageType_t */
#define MESSAGE_TYPE_ASCII 1
#define MESSAGE_TYPE_REGISTERED 3

typedef void (*fn_ptr)(void);
/* NvtxFunctionTable: an array of pointers to NVTX's function-pointer slots,
 * indexed by callback id (0 is the invalid id). */
typedef fn_ptr **function_table;

/* NvtxExportTableCallbacks */
typedef struct {
    size_t struct_size;
    int (*get_module_function_table)(int module, function_table *out_table,
                                     unsigned int *out_size);
} export_table_callbacks;

typedef const void *(*get_export_table_fn)(uint32_t export_table_id);

/* nvtxEventAttributes_v2 */
typedef struct {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type;
    int32_t reserved0;
    uint64_t payload;
    int32_t message_type;
    union {
        const char *ascii;
        const void *unicode;
        const void *registered;
    } message;
} event_attributes;

/* Handles given back to NVTX: a domain is its name, a registered string
 * its text (both copied, kept for the process's life). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static uint64_t next_id;

#define LOG(...)                              \
    do {                                      \
        pthread_mutex_lock(&lock);            \
        if (out) {                            \
            fprintf(out, __VA_ARGS__);        \
            fputc('\n', out);                 \
            fflush(out);                      \
        }                                     \
        pthread_mutex_unlock(&lock);          \
    } while (0)

static const char *domain_name(const void *domain) {
    return domain ? (const char *)domain : "(default)";
}

static void message(const event_attributes *a, const char **kind, const char **text) {
    *kind = "other";
    *text = "?";
    if (!a) return;
    if (a->message_type == MESSAGE_TYPE_REGISTERED && a->message.registered) {
        *kind = "registered";
        *text = (const char *)a->message.registered;
    } else if (a->message_type == MESSAGE_TYPE_ASCII && a->message.ascii) {
        *kind = "ascii";
        *text = a->message.ascii;
    }
}

static void *domain_create_a(const char *name) {
    LOG("domain %s", name ? name : "(null)");
    return name ? strdup(name) : NULL;
}

static void *domain_register_string_a(const void *domain, const char *s) {
    LOG("string %s %s", domain_name(domain), s ? s : "(null)");
    return s ? strdup(s) : NULL;
}

static uint64_t domain_range_start_ex(const void *domain, const event_attributes *a) {
    const char *kind, *text;
    uint64_t id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    message(a, &kind, &text);
    LOG("start %s %s %s %llu", domain_name(domain), kind, text, (unsigned long long)id);
    return id;
}

static void domain_range_end(const void *domain, uint64_t id) {
    LOG("end %s %llu", domain_name(domain), (unsigned long long)id);
}

static int domain_range_push_ex(const void *domain, const event_attributes *a) {
    (void)a;
    LOG("push %s", domain_name(domain));
    return 0;
}

static int domain_range_pop(const void *domain) {
    LOG("pop %s", domain_name(domain));
    return 0;
}

static uint64_t range_start_ex(const event_attributes *a) {
    const char *kind, *text;
    uint64_t id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    message(a, &kind, &text);
    LOG("global-start %s %llu", text, (unsigned long long)id);
    return id;
}

static uint64_t range_start_a(const char *s) {
    uint64_t id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    LOG("global-start %s %llu", s ? s : "(null)", (unsigned long long)id);
    return id;
}

static void range_end(uint64_t id) { LOG("global-end %llu", (unsigned long long)id); }

static int range_push_ex(const event_attributes *a) {
    (void)a;
    LOG("push (default)");
    return 0;
}

static int range_push_a(const char *s) {
    (void)s;
    LOG("push (default)");
    return 0;
}

static int range_pop(void) {
    LOG("pop (default)");
    return 0;
}

/* Puts `handler` in slot `id` of `module`; 0 when NVTX has no such slot. */
static int attach(const export_table_callbacks *cb, int module, unsigned id, fn_ptr handler) {
    function_table table = NULL;
    unsigned int size = 0;
    if (!cb->get_module_function_table(module, &table, &size) || !table) return 0;
    /* `size` is the highest valid id (slot 0 is the invalid id). */
    if (id == 0 || id > size || !table[id]) return 0;
    *table[id] = handler;
    return 1;
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(get_export_table_fn get) {
    const char *path = getenv("OXCCL_NVTX_LOG");
    const export_table_callbacks *cb;
    int ok = 1;
    if (!path || !get) return 0;
    cb = (const export_table_callbacks *)get(ETID_CALLBACKS);
    if (!cb || cb->struct_size < sizeof(*cb) || !cb->get_module_function_table) return 0;
    out = fopen(path, "a");
    if (!out) return 0;
    ok &= attach(cb, MODULE_CORE2, CORE2_DOMAIN_CREATE_A, (fn_ptr)domain_create_a);
    ok &= attach(cb, MODULE_CORE2, CORE2_DOMAIN_REGISTER_STRING_A, (fn_ptr)domain_register_string_a);
    ok &= attach(cb, MODULE_CORE2, CORE2_DOMAIN_RANGE_START_EX, (fn_ptr)domain_range_start_ex);
    ok &= attach(cb, MODULE_CORE2, CORE2_DOMAIN_RANGE_END, (fn_ptr)domain_range_end);
    ok &= attach(cb, MODULE_CORE2, CORE2_DOMAIN_RANGE_PUSH_EX, (fn_ptr)domain_range_push_ex);
    ok &= attach(cb, MODULE_CORE2, CORE2_DOMAIN_RANGE_POP, (fn_ptr)domain_range_pop);
    ok &= attach(cb, MODULE_CORE, CORE_RANGE_START_EX, (fn_ptr)range_start_ex);
    ok &= attach(cb, MODULE_CORE, CORE_RANGE_START_A, (fn_ptr)range_start_a);
    ok &= attach(cb, MODULE_CORE, CORE_RANGE_END, (fn_ptr)range_end);
    ok &= attach(cb, MODULE_CORE, CORE_RANGE_PUSH_EX, (fn_ptr)range_push_ex);
    ok &= attach(cb, MODULE_CORE, CORE_RANGE_PUSH_A, (fn_ptr)range_push_a);
    ok &= attach(cb, MODULE_CORE, CORE_RANGE_POP, (fn_ptr)range_pop);
    LOG("%s", ok ? "init" : "init-incomplete");
    return ok;
}
