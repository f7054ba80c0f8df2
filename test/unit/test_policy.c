/* test_policy.c - the automatic-promotion and capacity options and the
 * decisions made from them: option parsing (good and bad values), the
 * exclusion globs (names and paths, a glob file), hotness, the free-space
 * floor, the bandwidth share, sharded checkpoint names, weight maps. */
#include "check.h"
#include "policy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[] = "/var/tmp/wfs-policy-XXXXXX";

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
		perror(path);
		exit(2);
	}
}

struct seen {
	char names[8][64];
	int n;
};

static int see(void *arg, const char *file)
{
	struct seen *s = arg;

	if (s->n < 8)
		snprintf(s->names[s->n++], sizeof(s->names[0]), "%s", file);
	return 0;
}

static int stop_at_b(void *arg, const char *file)
{
	(void)arg;
	return !strcmp(file, "b.safetensors") ? 7 : 0;
}

int main(void)
{
	struct check_count c = {0};
	struct policy_opts o;
	struct policy_shard sh;
	char err[512], path[256];
	struct seen s = {0};

	if (!mkdtemp(tmpdir))
		return 2;

	/* defaults */
	policy_opts_init(&o);
	CHECK(&c, o.auto_on && o.siblings && o.auto_bytes == (256u << 20) && o.auto_opens == 4,
	      "defaults: auto on, 256M, 4 opens");
	CHECK(&c, o.auto_bw == 200000000u, "default auto cap 200 MB/s: %llu",
	      (unsigned long long)o.auto_bw);
	CHECK(&c, o.store_max == 0 && o.min_free == 0 && o.min_free_pct == 10, "default room");
	CHECK(&c, policy_floor(&o, 1000000) == 100000, "10%% floor: %llu",
	      (unsigned long long)policy_floor(&o, 1000000));

	/* parsing */
	CHECK(&c, policy_parse_opt(&o, "entry_timeout", "1", err, sizeof(err)) == 0, "not ours");
	CHECK(&c, policy_parse_opt(&o, "auto_promote", "off", err, sizeof(err)) == 1 && !o.auto_on,
	      "auto off");
	CHECK(&c, policy_parse_opt(&o, "auto_promote", "", err, sizeof(err)) == 1 && o.auto_on,
	      "bare auto_promote is on");
	CHECK(&c, policy_parse_opt(&o, "auto_promote", "maybe", err, sizeof(err)) == -1 &&
	      strstr(err, "auto_promote=maybe"), "bad on/off: %s", err);
	CHECK(&c, policy_parse_opt(&o, "auto_bytes", "1.5M", err, sizeof(err)) == 1 &&
	      o.auto_bytes == 3u << 19, "1.5M: %llu", (unsigned long long)o.auto_bytes);
	CHECK(&c, policy_parse_opt(&o, "store_max", "2GiB", err, sizeof(err)) == 1 &&
	      o.store_max == 2ull << 30, "2GiB");
	CHECK(&c, policy_parse_opt(&o, "store_max", "40m", err, sizeof(err)) == 1 &&
	      o.store_max == 40ull << 20, "40m");
	CHECK(&c, policy_parse_opt(&o, "store_max", "12345", err, sizeof(err)) == 1 &&
	      o.store_max == 12345, "plain bytes");
	CHECK(&c, policy_parse_opt(&o, "store_max", "-1G", err, sizeof(err)) == -1, "negative");
	CHECK(&c, policy_parse_opt(&o, "store_max", "10X", err, sizeof(err)) == -1 &&
	      strstr(err, "store_max"), "unit: %s", err);
	CHECK(&c, policy_parse_opt(&o, "store_max", "", err, sizeof(err)) == -1, "empty size");
	/* past 4 EiB the room checks' sums wrapped, and status showed them < 0 */
	CHECK(&c, policy_parse_opt(&o, "store_max", "4194304T", err, sizeof(err)) == 1 &&
	      o.store_max == 1ull << 62, "4 EiB: the most");
	CHECK(&c, policy_parse_opt(&o, "store_max", "16000000T", err, sizeof(err)) == -1 &&
	      strstr(err, "at most 4 EiB"), "past 4 EiB: %s", err);
	CHECK(&c, policy_parse_opt(&o, "min_free", "9223372036854775808", err, sizeof(err)) == -1,
	      "min_free past 4 EiB");
	CHECK(&c, policy_parse_opt(&o, "min_free", "5%", err, sizeof(err)) == 1 &&
	      policy_floor(&o, 1000) == 50, "5%%");
	CHECK(&c, policy_parse_opt(&o, "min_free", "1G", err, sizeof(err)) == 1 &&
	      policy_floor(&o, 100) == 1u << 30, "absolute floor");
	CHECK(&c, policy_parse_opt(&o, "min_free", "100%", err, sizeof(err)) == -1, "100%%");
	CHECK(&c, policy_parse_opt(&o, "min_free", "x%", err, sizeof(err)) == -1, "x%%");
	CHECK(&c, policy_parse_opt(&o, "auto_opens", "3", err, sizeof(err)) == 1 &&
	      o.auto_opens == 3, "opens");
	CHECK(&c, policy_parse_opt(&o, "auto_opens", "three", err, sizeof(err)) == -1, "opens?");
	CHECK(&c, policy_parse_opt(&o, "auto_mbps", "2.5", err, sizeof(err)) == 1 &&
	      o.auto_bw == 2500000, "mbps");
	CHECK(&c, policy_parse_opt(&o, "auto_mbps", "-3", err, sizeof(err)) == -1, "mbps < 0");
	/* a cap under 1 byte/s rounded to 0, which is no cap */
	CHECK(&c, policy_parse_opt(&o, "auto_mbps", "0.0000001", err, sizeof(err)) == -1 &&
	      strstr(err, "else 0.000001-"), "mbps under 1 B/s: %s", err);
	CHECK(&c, policy_parse_opt(&o, "auto_mbps", "0.000001", err, sizeof(err)) == 1 &&
	      o.auto_bw == 1, "mbps of 1 B/s");
	CHECK(&c, policy_parse_opt(&o, "auto_siblings", "off", err, sizeof(err)) == 1 &&
	      !o.siblings, "siblings off");
	CHECK(&c, policy_parse_opt(&o, "ref_poll", "0.5", err, sizeof(err)) == 1 &&
	      o.ref_poll == 0.5, "ref_poll");
	CHECK(&c, policy_parse_opt(&o, "ref_poll", "0", err, sizeof(err)) == -1, "ref_poll 0");

	/* exclusion globs */
	CHECK(&c, policy_excluded(&o, "a/b/c.gguf") == NULL, "nothing excluded yet");
	CHECK(&c, policy_parse_opt(&o, "exclude", "*.gguf", err, sizeof(err)) == 1, "exclude");
	CHECK(&c, policy_parse_opt(&o, "exclude", "", err, sizeof(err)) == -1, "empty glob");
	snprintf(path, sizeof(path), "%s/globs", tmpdir);
	write_file(path, "# optional packs\n\n  */pack/*  \nmodels--acme--huge/*\n");
	CHECK(&c, policy_parse_opt(&o, "exclude_from", path, err, sizeof(err)) == 1 &&
	      o.nexclude == 3, "glob file: %zu globs", o.nexclude);
	{ /* a line longer than any buffer is one glob: cut in two, its
	   * tail here was "*", which excludes every file */
		char long_glob[4098];
		size_t n0 = o.nexclude;
		FILE *f;

		memset(long_glob, 'a', 4095);
		memcpy(long_glob + 4095, "*\n", 3);
		snprintf(path, sizeof(path), "%s/globs-long", tmpdir);
		f = fopen(path, "w");
		CHECK(&c, f && fputs(long_glob, f) >= 0 && fclose(f) == 0, "write %s", path);
		CHECK(&c, policy_parse_opt(&o, "exclude_from", path, err, sizeof(err)) == 1 &&
		      o.nexclude == n0 + 1 && strlen(o.exclude[n0]) == 4096,
		      "a 4096-byte line: %zu globs", o.nexclude - n0);
		CHECK(&c, policy_excluded(&o, "models--a--b/snapshots/r/model.safetensors") == NULL,
		      "a model file excluded by %s",
		      policy_excluded(&o, "models--a--b/snapshots/r/model.safetensors"));
		while (o.nexclude > n0)
			free(o.exclude[--o.nexclude]);
	}
	CHECK(&c, policy_parse_opt(&o, "exclude_from", "/nonexistent/globs", err, sizeof(err)) == -1 &&
	      strstr(err, "/nonexistent/globs"), "missing glob file: %s", err);
	CHECK(&c, policy_excluded(&o, "models--a--b/snapshots/r/x.gguf") &&
	      !strcmp(policy_excluded(&o, "models--a--b/snapshots/r/x.gguf"), "*.gguf"),
	      "name glob matches the last component");
	CHECK(&c, policy_excluded(&o, "models--a--b/snapshots/r/x.gguf.json") == NULL,
	      "name glob is anchored");
	CHECK(&c, policy_excluded(&o, "models--a--b/snapshots/r/pack/deep/p.bin") != NULL,
	      "path glob: '*' crosses '/'");
	CHECK(&c, policy_excluded(&o, "models--a--b/snapshots/r/packs/p.bin") == NULL,
	      "path glob: not packs/");
	CHECK(&c, policy_excluded(&o, "models--acme--huge/blobs/abc") != NULL, "a whole repo");
	CHECK(&c, policy_excluded(&o, "models--acme--hugely/blobs/abc") == NULL, "not a prefix");
	CHECK(&c, policy_excluded(NULL, "x.gguf") == NULL, "no policy, nothing excluded");

	/* hotness */
	policy_opts_free(&o);
	policy_opts_init(&o);
	o.auto_bytes = 1000;
	o.auto_opens = 3;
	CHECK(&c, !policy_is_hot(&o, 5000, 999, 2), "not yet");
	CHECK(&c, policy_is_hot(&o, 5000, 1000, 0), "bytes");
	CHECK(&c, policy_is_hot(&o, 5000, 0, 3), "opens");
	CHECK(&c, policy_is_hot(&o, 100, 100, 0), "a small blob read in full");
	CHECK(&c, !policy_is_hot(&o, 100, 99, 0), "a small blob read in part");
	o.auto_opens = 0;
	CHECK(&c, !policy_is_hot(&o, 5000, 0, 100), "opens do not count");
	o.auto_on = 0;
	CHECK(&c, !policy_is_hot(&o, 5000, 5000, 100), "off: never hot");
	CHECK(&c, !policy_is_hot(NULL, 1, 1, 1), "no policy: never hot");

	/* bandwidth share */
	CHECK(&c, policy_share(0, 2) == 0, "no cap stays no cap");
	CHECK(&c, policy_share(200, 2) == 100 && policy_share(200, 1) == 200 &&
	      policy_share(1, 4) == 1, "share");

	/* shards */
	CHECK(&c, policy_shard_parse("model-00003-of-00042.safetensors", &sh) && sh.index == 3 &&
	      sh.total == 42 && sh.stem_len == 5 && !strcmp(sh.tail, ".safetensors"), "parse");
	CHECK(&c, policy_shard_parse("pytorch_model-00001-of-00002.bin", &sh) && sh.total == 2,
	      "pytorch");
	CHECK(&c, policy_shard_parse("q4-00001-of-00003.gguf", &sh), "gguf split");
	CHECK(&c, !policy_shard_parse("model.safetensors", &sh), "not a shard");
	CHECK(&c, !policy_shard_parse("model-00001-of-00001.safetensors", &sh), "one of one");
	CHECK(&c, !policy_shard_parse("model-of-00002.safetensors", &sh), "no index");
	CHECK(&c, policy_shard_siblings("model-00001-of-00003.safetensors",
					"model-00003-of-00003.safetensors"), "siblings");
	CHECK(&c, !policy_shard_siblings("model-00001-of-00003.safetensors",
					 "model-00001-of-00003.safetensors"), "itself");
	CHECK(&c, !policy_shard_siblings("model-00001-of-00003.safetensors",
					 "model-00002-of-00004.safetensors"), "other total");
	CHECK(&c, !policy_shard_siblings("model-00001-of-00003.safetensors",
					 "other-00002-of-00003.safetensors"), "other stem");
	CHECK(&c, !policy_shard_siblings("model-00001-of-00003.safetensors",
					 "model-00002-of-00003.bin"), "other tail");
	CHECK(&c, policy_is_ckpt_index("model.safetensors.index.json") &&
	      policy_is_ckpt_index("pytorch_model.bin.index.json") &&
	      !policy_is_ckpt_index("config.json") && !policy_is_ckpt_index(".index.json"),
	      "index names");

	/* weight maps */
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", tmpdir);
	write_file(path, "{\"metadata\":{\"total_size\":1},\"weight_map\":{"
		   "\"w1\":\"a.safetensors\",\"w2\":\"b.safetensors\",\"w3\":\"a.safetensors\","
		   "\"w4\":\"c.safetensors\"}}");
	CHECK(&c, policy_weight_map(path, see, &s) == 0 && s.n == 3 &&
	      !strcmp(s.names[0], "a.safetensors") && !strcmp(s.names[2], "c.safetensors"),
	      "distinct files, in order: %d", s.n);
	CHECK(&c, policy_weight_map(path, stop_at_b, NULL) == 7, "stops with the callback's value");
	write_file(path, "{\"weight_map\": 3}");
	CHECK(&c, policy_weight_map(path, see, &s) == -EINVAL, "not a map");
	write_file(path, "not json");
	CHECK(&c, policy_weight_map(path, see, &s) == -EINVAL, "not json");
	CHECK(&c, policy_weight_map("/nonexistent/x.index.json", see, &s) == -ENOENT, "missing");

	policy_opts_free(&o);
	snprintf(path, sizeof(path), "rm -rf %s", tmpdir);
	if (system(path) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	printf("policy: %d passed, %d failed\n", c.passed, c.failed);
	return c.failed ? 1 : 0;
}
