/* hash.c - XXH3-128, the hub's content addresses, and the source sample. */
#include "hash.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <xxhash.h>

static void to_hex(const unsigned char *b, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[b[i] >> 4];
		out[2 * i + 1] = digits[b[i] & 15];
	}
	out[2 * n] = '\0';
}

static void xxh128_hex(XXH128_hash_t v, char out[33])
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, v);
	to_hex(c.digest, sizeof(c.digest), out);
}

int xxh128_hex_of(const void *p, size_t n, char out[33])
{
	xxh128_hex(XXH3_128bits(p, n), out);
	return 0;
}

int xxh128_hex_valid(const char *s)
{
	size_t n = strspn(s, "0123456789abcdef");

	return n == 32 && !s[n];
}

int content_hash_init(struct content_hash *h, const char *expected_id, uint64_t size)
{
	memset(h, 0, sizeof(*h));
	h->kind = expected_id ? hub_id_kind(expected_id) : HUB_ID_NONE;
	h->xxh = XXH3_createState();
	if (!h->xxh)
		return -ENOMEM;
	XXH3_128bits_reset(h->xxh);
	if (h->kind == HUB_ID_NONE)
		return 0;

	snprintf(h->expected, sizeof(h->expected), "%s", expected_id);
	h->md = EVP_MD_CTX_new();
	if (!h->md) {
		content_hash_free(h);
		return -ENOMEM;
	}
	if (!EVP_DigestInit_ex(h->md, h->kind == HUB_ID_SHA256 ? EVP_sha256() : EVP_sha1(), NULL)) {
		content_hash_free(h);
		return -EIO;
	}
	if (h->kind == HUB_ID_SHA1) {
		/* git hashes the object header, NUL included, before the content */
		char hdr[32];
		int n = snprintf(hdr, sizeof(hdr), "blob %" PRIu64, size);

		EVP_DigestUpdate(h->md, hdr, (size_t)n + 1);
	}
	return 0;
}

void content_hash_update(struct content_hash *h, const void *buf, size_t n)
{
	XXH3_128bits_update(h->xxh, buf, n);
	if (h->md)
		EVP_DigestUpdate(h->md, buf, n);
}

void content_hash_update_xxh(struct content_hash *h, const void *buf, size_t n)
{
	XXH3_128bits_update(h->xxh, buf, n);
}

void content_hash_update_id(struct content_hash *h, const void *buf, size_t n)
{
	if (h->md)
		EVP_DigestUpdate(h->md, buf, n);
}

int content_hash_final(struct content_hash *h, char xxh_hex[33], int *id_matches)
{
	int match = -1;

	xxh128_hex(XXH3_128bits_digest(h->xxh), xxh_hex);
	h->id_hex[0] = '\0';
	if (h->md) {
		unsigned char md[EVP_MAX_MD_SIZE];
		unsigned int len = 0;

		if (!EVP_DigestFinal_ex(h->md, md, &len))
			return -EIO;
		to_hex(md, len, h->id_hex);
		match = strcmp(h->id_hex, h->expected) == 0;
	}
	if (id_matches)
		*id_matches = match;
	return 0;
}

void content_hash_free(struct content_hash *h)
{
	if (h->xxh)
		XXH3_freeState(h->xxh);
	if (h->md)
		EVP_MD_CTX_free(h->md);
	h->xxh = NULL;
	h->md = NULL;
}

int sample_hash_init(struct sample_hash *s, uint64_t size)
{
	unsigned char le[8];

	memset(s, 0, sizeof(*s));
	s->xxh = XXH3_createState();
	if (!s->xxh)
		return -ENOMEM;
	XXH3_128bits_reset(s->xxh);
	for (int i = 0; i < 8; i++)
		le[i] = (unsigned char)(size >> (8 * i));
	XXH3_128bits_update(s->xxh, le, sizeof(le));

	if (size <= 3 * SAMPLE_REGION) {
		s->off[0] = 0;
		s->len[0] = size;
		s->n = 1;
	} else {
		/* size >= 3 regions keeps them disjoint and in order */
		s->off[0] = 0;
		s->off[1] = (size - SAMPLE_REGION) / 2;
		s->off[2] = size - SAMPLE_REGION;
		s->len[0] = s->len[1] = s->len[2] = SAMPLE_REGION;
		s->n = 3;
	}
	return 0;
}

void sample_hash_feed(struct sample_hash *s, uint64_t off, const void *buf, size_t n)
{
	const unsigned char *b = buf;
	uint64_t end = off + n;

	for (int i = 0; i < s->n; i++) {
		uint64_t lo = s->off[i] > off ? s->off[i] : off;
		uint64_t hi = s->off[i] + s->len[i] < end ? s->off[i] + s->len[i] : end;

		if (lo < hi)
			XXH3_128bits_update(s->xxh, b + (lo - off), hi - lo);
	}
}

int sample_hash_final(struct sample_hash *s, char out[33])
{
	xxh128_hex(XXH3_128bits_digest(s->xxh), out);
	return 0;
}

void sample_hash_free(struct sample_hash *s)
{
	if (s->xxh)
		XXH3_freeState(s->xxh);
	s->xxh = NULL;
}

int source_sample(int fd, uint64_t size, char out[33])
{
	struct sample_hash s;
	unsigned char *buf;
	int err = sample_hash_init(&s, size);

	if (err)
		return err;
	buf = malloc(SAMPLE_REGION);
	if (!buf) {
		sample_hash_free(&s);
		return -ENOMEM;
	}
	for (int i = 0; i < s.n && !err; i++) {
		uint64_t pos = s.off[i], end = s.off[i] + s.len[i];

		while (pos < end) {
			size_t want = end - pos < SAMPLE_REGION ? end - pos : SAMPLE_REGION;
			ssize_t r = pread(fd, buf, want, (off_t)pos);

			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				err = -errno;
				break;
			}
			if (r == 0) {
				err = -ENODATA;
				break;
			}
			sample_hash_feed(&s, pos, buf, (size_t)r);
			pos += (uint64_t)r;
		}
	}
	if (!err)
		sample_hash_final(&s, out);
	free(buf);
	sample_hash_free(&s);
	return err;
}
