#include "mo_base.h"

#include <stdint.h>
#include <string.h>

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

void mo_strmap_free(struct mo_strmap *m)
{
	mo_free(m->keys);
	mo_free(m->vals);
	*m = (struct mo_strmap){ 0 };
}

static size_t slot(const struct mo_strmap *m, const char *k)
{
	size_t i = hash_str(k) & (m->cap - 1);
	while (m->keys[i] && strcmp(m->keys[i], k) != 0)
		i = (i + 1) & (m->cap - 1);
	return i;
}

const int *mo_strmap_get(const struct mo_strmap *m, const char *k)
{
	if (!m->cap)
		return NULL;
	size_t i = slot(m, k);
	return m->keys[i] ? &m->vals[i] : NULL;
}

static int grow(struct mo_strmap *m)
{
	size_t cap = m->cap ? m->cap * 2 : 64;
	struct mo_strmap g = { mo_calloc(cap, sizeof *g.keys),
			       mo_calloc(cap, sizeof *g.vals), cap, 0 };
	if (!g.keys || !g.vals) {
		mo_strmap_free(&g);
		return 0;
	}
	for (size_t i = 0; i < m->cap; i++) {
		if (m->keys[i]) {
			size_t j = slot(&g, m->keys[i]);
			g.keys[j] = m->keys[i];
			g.vals[j] = m->vals[i];
			g.n++;
		}
	}
	mo_strmap_free(m);
	*m = g;
	return 1;
}

int mo_strmap_put(struct mo_strmap *m, const char *k, int v, int *had)
{
	if ((m->n + 1) * 2 > m->cap && !grow(m))
		return 0;
	size_t i = slot(m, k);
	*had = m->keys[i] != NULL;
	if (!*had) {
		m->keys[i] = k;
		m->vals[i] = v;
		m->n++;
	}
	return 1;
}

bool mo_nameset_add(struct mo_nameset *s, const char *name)
{
	int had;
	if (!mo_strmap_put(&s->seen, name, 0, &had))
		return false;
	if (had)
		return true;
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 16;
		const char **v = mo_realloc(s->v, cap * sizeof *v);
		if (!v)
			return false;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = name;
	return true;
}

void mo_nameset_free(struct mo_nameset *s)
{
	mo_free(s->v);
	mo_strmap_free(&s->seen);
}
