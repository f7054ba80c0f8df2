/* fetch_bench.c - `test_fetch --bench`; see fetch_bench.h. */
#include "fetch_bench.h"
#include "check.h"
#include "fetch.h"
#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct bench_sha {
	double secs;
	uint64_t bytes;
	pthread_barrier_t *go;
};

static void *bench_sha_thread(void *arg)
{
	struct bench_sha *b = arg;
	size_t n = 1 << 20;
	unsigned char *buf = check_pattern(n, 7), d[EVP_MAX_MD_SIZE];
	unsigned int len;
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	double t0;

	EVP_DigestInit_ex(c, EVP_sha256(), NULL);
	EVP_DigestUpdate(c, buf, n);  /* warm */
	if (b->go)
		pthread_barrier_wait(b->go);
	t0 = check_now_s();
	b->bytes = 0;
	while (check_now_s() - t0 < b->secs) {
		for (int i = 0; i < 16; i++)
			EVP_DigestUpdate(c, buf, n);
		b->bytes += 16 * (uint64_t)n;
	}
	b->secs = check_now_s() - t0;
	EVP_DigestFinal_ex(c, d, &len);
	EVP_MD_CTX_free(c);
	free(buf);
	return NULL;
}

/* SHA-256 bytes/s of @threads threads hashing at once (summed). */
static double bench_sha_rate(int threads)
{
	pthread_t t[64];
	struct bench_sha b[64];
	pthread_barrier_t go;
	double sum = 0;

	if (threads > 64)
		threads = 64;
	pthread_barrier_init(&go, NULL, (unsigned)threads);
	for (int i = 0; i < threads; i++) {
		b[i] = (struct bench_sha){ 0.6, 0, &go };
		pthread_create(&t[i], NULL, bench_sha_thread, &b[i]);
	}
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		sum += (double)b[i].bytes / b[i].secs;
	}
	pthread_barrier_destroy(&go);
	return sum;
}

struct bench_run {
	char (*paths)[PATH_MAX];
	char (*ids)[65];
	const char *dst;
	uint64_t size;
	int files, no_id;
	_Atomic int next;
	_Atomic int failed;
};

static void *bench_worker(void *arg)
{
	struct bench_run *r = arg;
	int i;

	while ((i = atomic_fetch_add(&r->next, 1)) < r->files) {
		char tmp[PATH_MAX];
		struct fetch_result res;
		int e;

		/* removed by bench_clean() once the clock stops: wfs renames
		 * a verified copy, the figure has no unlink in it */
		snprintf(tmp, sizeof(tmp), "%s/bench-%d.part", r->dst, i);
		e = fetch_copy_verify(r->paths[i], r->size, tmp, r->no_id ? NULL : r->ids[i], 0,
				      NULL, &res);
		if (e || res.id_check != (r->no_id ? -1 : 1)) {
			fprintf(stderr, "copy %s: %d %s (id_check %d)\n", r->paths[i], e, res.reason,
				res.id_check);
			atomic_store(&r->failed, 1);
		}
	}
	return NULL;
}

/* Make (or find) file @i of the set: pseudo-random bytes, named by SHA-256. */
static int bench_file(const char *dir, uint64_t size, int i, char path[PATH_MAX], char id[65])
{
	char mark[PATH_MAX + 8], tmp[PATH_MAX];
	size_t n = 1 << 20;
	unsigned char *buf = malloc(n), d[EVP_MAX_MD_SIZE];
	unsigned int len;
	uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1), *w = (uint64_t *)buf;
	EVP_MD_CTX *c;
	FILE *f;
	int fd;

	snprintf(mark, sizeof(mark), "%s/%d.id", dir, i);
	f = fopen(mark, "r");
	if (f) {
		int ok = fscanf(f, "%64s", id) == 1;
		struct stat st;

		fclose(f);
		snprintf(path, PATH_MAX, "%s/%s", dir, id);
		if (ok && stat(path, &st) == 0 && (uint64_t)st.st_size == size) {
			free(buf);
			return 0;
		}
	}
	snprintf(tmp, sizeof(tmp), "%s/%d.new", dir, i);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		perror(tmp);
		free(buf);
		return -1;
	}
	c = EVP_MD_CTX_new();
	EVP_DigestInit_ex(c, EVP_sha256(), NULL);
	for (uint64_t off = 0; off < size; off += n) {
		size_t m = size - off < n ? (size_t)(size - off) : n;

		for (size_t k = 0; k < n / 8; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			w[k] = x;
		}
		EVP_DigestUpdate(c, buf, m);
		if (write(fd, buf, m) != (ssize_t)m) {
			perror(tmp);
			close(fd);
			free(buf);
			return -1;
		}
	}
	EVP_DigestFinal_ex(c, d, &len);
	EVP_MD_CTX_free(c);
	for (unsigned k = 0; k < len; k++)
		sprintf(id + 2 * k, "%02x", d[k]);
	fsync(fd);
	close(fd);
	snprintf(path, PATH_MAX, "%s/%s", dir, id);
	if (rename(tmp, path) < 0) {
		perror(path);
		free(buf);
		return -1;
	}
	f = fopen(mark, "w");
	if (f) {
		fprintf(f, "%s\n", id);
		fclose(f);
	}
	free(buf);
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* busy and total jiffies of all cores, from /proc/stat */
static void cpu_jiffies(double *busy, double *total)
{
	unsigned long long v[10] = { 0 };
	FILE *f = fopen("/proc/stat", "r");

	*busy = *total = 0;
	if (!f)
		return;
	if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
		   &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) >= 8) {
		for (int i = 0; i < 8; i++)
			*total += (double)v[i];
		*busy = *total - (double)v[3] - (double)v[4];
	}
	fclose(f);
}

