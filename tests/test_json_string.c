/* mo_json_string writes valid JSON (RFC 8259, UTF-8) for any bytes a model
 * holds: names are bytes, and the manifest and the reports must parse. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_tp.h"

static char *json_of(const char *s)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	assert_non_null(f);
	mo_json_string(f, s);
	assert_int_equal(fclose(f), 0);
	return buf;
}

static void expect(const char *in, const char *want)
{
	char *got = json_of(in);
	if (strcmp(got, want))
		fail_msg("mo_json_string(\"%s\") gave %s, not %s", in, got, want);
	free(got);
}

static void ascii_and_escapes(void **state)
{
	(void)state;
	expect("plain/name.0", "\"plain/name.0\"");
	expect("q\"b\\", "\"q\\\"b\\\\\"");
	expect("a\nb\x01\x7f", "\"a\\u000ab\\u0001\\u007f\"");
}

static void well_formed_utf8_is_kept(void **state)
{
	(void)state;
	/* é (2 bytes), € (3), U+10348 (4), U+FFFF and U+10FFFF at the edges */
	expect("\xc3\xa9\xe2\x82\xac\xf0\x90\x8d\x88", "\"\xc3\xa9\xe2\x82\xac\xf0\x90\x8d\x88\"");
	expect("\xef\xbf\xbf\xf4\x8f\xbf\xbf", "\"\xef\xbf\xbf\xf4\x8f\xbf\xbf\"");
}

static void ill_formed_bytes_become_replacement_characters(void **state)
{
	(void)state;
	expect("a\xff" "b", "\"a\\ufffdb\"");                 /* never valid */
	expect("\xc0\xaf", "\"\\ufffd\\ufffd\"");              /* overlong '/' */
	expect("\xe0\x80\xaf", "\"\\ufffd\\ufffd\\ufffd\"");    /* overlong, 3 bytes */
	expect("\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\"");    /* a surrogate */
	expect("\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\""); /* past U+10FFFF */
	expect("\xe2\x82", "\"\\ufffd\\ufffd\"");              /* cut short at the end */
	expect("\xe2\x82x", "\"\\ufffd\\ufffdx\"");            /* cut short by ASCII */
	expect("\x80\xbf", "\"\\ufffd\\ufffd\"");              /* lone continuations */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(ascii_and_escapes),
		cmocka_unit_test(well_formed_utf8_is_kept),
		cmocka_unit_test(ill_formed_bytes_become_replacement_characters),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
