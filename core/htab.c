/* htab.c - see htab.h. */
#include "htab.h"

#include <errno.h>
#include <stdlib.h>

int htab_init(struct htab *t, size_t nb)
{
	size_t n = 1;

	while (n < nb)
		n <<= 1;
	t->b = calloc(n, sizeof(*t->b));
	t->nb = t->b ? n : 0;
	t->count = 0;
	return t->b ? 0 : -ENOMEM;
}

void htab_free(struct htab *t)
{
	free(t->b);
	t->b = NULL;
	t->nb = t->count = 0;
}

static void grow(struct htab *t)
{
	size_t nb = t->nb * 2;
	struct hlink **b = calloc(nb, sizeof(*b));

	if (!b)
		return; /* keep the longer chains */
	for (size_t i = 0; i < t->nb; i++) {
		struct hlink *l = t->b[i], *next;

		for (; l; l = next) {
			next = l->next;
			l->next = b[l->hash & (nb - 1)];
			b[l->hash & (nb - 1)] = l;
		}
	}
	free(t->b);
	t->b = b;
	t->nb = nb;
}

void htab_add(struct htab *t, struct hlink *l, uint64_t hash)
{
	if (t->count + 1 > t->nb)
		grow(t);
	l->hash = hash;
	l->next = t->b[hash & (t->nb - 1)];
	t->b[hash & (t->nb - 1)] = l;
	t->count++;
}

int htab_del(struct htab *t, struct hlink *l)
{
	struct hlink **pp = &t->b[l->hash & (t->nb - 1)];

	for (; *pp; pp = &(*pp)->next)
		if (*pp == l) {
			*pp = l->next;
			l->next = NULL;
			t->count--;
			return 0;
		}
	return -ENOENT;
}
