/* parallel/engine: begin the layout's step, run its schedule. */
#include "parallel/engine.h"

int engine_step(const struct engine *e, const struct engine_step_in *in)
{
	const struct sched *s = NULL;
	struct sched_record *rec = NULL;
	int rc = e->begin(e->ctx, in, &s, &rec);
	if (rc)
		return rc;
	return sched_exec_run(s, &e->be, e->stream, rec);
}
