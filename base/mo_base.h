/* mo_base: status codes, the diagnostics context and the allocation hook that
 * every stage of mirage-onnx shares. */
#ifndef MO_BASE_H
#define MO_BASE_H

#include <stddef.h>
#include <stdarg.h>

/* What a fallible function returns. The message, if any, is in the caller's
 * struct mo_diag. The values map one-to-one onto the CLI's exit codes. */
enum mo_status {
	MO_OK = 0,
	MO_ERR_INPUT,    /* the model or a path the user gave is unusable */
	MO_ERR_USAGE,    /* the command line is wrong */
	MO_ERR_NOMEM,    /* an allocation failed */
	MO_ERR_INTERNAL, /* a bug in mirage-onnx */
};

/* Keeps the first error reported into it (as SQLite's parse context does):
 * later errors are usually consequences of the first one. */
struct mo_diag {
	enum mo_status status;
	char msg[512];
};

void mo_diag_init(struct mo_diag *d);
/* Records the error if none is recorded yet; returns `status` so callers can
 * write `return mo_diag_set(d, MO_ERR_INPUT, "...")`. */
enum mo_status mo_diag_set(struct mo_diag *d, enum mo_status status,
			   const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
enum mo_status mo_diag_vset(struct mo_diag *d, enum mo_status status,
			    const char *fmt, va_list ap);
enum mo_status mo_diag_nomem(struct mo_diag *d);
const char *mo_status_name(enum mo_status s);

/* Every allocation of the tool goes through these, so that tests can make
 * the n-th allocation fail and check that nothing leaks or crashes. */
void *mo_malloc(size_t n);
void *mo_calloc(size_t count, size_t size);
void *mo_realloc(void *p, size_t n);
void mo_free(void *p);
char *mo_strdup(const char *s);

/* Test hook: allocation number `n` (counting from 1 after the call) and every
 * later one fail; 0 turns failure injection off. Returns the number of
 * allocations made since the previous call. */
unsigned long mo_alloc_fail_after(unsigned long n);

#endif