static double cpu_self(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* the copies of a round: wfs renames them, the bench removes them */
static void bench_clean(const char *dst, int files)
{
	for (int i = 0; i < files; i++) {
		char tmp[PATH_MAX];

		snprintf(tmp, sizeof(tmp), "%s/bench-%d.part", dst, i);
		unlink(tmp);
	}
}

int fetch_bench(int argc, char **argv)
{
	const char *src_dir = NULL, *dst = NULL;
	int mib = 2048, files = 1, workers = 0, repeat = 5, no_id = 0;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	char dir[PATH_MAX];
	double *rate = NULL, *ratio = NULL, *sha1c = NULL, *shaall = NULL;
	struct bench_run run = { 0 };
	uint64_t size;
	int ret = 2;

	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--mib") && i + 1 < argc)
			mib = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--files") && i + 1 < argc)
			files = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--workers") && i + 1 < argc)
			workers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
			repeat = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--no-id"))
			no_id = 1;
		else if (!src_dir)
			src_dir = argv[i];
		else if (!dst)
			dst = argv[i];
		else
			src_dir = NULL, i = argc;
	}
	if (!src_dir || !dst || mib <= 0 || files <= 0 || repeat <= 0) {
		fprintf(stderr, "usage: test_fetch --bench SRC_DIR DST_DIR [--mib N] [--files K] "
			"[--workers W] [--repeat R] [--no-id]\n");
		return 2;
	}
	if (workers <= 0)
		workers = (int)(ncpu < 2 ? 2 : ncpu);  /* copy_workers' default */
	if (workers > files)
		workers = files;
	if (workers > 64)
		workers = 64;
	size = (uint64_t)mib << 20;
	snprintf(dir, sizeof(dir), "%s/bench-%d-%d", src_dir, mib, files);
	mkdir(dir, 0755);
	run.paths = calloc((size_t)files, sizeof(*run.paths));
	run.ids = calloc((size_t)files, sizeof(*run.ids));
	rate = calloc((size_t)repeat, sizeof(double));
	ratio = calloc((size_t)repeat, sizeof(double));
	sha1c = calloc((size_t)repeat, sizeof(double));
	shaall = calloc((size_t)repeat, sizeof(double));
	if (!run.paths || !run.ids || !rate || !ratio || !sha1c || !shaall)
		goto out;
	for (int i = 0; i < files; i++)
		if (bench_file(dir, size, i, run.paths[i], run.ids[i]) < 0)
			goto out;
	run.dst = dst;
	run.size = size;
	run.files = files;
	run.no_id = no_id;
	printf("%d file(s) of %d MiB, %d worker(s), %ld cpu(s), %s, %s, %s -> %s\n", files, mib,
	       workers, ncpu, no_id ? "no content address" : "sha256 named",
	       getenv("WFS_FETCH_NO_URING") ? "no io_uring" : "io_uring", dir, dst);
	for (int k = 0; k < repeat; k++) {
		pthread_t t[64];
		double t0, wall, c0, b0, j0, b1, j1, base;
		FILE *dc;

		bench_clean(dst, files);
		sync();
		dc = fopen("/proc/sys/vm/drop_caches", "w");
		if (dc) {
			fputs("3\n", dc);
			fclose(dc);
		}
		sha1c[k] = bench_sha_rate(1);
		shaall[k] = bench_sha_rate((int)ncpu);
		atomic_store(&run.next, 0);
		atomic_store(&run.failed, 0);
		cpu_jiffies(&b0, &j0);
		c0 = cpu_self();
		t0 = check_now_s();
		for (int w = 0; w < workers && w < 64; w++)
			pthread_create(&t[w], NULL, bench_worker, &run);
		for (int w = 0; w < workers && w < 64; w++)
			pthread_join(t[w], NULL);
		wall = check_now_s() - t0;
		c0 = cpu_self() - c0;
		cpu_jiffies(&b1, &j1);
		bench_clean(dst, files);
		if (atomic_load(&run.failed)) {
			ret = 1;
			goto out;
		}
		base = files == 1 ? sha1c[k] : shaall[k];
		rate[k] = (double)size * files / wall;
		ratio[k] = rate[k] / base;
		printf("round %d: %.3f s, %.0f MB/s = %.3fx sha256 %s (%.0f MB/s; one core %.0f, "
		       "all %.0f); process cpu %.2f s; cores busy %.2f of %ld\n",
		       k + 1, wall, rate[k] / 1e6, ratio[k], files == 1 ? "one-core" : "all-core",
		       base / 1e6, sha1c[k] / 1e6, shaall[k] / 1e6, c0,
		       j1 > j0 ? (b1 - b0) / (j1 - j0) * (double)ncpu : 0.0, ncpu);
		fflush(stdout);
	}
	printf("median of %d: %.0f MB/s, ratio %.3f to sha256 %s (median one core %.0f MB/s, "
	       "all cores %.0f MB/s)\n", repeat, median(rate, repeat) / 1e6, median(ratio, repeat),
	       files == 1 ? "one-core" : "all-core", median(sha1c, repeat) / 1e6,
	       median(shaall, repeat) / 1e6);
	ret = 0;
out:
	free(run.paths);
	free(run.ids);
	free(rate);
	free(ratio);
	free(sha1c);
	free(shaall);
	return ret;
}
