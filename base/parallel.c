#include "mo_base.h"

#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

#define MAX_WORKERS 64

struct chunk {
	void (*fn)(void *, uint64_t, uint64_t);
	void *ctx;
	uint64_t begin, end;
};

/* Set while a thread runs a chunk: a parallel loop inside a chunk runs on
 * its own thread, so nested loops never multiply the threads. */
static _Thread_local bool in_chunk;

static void *run_chunk(void *arg)
{
	struct chunk *c = arg;
	bool was = in_chunk;
	in_chunk = true;
	c->fn(c->ctx, c->begin, c->end);
	in_chunk = was;
	return NULL;
}

void mo_parallel_for(uint64_t n, uint64_t min_per_thread, int max_threads,
		     void (*fn)(void *ctx, uint64_t begin, uint64_t end), void *ctx)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int t = cpus > 0 ? (int)cpus : 1;
	if (max_threads > 0 && t > max_threads)
		t = max_threads;
	if (t > MAX_WORKERS)
		t = MAX_WORKERS;
	if (min_per_thread == 0)
		min_per_thread = 1;
	if ((uint64_t)t > n / min_per_thread)
		t = (int)(n / min_per_thread);
	if (in_chunk)
		t = 1;
	if (t <= 1) {
		if (n)
			fn(ctx, 0, n);
		return;
	}
	struct chunk c[MAX_WORKERS];
	pthread_t th[MAX_WORKERS];
	bool started[MAX_WORKERS];
	for (int i = 0; i < t; i++) {
		c[i] = (struct chunk){ fn, ctx, n * (uint64_t)i / (uint64_t)t,
				       n * (uint64_t)(i + 1) / (uint64_t)t };
		/* chunk 0 runs here; the others on threads, or here if that fails */
		started[i] = i > 0 && pthread_create(&th[i], NULL, run_chunk, &c[i]) == 0;
	}
	for (int i = 0; i < t; i++)
		if (!started[i])
			run_chunk(&c[i]);
	for (int i = 1; i < t; i++)
		if (started[i])
			pthread_join(th[i], NULL);
}
