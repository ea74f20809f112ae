/* Exclusive creation of every file the tool writes, and the cleanup list that
 * a signal handler empties. The handler may run at any instruction of any
 * thread, so the list is fixed slots claimed with atomic operations, and the
 * handler uses only async-signal-safe system calls (no stdio, no malloc, no
 * opendir). */
#define _GNU_SOURCE
#include "mo_base.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define SLOTS 64
#define SLOT_PATH 4096

enum { SLOT_FREE, SLOT_BUSY, SLOT_FILE, SLOT_DIR };

struct path_slot {
	int state;
	char path[SLOT_PATH];
};

static struct path_slot paths[SLOTS];
static int children[SLOTS]; /* 0: free */

/* ---- removing a folder with system calls only ---- */

struct dirent64_raw {
	uint64_t ino;
	int64_t off;
	unsigned short reclen;
	unsigned char type;
	char name[];
};

/* Empties the folder open as fd, `depth` levels of subfolders; the entries
 * are read again after each pass, since removing while reading may skip. */
static void empty_dir_fd(int fd, int depth)
{
	char buf[4096] __attribute__((aligned(8)));
	for (int pass = 0; pass < 64; pass++) {
		bool removed = false;
		if (lseek(fd, 0, SEEK_SET) < 0)
			return;
		long n;
		while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
			for (long at = 0; at < n;) {
				struct dirent64_raw *e = (struct dirent64_raw *)(buf + at);
				at += e->reclen;
				const char *nm = e->name;
				if (nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2])))
					continue;
				if (unlinkat(fd, nm, 0) == 0) {
					removed = true;
					continue;
				}
				if (depth <= 0)
					continue;
				int sub = openat(fd, nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
				if (sub < 0)
					continue;
				empty_dir_fd(sub, depth - 1);
				close(sub);
				if (unlinkat(fd, nm, AT_REMOVEDIR) == 0)
					removed = true;
			}
		}
		if (!removed)
			return;
	}
}

void mo_remove_tree(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return;
	empty_dir_fd(fd, 2);
	close(fd);
	rmdir(dir);
}

/* ---- the cleanup list ---- */

