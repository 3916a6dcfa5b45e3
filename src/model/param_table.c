#include "model/param_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

void param_table_add(struct param_table *t, int *cap, const char *name, int unit, int64_t d0,
                     int64_t d1, bool decay)
{
	if (t->count == *cap) {
		*cap = *cap ? 2 * *cap : 64;
		t->p = realloc(t->p, (size_t)*cap * sizeof(*t->p));
		CHECK(t->p, "out of memory");
	}
	struct param_entry *p = &t->p[t->count++];
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->ndim = d1 > 0 ? 2 : 1;
	p->shape[0] = d0;
	p->shape[1] = d1 > 0 ? d1 : 1;
	p->numel = d0 * p->shape[1];
	p->offset = t->numel;
	p->unit = unit;
	p->weight_decay = decay && p->ndim == 2;
	p->tp_dim = -1;
	p->tp_valid = d0;
	p->global_shape[0] = p->shape[0];
	p->global_shape[1] = p->shape[1];
	t->numel += p->numel;
}

void param_table_free(struct param_table *t)
{
	free(t->p);
	free(t->unit_begin);
	memset(t, 0, sizeof(*t));
}

const struct param_entry *param_table_find(const struct param_table *t, const char *name)
{
	for (int i = 0; i < t->count; i++)
		if (strcmp(t->p[i].name, name) == 0)
			return &t->p[i];
	return NULL;
}
