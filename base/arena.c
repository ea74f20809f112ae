#include "mo_base.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

struct mo_arena_block {
	struct mo_arena_block *prev;
	size_t size, used;
	max_align_t data[];
};

enum { BLOCK_MIN = 64 * 1024 };

void mo_arena_init(struct mo_arena *a)
{
	a->head = NULL;
	a->failed = 0;
}

void mo_arena_free(struct mo_arena *a)
{
	struct mo_arena_block *b = a->head;
	while (b) {
		struct mo_arena_block *prev = b->prev;
		mo_free(b);
		b = prev;
	}
	a->head = NULL;
}

void *mo_arena_alloc(struct mo_arena *a, size_t n)
{
	if (a->failed)
		return NULL;
	size_t align = sizeof(max_align_t);
	if (n > SIZE_MAX - align) {
		a->failed = 1;
		return NULL;
	}
	n = (n + align - 1) / align * align;
	struct mo_arena_block *b = a->head;
	if (!b || b->size - b->used < n) {
		size_t size = n > BLOCK_MIN ? n : BLOCK_MIN;
		if (size > SIZE_MAX - sizeof *b) {
			a->failed = 1;
			return NULL;
		}
		b = mo_malloc(sizeof *b + size);
		if (!b) {
			a->failed = 1;
			return NULL;
		}
		b->prev = a->head;
		b->size = size;
		b->used = 0;
		a->head = b;
	}
	void *p = (char *)b->data + b->used;
	b->used += n;
	memset(p, 0, n);
	return p;
}

void *mo_arena_array(struct mo_arena *a, size_t count, size_t size)
{
	if (size && count > SIZE_MAX / size) {
		a->failed = 1;
		return NULL;
	}
	return mo_arena_alloc(a, count * size);
}

char *mo_arena_strdup(struct mo_arena *a, const char *s)
{
	size_t n = strlen(s) + 1;
	char *c = mo_arena_alloc(a, n);
	if (c)
		memcpy(c, s, n);
	return c;
}

char *mo_arena_printf(struct mo_arena *a, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return NULL;
	char *s = mo_arena_alloc(a, (size_t)n + 1);
	if (!s)
		return NULL;
	va_start(ap, fmt);
	vsnprintf(s, (size_t)n + 1, fmt, ap);
	va_end(ap);
	return s;
}

struct mo_arena_mark mo_arena_mark(const struct mo_arena *a)
{
	return (struct mo_arena_mark){ a->head, a->head ? a->head->used : 0 };
}

void mo_arena_rewind(struct mo_arena *a, struct mo_arena_mark m)
{
	while (a->head && a->head != m.block) {
		struct mo_arena_block *prev = a->head->prev;
		mo_free(a->head);
		a->head = prev;
	}
	if (a->head)
		a->head->used = m.used;
	a->failed = 0;
}