static bool add_path(const char *path, int kind)
{
	size_t n = strlen(path);
	if (n >= SLOT_PATH)
		return false;
	for (int i = 0; i < SLOTS; i++) {
		int want = SLOT_FREE;
		if (__atomic_compare_exchange_n(&paths[i].state, &want, SLOT_BUSY, false,
						__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			memcpy(paths[i].path, path, n + 1);
			__atomic_store_n(&paths[i].state, kind, __ATOMIC_RELEASE);
			return true;
		}
	}
	return false;
}

bool mo_cleanup_add_file(const char *path)
{
	return add_path(path, SLOT_FILE);
}

bool mo_cleanup_add_dir(const char *path)
{
	return add_path(path, SLOT_DIR);
}

void mo_cleanup_remove_path(const char *path)
{
	for (int i = 0; i < SLOTS; i++) {
		int s = __atomic_load_n(&paths[i].state, __ATOMIC_ACQUIRE);
		if ((s == SLOT_FILE || s == SLOT_DIR) && strcmp(paths[i].path, path) == 0 &&
		    __atomic_compare_exchange_n(&paths[i].state, &s, SLOT_FREE, false,
						__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return;
	}
}

bool mo_cleanup_add_child(int pid)
{
	for (int i = 0; i < SLOTS; i++) {
		int want = 0;
		if (__atomic_compare_exchange_n(&children[i], &want, pid, false, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE))
			return true;
	}
	return false;
}

void mo_cleanup_remove_child(int pid)
{
	for (int i = 0; i < SLOTS; i++) {
		int want = pid;
		if (__atomic_compare_exchange_n(&children[i], &want, 0, false, __ATOMIC_ACQ_REL,
						__ATOMIC_ACQUIRE))
			return;
	}
}

static void on_signal(int sig)
{
	int saved = errno;
	for (int i = 0; i < SLOTS; i++) {
		int pid = __atomic_load_n(&children[i], __ATOMIC_ACQUIRE);
		if (pid > 0) {
			kill(-pid, SIGKILL);
			kill(pid, SIGKILL);
		}
	}
	/* a killed compiler writes nothing more into the folders removed next */
	for (int i = 0; i < SLOTS; i++) {
		int pid = __atomic_load_n(&children[i], __ATOMIC_ACQUIRE);
		if (pid > 0)
			while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
				;
	}
	for (int i = 0; i < SLOTS; i++) {
		int s = __atomic_load_n(&paths[i].state, __ATOMIC_ACQUIRE);
		if (s == SLOT_FILE) {
			unlink(paths[i].path);
		} else if (s == SLOT_DIR) {
			int fd = open(paths[i].path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (fd >= 0) {
				empty_dir_fd(fd, 2);
				close(fd);
			}
			rmdir(paths[i].path);
		}
	}
	errno = saved;
	/* The default action again (SA_RESETHAND is not enough: Z3 saves and
	 * restores the SIGINT handler around its solver calls, without our
	 * flags); the signal is blocked until this handler returns, and then
	 * ends the process as it would have without us. */
	struct sigaction dfl;
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	sigaction(sig, &dfl, NULL);
	raise(sig);
}

static mode_t file_mode = 0644;
static pthread_once_t mode_once = PTHREAD_ONCE_INIT;

/* 0666 & ~umask, read once: umask can only be read by setting it, which is
 * racy once threads create files. */
static void read_umask(void)
{
	mode_t m = umask(0);
	umask(m);
	file_mode = 0666 & ~m;
}

void mo_cleanup_install(void)
{
	pthread_once(&mode_once, read_umask);
	static const int sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE };
	for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
		struct sigaction old, sa;
		/* a signal ignored by whoever started us stays ignored */
		if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
			continue;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = on_signal;
		sigfillset(&sa.sa_mask);
		sa.sa_flags = SA_RESETHAND;
		sigaction(sigs[i], &sa, NULL);
	}
	/* a write past the file size limit (ulimit -f) fails with EFBIG and is
	 * said as such, instead of the signal killing us mid-write; compilers
	 * inherit this and say "File too large" */
	signal(SIGXFSZ, SIG_IGN);
}

/* ---- exclusive creation ---- */

/* What is at dest when a rename onto it would replace something other
 * than a file: a device, a pipe or a socket (-o /dev/null, run as root,
 * would leave a regular file there), or a folder; NULL when nothing or a
 * regular file is there, or a symlink (replaced, never written through). */
static const char *not_a_file(const char *dest)
{
	struct stat st;
	if (lstat(dest, &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode))
		return NULL;
	mode_t m = st.st_mode;
	return S_ISDIR(m) ? "a folder" : S_ISCHR(m) ? "a character device" :
	       S_ISBLK(m) ? "a block device" : S_ISFIFO(m) ? "a named pipe" :
	       S_ISSOCK(m) ? "a socket" : "not a file";
}

int mo_file_create_temp(const char *dest, char **tmp_path, struct mo_diag *d)
{
	*tmp_path = NULL;
	pthread_once(&mode_once, read_umask);
	if (!*dest)
		return mo_diag_set(d, MO_ERR_INPUT, "output path is empty"), -1;
	struct stat st;
	if (stat(dest, &st) == 0 && S_ISDIR(st.st_mode))
		return mo_diag_set(d, MO_ERR_INPUT, "%s: is a folder; give a file name", dest), -1;
	/* the rename at the end replaces whatever is at dest */
	const char *kind = not_a_file(dest);
	if (kind)
		return mo_diag_set(d, MO_ERR_INPUT, "%s: not a regular file (%s); give a file name",
				   dest, kind), -1;
	/* in the destination's folder, so that rename() is atomic */
	const char *slash = strrchr(dest, '/');
	size_t dirlen = slash ? (size_t)(slash - dest) + 1 : 0;
	const char *base = dest + dirlen;
	size_t blen = strlen(base);
	if (blen > 200) /* room for the suffix within NAME_MAX */
		blen = 200;
	size_t n = dirlen + blen + 32;
	char *t = mo_malloc(n);
	if (!t)
		return mo_diag_nomem(d), -1;
	snprintf(t, n, "%.*s.%.*s.tmp.XXXXXX", (int)dirlen, dest, (int)blen, base);
	int fd = mkostemp(t, O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		if (e == ENOENT)
			mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: folder '%.*s' does not exist",
				    dest, dirlen > 1 ? (int)dirlen - 1 : (int)dirlen, dest);
		else
			mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", dest, strerror(e));
		mo_free(t);
		return -1;
	}
	mo_cleanup_add_file(t);
	/* mkstemp makes the file 0600; ours are ordinary files */
	if (fchmod(fd, file_mode) != 0) {
		/* keep 0600: safe, only less shared */
	}
	*tmp_path = t;
	return fd;
}

void mo_file_discard_temp(int fd, char *tmp_path)
{
	if (fd >= 0)
		close(fd);
	if (!tmp_path)
		return;
	unlink(tmp_path);
	mo_cleanup_remove_path(tmp_path);
	mo_free(tmp_path);
}

enum mo_status mo_file_commit_temp(int fd, char *tmp_path, const char *dest, struct mo_diag *d)
{
	if (!tmp_path) {
		if (fd >= 0)
			close(fd);
		return MO_OK;
	}
	bool ok = true;
	int e = 0;
	if (fd >= 0) {
		if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
			ok = false;
			e = errno;
		}
		if (close(fd) != 0 && ok) {
			ok = false;
			e = errno;
		}
	}
	/* what was checked at creation, again: a long run may end after
	 * something else took the name */
	const char *kind = ok ? not_a_file(dest) : NULL;
	if (kind)
		ok = false;
	if (ok && rename(tmp_path, dest) != 0) {
		ok = false;
		e = errno;
	}
	if (!ok) {
		unlink(tmp_path);
		if (kind)
			mo_diag_set(d, MO_ERR_INPUT, "%s: not a regular file (%s); give a file name",
				    dest, kind);
		else
			mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", dest, strerror(e));
	}
	mo_cleanup_remove_path(tmp_path);
	mo_free(tmp_path);
	return ok ? MO_OK : d->status;
}

