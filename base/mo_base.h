/* mo_base: status codes, the diagnostics context and the allocation hook that
 * every stage of mirage-onnx shares. */
#ifndef MO_BASE_H
#define MO_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* What a fallible function returns. The message, if any, is in the caller's
 * struct mo_diag. The CLI maps them onto its exit codes in one place
 * (exit_for in cli/main.c): several statuses share a code. */
enum mo_status {
	MO_OK = 0,
	MO_ERR_INPUT,    /* the model or a path the user gave is unusable */
	MO_ERR_USAGE,    /* the command line is wrong */
	MO_ERR_NOMEM,    /* an allocation failed */
	MO_ERR_INTERNAL, /* a bug in mirage-onnx */
	MO_ERR_UNSUPPORTED, /* valid input that this tool cannot handle (yet) */
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

/* Seconds on the monotonic clock, for timing stages and budgets. */
double mo_seconds(void);

/* A 64-bit mixer (the splitmix64 finalizer): every hash of the verifier and
 * the search is built on it, so that they are the same on every machine. */
uint64_t mo_mix64(uint64_t x);

/* FNV-1a over n bytes, continuing from h (start from MO_FNV_OFFSET): the
 * result cache's keys and the model hash in generated files. */
#define MO_FNV_OFFSET 0xcbf29ce484222325ull
uint64_t mo_fnv(uint64_t h, const void *p, size_t n);

/* A progress line for a long stage: formats it and hands it to fn (nothing
 * when fn is NULL). Lines longer than 512 bytes are cut. */
void mo_progressf(void (*fn)(void *ctx, const char *line), void *ctx, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

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

/* Allocations that failed so far in the process, injected ones included, and
 * those a library reported through mo_note_nomem. Work that swallows an
 * allocation failure (a search skipping a candidate it could not build)
 * compares the count before and after, so running out of memory is said as
 * such and not mistaken for a poorer result. */
unsigned long mo_alloc_failures(void);
void mo_note_nomem(void);

/* A map from strings to ints; keys are borrowed (they must outlive the map).
 * Allocation failure makes put return false. */
struct mo_strmap {
	const char **keys;
	int *vals;
	size_t cap, n;
};
void mo_strmap_free(struct mo_strmap *m);
const int *mo_strmap_get(const struct mo_strmap *m, const char *key);
/* Inserts key -> val unless key is present; *had says which happened. */
int mo_strmap_put(struct mo_strmap *m, const char *key, int val, int *had);

/* Names in the order first added, each once (the strings are borrowed). */
struct mo_nameset {
	const char **v;
	size_t n, cap;
	struct mo_strmap seen;
};
/* False when out of memory. */
bool mo_nameset_add(struct mo_nameset *s, const char *name);
void mo_nameset_free(struct mo_nameset *s);

/* Runs fn(ctx, begin, end) over [0, n) split into contiguous chunks, one per
 * worker thread (as many as online CPUs, at most `max_threads` if > 0), and
 * waits. Falls back to the calling thread for small n or if threads cannot
 * be started. Deterministic: each index is handled exactly once. A loop
 * started inside another's chunk runs serially on that chunk's thread. */
void mo_parallel_for(uint64_t n, uint64_t min_per_thread, int max_threads,
		     void (*fn)(void *ctx, uint64_t begin, uint64_t end), void *ctx);

/* A bump allocator for IR lifetimes: everything allocated from it is freed at
 * once. mark/rewind give scratch space (the search's). Allocation failure is
 * sticky: once an allocation fails, `failed` stays set and later calls return
 * NULL, so callers may check once at a boundary. */
struct mo_arena_block;
struct mo_arena {
	struct mo_arena_block *head;
	int failed;
};
struct mo_arena_mark {
	struct mo_arena_block *block;
	size_t used;
};

void mo_arena_init(struct mo_arena *a);
void mo_arena_free(struct mo_arena *a);
/* Zeroed memory aligned for any type; NULL (and a->failed) on failure. */
void *mo_arena_alloc(struct mo_arena *a, size_t n);
/* Zeroed array of count elements, with overflow checked. */
void *mo_arena_array(struct mo_arena *a, size_t count, size_t size);
char *mo_arena_strdup(struct mo_arena *a, const char *s);
char *mo_arena_printf(struct mo_arena *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
struct mo_arena_mark mo_arena_mark(const struct mo_arena *a);
void mo_arena_rewind(struct mo_arena *a, struct mo_arena_mark m);

/* Writing files safely. Every file the tool writes is made exclusively
 * (mkstemp: O_CREAT|O_EXCL, never through an existing name or a symlink
 * planted there) as a temporary in its destination's folder, filled, then
 * renamed over the destination (rename replaces a symlink, it does not
 * follow it). A temporary is on the cleanup list below until it is
 * committed or discarded, so a signal does not leave it behind.
 *
 * mo_file_create_temp: the temporary for `dest` ("DIR/.BASE.tmp.XXXXXX"),
 * its name in *tmp_path (mo_free it), its descriptor returned (mode
 * 0666 & ~umask, like any new file); -1 with the reason in d (MO_ERR_INPUT
 * naming dest, or MO_ERR_NOMEM). dest must not be a folder.
 * mo_file_commit_temp: fsyncs and closes fd (when fd >= 0), renames tmp_path
 * over dest; on failure removes the temporary and says why in d. Frees
 * tmp_path either way.
 * mo_file_discard_temp: closes fd (when >= 0), removes and frees tmp_path.
 * Both accept tmp_path NULL (nothing to do). */
int mo_file_create_temp(const char *dest, char **tmp_path, struct mo_diag *d);
enum mo_status mo_file_commit_temp(int fd, char *tmp_path, const char *dest, struct mo_diag *d);
void mo_file_discard_temp(int fd, char *tmp_path);

/* The same through stdio, for text writers: mo_file_open gives a FILE open
 * for writing on a fresh temporary for dest; mo_file_commit checks the
 * stream for write errors, flushes, renames into place and frees f (on
 * failure nothing is left at dest's temporary name and d says why);
 * mo_file_discard drops it. */
struct mo_file {
	FILE *f;
	char *tmp_path;
	char *dest;
};
enum mo_status mo_file_open(struct mo_file *mf, const char *dest, struct mo_diag *d);
enum mo_status mo_file_commit(struct mo_file *mf, struct mo_diag *d);
void mo_file_discard(struct mo_file *mf);

/* Writes len bytes to dest through the above; one call. */
enum mo_status mo_file_write_all(const char *dest, const void *data, size_t len, struct mo_diag *d);

/* The cleanup list: temporary files and folders and child processes that
 * must not outlive the tool, whatever way it ends. mo_cleanup_install sets
 * handlers for SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGPIPE (and ignores
 * SIGXFSZ: such a write fails with EFBIG instead) that kill the listed
 * children's process groups (and reap them), remove the listed files and
 * folders (a folder with its files, two levels deep) with async-signal-safe
 * calls only, then re-raise the signal with its default action. Adding
 * fails (false) only when the list is full (64 of each) or a path is too
 * long; the thing is then simply not cleaned on a signal. Safe from any
 * thread. */
void mo_cleanup_install(void);
bool mo_cleanup_add_file(const char *path);
bool mo_cleanup_add_dir(const char *path);
void mo_cleanup_remove_path(const char *path); /* no longer ours to clean */
bool mo_cleanup_add_child(int pid);           /* pid leads its own process group */
void mo_cleanup_remove_child(int pid);
/* Removes a folder with its files (two levels), as the signal path does. */
void mo_remove_tree(const char *dir);

/* Whether two paths name the same file (device and inode); false when
 * either does not exist. */
bool mo_same_file(const char *a, const char *b);

#endif
