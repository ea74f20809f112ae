#include "mo_base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void mo_diag_init(struct mo_diag *d)
{
	d->status = MO_OK;
	d->msg[0] = '\0';
}

enum mo_status mo_diag_vset(struct mo_diag *d, enum mo_status status,
			    const char *fmt, va_list ap)
{
	if (d->status == MO_OK) {
		d->status = status;
		vsnprintf(d->msg, sizeof d->msg, fmt, ap);
		/* One line per error, whatever a file name contains. */
		for (char *c = d->msg; *c; c++)
			if (*c == '\n' || *c == '\r')
				*c = ' ';
	}
	return status;
}

enum mo_status mo_diag_set(struct mo_diag *d, enum mo_status status,
			   const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	mo_diag_vset(d, status, fmt, ap);
	va_end(ap);
	return status;
}

double mo_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t mo_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

uint64_t mo_fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

void mo_progressf(void (*fn)(void *ctx, const char *line), void *ctx, const char *fmt, ...)
{
	if (!fn)
		return;
	/* most lines fit; a longer one (the unbound symbols and their
	 * buckets) is said whole, cut only when out of memory */
	char buf[512], *line = buf;
	va_list ap, aq;
	va_start(ap, fmt);
	va_copy(aq, ap);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n >= (int)sizeof buf && (line = mo_malloc((size_t)n + 1)) != NULL)
		vsnprintf(line, (size_t)n + 1, fmt, aq);
	va_end(aq);
	fn(ctx, line ? line : buf);
	if (line != buf)
		mo_free(line);
}

enum mo_status mo_diag_nomem(struct mo_diag *d)
{
	return mo_diag_set(d, MO_ERR_NOMEM, "out of memory");
}

const char *mo_status_name(enum mo_status s)
{
	switch (s) {
	case MO_OK: return "ok";
	case MO_ERR_INPUT: return "bad input";
	case MO_ERR_USAGE: return "usage error";
	case MO_ERR_NOMEM: return "out of memory";
	case MO_ERR_INTERNAL: return "internal error";
	case MO_ERR_UNSUPPORTED: return "unsupported";
	}
	return "unknown status";
}

static unsigned long alloc_count;
static unsigned long alloc_fail_at;

/* Atomic: evaluators allocate from worker threads. */
static int alloc_should_fail(void)
{
	unsigned long c = __atomic_add_fetch(&alloc_count, 1, __ATOMIC_RELAXED);
	return alloc_fail_at != 0 && c >= alloc_fail_at;
}

unsigned long mo_alloc_fail_after(unsigned long n)
{
	unsigned long made = alloc_count;
	alloc_count = 0;
	alloc_fail_at = n;
	return made;
}

static unsigned long alloc_failures;

void mo_note_nomem(void)
{
	__atomic_add_fetch(&alloc_failures, 1, __ATOMIC_RELAXED);
}

unsigned long mo_alloc_failures(void)
{
	return __atomic_load_n(&alloc_failures, __ATOMIC_RELAXED);
}

static void *counted(void *p)
{
	if (!p)
		mo_note_nomem();
	return p;
}

void *mo_malloc(size_t n)
{
	return counted(alloc_should_fail() ? NULL : malloc(n ? n : 1));
}

void *mo_calloc(size_t count, size_t size)
{
	return counted(alloc_should_fail() ? NULL : calloc(count ? count : 1, size ? size : 1));
}

void *mo_realloc(void *p, size_t n)
{
	return counted(alloc_should_fail() ? NULL : realloc(p, n ? n : 1));
}

void mo_free(void *p)
{
	free(p);
}

char *mo_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *c = mo_malloc(n);
	if (c)
		memcpy(c, s, n);
	return c;
}
