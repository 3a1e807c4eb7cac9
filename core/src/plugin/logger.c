/* NCCL's plugin logger is a C variadic function (ncclDebugLogger_t).
 * Stable Rust cannot define one, so this shim formats the message with
 * vsnprintf and hands the finished text to a sink registered by the core
 * (a plain Rust extern "C" function that logs through `tracing`). */
#include <stdarg.h>
#include <stdio.h>

typedef void (*oxccl_log_sink_t)(int level, unsigned long subsys, const char *file, int line,
                                 const char *msg);

static oxccl_log_sink_t sink;

void oxccl_plugin_log_set_sink(oxccl_log_sink_t s) { __atomic_store_n(&sink, s, __ATOMIC_RELEASE); }

void oxccl_plugin_log(int level, unsigned long subsys, const char *file, int line, const char *fmt,
                      ...) {
  oxccl_log_sink_t s = __atomic_load_n(&sink, __ATOMIC_ACQUIRE);
  if (s == NULL || fmt == NULL) return;
  /* NCCL truncates its log lines at 1024 bytes as well. */
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  s(level, subsys, file, line, buf);
}