enum mo_status mo_file_open(struct mo_file *mf, const char *dest, struct mo_diag *d)
{
	memset(mf, 0, sizeof *mf);
	char *tmp;
	int fd = mo_file_create_temp(dest, &tmp, d);
	if (fd < 0)
		return d->status;
	mf->dest = mo_strdup(dest);
	mf->f = mf->dest ? fdopen(fd, "wb") : NULL;
	if (!mf->f) {
		mo_file_discard_temp(fd, tmp);
		mo_free(mf->dest);
		mf->dest = NULL;
		return mo_diag_nomem(d);
	}
	mf->tmp_path = tmp;
	return MO_OK;
}

void mo_file_discard(struct mo_file *mf)
{
	if (mf->f)
		fclose(mf->f);
	mo_file_discard_temp(-1, mf->tmp_path);
	mo_free(mf->dest);
	memset(mf, 0, sizeof *mf);
}

enum mo_status mo_file_commit(struct mo_file *mf, struct mo_diag *d)
{
	if (!mf->f)
		return mo_diag_set(d, MO_ERR_INTERNAL, "mo_file_commit without mo_file_open");
	bool ok = !ferror(mf->f) && fflush(mf->f) == 0;
	int e = errno;
	int fd = dup(fileno(mf->f));
	if (fclose(mf->f) != 0 && ok) {
		ok = false;
		e = errno;
	}
	mf->f = NULL;
	enum mo_status st;
	if (!ok || fd < 0) {
		if (fd >= 0)
			close(fd);
		mo_file_discard_temp(-1, mf->tmp_path);
		st = mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", mf->dest,
				 strerror(e ? e : EIO));
	} else {
		st = mo_file_commit_temp(fd, mf->tmp_path, mf->dest, d);
	}
	mf->tmp_path = NULL;
	mo_free(mf->dest);
	mf->dest = NULL;
	return st;
}

enum mo_status mo_file_write_all(const char *dest, const void *data, size_t len, struct mo_diag *d)
{
	char *tmp;
	int fd = mo_file_create_temp(dest, &tmp, d);
	if (fd < 0)
		return d->status;
	const char *p = data;
	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			int e = w < 0 ? errno : EIO;
			mo_file_discard_temp(fd, tmp);
			return mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", dest, strerror(e));
		}
		p += w;
		len -= (size_t)w;
	}
	return mo_file_commit_temp(fd, tmp, dest, d);
}

bool mo_same_file(const char *a, const char *b)
{
	struct stat sa, sb;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}
