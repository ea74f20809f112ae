/* base/file.c: exclusive creation renamed into place, and the cleanup list a
 * signal empties. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mo_base.h"

static char dir[64];

static int make_dir(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/mo_file_XXXXXX");
	return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
	(void)state;
	mo_remove_tree(dir);
	return 0;
}

static int count_entries(const char *d)
{
	DIR *dp = opendir(d);
	int n = 0;
	struct dirent *e;
	while (dp && (e = readdir(dp)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	if (dp)
		closedir(dp);
	return n;
}

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void expect(const char *path, const char *text)
{
	char buf[256] = "";
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = 0;
	fclose(f);
	assert_string_equal(buf, text);
}

static void a_symlink_at_the_destination_is_replaced_not_followed(void **state)
{
	(void)state;
	char victim[128], dest[128];
	snprintf(victim, sizeof victim, "%s/victim", dir);
	snprintf(dest, sizeof dest, "%s/out.txt", dir);
	put(victim, "precious");
	assert_int_equal(symlink(victim, dest), 0);
	struct mo_diag d;
	mo_diag_init(&d);
	assert_int_equal(mo_file_write_all(dest, "new", 3, &d), MO_OK);
	expect(victim, "precious");
	expect(dest, "new");
	struct stat st;
	assert_int_equal(lstat(dest, &st), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(count_entries(dir), 2); /* no temporary left */
	unlink(victim);
	unlink(dest);
}

static void a_discarded_or_failed_write_leaves_the_destination_and_no_temporary(void **state)
{
	(void)state;
	char dest[128];
	snprintf(dest, sizeof dest, "%s/keep.txt", dir);
	put(dest, "old");
	struct mo_diag d;
	mo_diag_init(&d);
	struct mo_file mf;
	assert_int_equal(mo_file_open(&mf, dest, &d), MO_OK);
	fputs("half written", mf.f);
	mo_file_discard(&mf);
	expect(dest, "old");
	assert_int_equal(count_entries(dir), 1);
	/* a folder is not a destination; a missing folder is named */
	assert_int_equal(mo_file_write_all(dir, "x", 1, &d), MO_ERR_INPUT);
	assert_non_null(strstr(d.msg, "is a folder"));
	mo_diag_init(&d);
	char missing[160];
	snprintf(missing, sizeof missing, "%s/nope/x.txt", dir);
	assert_int_equal(mo_file_write_all(missing, "x", 1, &d), MO_ERR_INPUT);
	assert_non_null(strstr(d.msg, "does not exist"));
	unlink(dest);
}

static void every_allocation_failing_in_turn_leaks_and_leaves_nothing(void **state)
{
	(void)state;
	char dest[128];
	snprintf(dest, sizeof dest, "%s/oom.txt", dir);
	for (unsigned long k = 1;; k++) {
		unlink(dest);
		struct mo_diag d;
		mo_diag_init(&d);
		mo_alloc_fail_after(k);
		struct mo_file mf;
		enum mo_status st = mo_file_open(&mf, dest, &d);
		if (!st) {
			fputs("text", mf.f);
			st = mo_file_commit(&mf, &d);
		}
		unsigned long made = mo_alloc_fail_after(0);
		if (st == MO_OK) {
			expect(dest, "text");
			assert_true(made < k);
			break;
		}
		assert_int_equal(st, MO_ERR_NOMEM);
		assert_int_equal(count_entries(dir), 0);
	}
	unlink(dest);
}

static void a_signal_removes_listed_temporaries_and_kills_listed_children(void **state)
{
	(void)state;
	char file[128], sub[128], deep[160], deeper[200], pidfile[128];
	snprintf(sub, sizeof sub, "%s/build", dir);
	snprintf(pidfile, sizeof pidfile, "%s/child.pid", dir);
	int ready[2];
	assert_int_equal(pipe(ready), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		mo_cleanup_install();
		struct mo_diag d;
		mo_diag_init(&d);
		snprintf(file, sizeof file, "%s/out.txt", dir);
		char *tmp;
		int fd = mo_file_create_temp(file, &tmp, &d);
		if (fd < 0)
			_exit(10);
		mkdir(sub, 0700);
		snprintf(deep, sizeof deep, "%s/a", sub);
		mkdir(deep, 0700);
		snprintf(deeper, sizeof deeper, "%s/b.txt", deep);
		put(deeper, "x");
		mo_cleanup_add_dir(sub);
		pid_t grandchild = fork();
		if (grandchild == 0) {
			setpgid(0, 0);
			pause();
			_exit(0);
		}
		setpgid(grandchild, grandchild);
		mo_cleanup_add_child(grandchild);
		FILE *f = fopen(pidfile, "w");
		fprintf(f, "%d\n", (int)grandchild);
		fclose(f);
		if (write(ready[1], "r", 1) != 1)
			_exit(11);
		for (;;)
			pause();
	}
	close(ready[1]);
	char c;
	assert_int_equal(read(ready[0], &c, 1), 1);
	close(ready[0]);
	kill(pid, SIGTERM);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGTERM);
	/* only the pid file is left: the temporary and the build folder
	 * (two levels deep) are gone */
	assert_int_equal(count_entries(dir), 1);
	FILE *f = fopen(pidfile, "r");
	int g = 0;
	assert_int_equal(fscanf(f, "%d", &g), 1);
	fclose(f);
	/* the grandchild was killed and reaped by the handler: no such
	 * process, or at most a zombie being reaped by init */
	if (kill(g, 0) == 0) {
		char p[64], s[512];
		snprintf(p, sizeof p, "/proc/%d/stat", g);
		FILE *ps = fopen(p, "r");
		if (ps) {
			size_t n = fread(s, 1, sizeof s - 1, ps);
			s[n] = 0;
			fclose(ps);
			char *r = strrchr(s, ')');
			assert_true(r && r[2] == 'Z');
		}
	}
	unlink(pidfile);
}

static void same_file_is_by_identity(void **state)
{
	(void)state;
	char a[128], b[128], l[128];
	snprintf(a, sizeof a, "%s/a", dir);
	snprintf(b, sizeof b, "%s/b", dir);
	snprintf(l, sizeof l, "%s/./a", dir);
	put(a, "a");
	assert_false(mo_same_file(a, b)); /* b does not exist */
	assert_int_equal(link(a, b), 0);
	assert_true(mo_same_file(a, b));
	assert_true(mo_same_file(a, l));
	unlink(b);
	put(b, "a");
	assert_false(mo_same_file(a, b)); /* same bytes, another file */
	unlink(a);
	unlink(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_symlink_at_the_destination_is_replaced_not_followed),
		cmocka_unit_test(a_discarded_or_failed_write_leaves_the_destination_and_no_temporary),
		cmocka_unit_test(every_allocation_failing_in_turn_leaks_and_leaves_nothing),
		cmocka_unit_test(a_signal_removes_listed_temporaries_and_kills_listed_children),
		cmocka_unit_test(same_file_is_by_identity),
	};
	return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
