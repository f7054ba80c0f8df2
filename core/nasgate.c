/* nasgate.c - NAS calls with a deadline; the NAS's up/down state; the
 * prober.  See nasgate.h.
 *
 * A job lives on its caller's stack while the caller waits.  The NAS
 * thread that runs it copies what it needs (fn, arg, release) into its own
 * slot first, so a caller that gives up can leave at once: under the lock
 * it detaches the job from the slot (the slot is then "abandoned": the
 * thread calls release instead of answering), or unlinks it from the queue
 * if no thread took it yet.
 */
#include "clock.h"
#include "nasgate.h"
#include "thread.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <syslog.h>
#include <time.h>

enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

/* A NAS thread's current call.  Rules: the thread's own, except @job and
 * @abandoned, which are under gate.lock. */
struct nas_slot {
	struct nas_job *job;    /* LOCK: the caller's job, NULL once abandoned */
	int abandoned;          /* LOCK: the caller left: release the arg, answer nobody */
};

/* Rules: set by the caller before it is queued; @state, @result and @slot
 * under gate.lock. */
struct nas_job {
	struct nas_job *next;
	int (*fn)(void *arg);
	void *arg;
	void (*release)(void *arg);
	int on_fd;              /* JOB_ON_FD was given */
	enum job_state state;
	int64_t start_ms;       /* mono_ms() when a NAS thread took it */
	int result;
	struct nas_slot *slot;
	pthread_cond_t done;    /* CLOCK_MONOTONIC */
};

static void cond_init_mono(pthread_cond_t *c)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(c, &a);
	pthread_condattr_destroy(&a);
}

static void gate_log(struct nas_gate *g, int prio, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void gate_log(struct nas_gate *g, int prio, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (!g->log)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	g->log(g->log_arg, prio, msg);
}

int nas_gate_unavailable(int err)
{
	/* (a positive value is a result -- 100 bytes read, descriptor 107 --
	 * never ENETDOWN or ENOTCONN) */
	if (err >= 0)
		return 0;
	switch (-err) {
	case ENOTCONN: case ETIMEDOUT: case EHOSTDOWN: case EHOSTUNREACH:
	case ENETDOWN: case ENETUNREACH: case ECONNREFUSED: case ECONNRESET:
	case ECONNABORTED: case ENODEV: case ESHUTDOWN: case ENOMEDIUM:
		return 1;
	default:
		return 0;
	}
}

/* The log line is written by the caller, after the lock: one per outage. */
static int set_down_locked(struct nas_gate *g, const char *reason)
{
	struct timespec ts;

	if (!atomic_load(&g->up))
		return 0;
	clock_gettime(CLOCK_REALTIME, &ts);
	atomic_store_explicit(&g->up, 0, memory_order_release);
	g->since = ts.tv_sec;
	snprintf(g->reason, sizeof(g->reason), "%s", reason);
	atomic_fetch_add(&g->outages, 1);
	atomic_fetch_add(&g->generation, 1);
	pthread_cond_broadcast(&g->probe);
	pthread_cond_broadcast(&g->changed);
	return 1;
}

static void set_down(struct nas_gate *g, const char *reason)
{
	int now_down;

	pthread_mutex_lock(&g->lock);
	now_down = set_down_locked(g, reason);
	pthread_mutex_unlock(&g->lock);
	if (now_down)
		gate_log(g, LOG_WARNING, "NAS %s is down: %s; local revisions are served from the "
			 "local record, everything else fails with EIO until it answers again",
			 g->root, reason);
}

void nas_gate_set_down(struct nas_gate *g, const char *reason)
{
	if (g)
		set_down(g, reason);
}

/* How a job is run (run_job's @flags). */
#define JOB_FORCE 1 /* even while down (the prober) */
#define JOB_ON_FD 2 /* on a descriptor opened earlier (nas_call_on_fd) */

/* What a call's result says of the NAS: down, worth a probe, or nothing.
 * @on_fd: the call used a descriptor opened earlier, which may be of a
 * mount since gone while the NAS path answers again: its "unreachable"
 * asks the prober, whose look at NAS_HUB says down or not. */
static void judge(struct nas_gate *g, int r, int on_fd)
{
	char why[96];

	if (r >= 0)
		return;
	if (r == -ENOMEDIUM) {
		pthread_mutex_lock(&g->lock);
		g->need_entries = 1;
		pthread_mutex_unlock(&g->lock);
		set_down(g, NAS_GONE_WHY);
	} else if (nas_gate_unavailable(r) && !on_fd) {
		snprintf(why, sizeof(why), "a call failed: %s", strerror(-r));
		set_down(g, why);
	} else if (r == -EIO || r == -ESTALE || nas_gate_unavailable(r)) {
		pthread_mutex_lock(&g->lock);
		g->probe_now = 1;
		pthread_cond_broadcast(&g->probe);
		pthread_mutex_unlock(&g->lock);
	}
}

/* A call passed its deadline: counted, and the NAS is down. */
static void deadline_passed(struct nas_gate *g)
{
	char why[96];

	atomic_fetch_add(&g->timeouts, 1);
	snprintf(why, sizeof(why), "a call took longer than %u ms", g->timeout_ms);
	set_down(g, why);
}

void nas_gate_note(struct nas_gate *g, int err)
{
	if (g)
		judge(g, err > 0 ? -err : err, 0);
}

/* The prober's look at @root (NAS_HUB): 0 or -errno.  A NAS call. */
static int nas_root_check(const char *root)
{
	struct statvfs sv;
	struct stat st;

	/* stat may be answered from an NFS client's attribute cache; statfs
	 * always asks the server. */
	if (stat(root, &st) < 0 || statvfs(root, &sv) < 0)
		return -errno;
	return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

/* ---- the NAS threads ---- */

static void *nas_thread(void *arg)
{
	struct nas_gate *g = arg;
	struct nas_slot slot = { 0 };

	pthread_setname_np(pthread_self(), "wfs-nas");
	pthread_mutex_lock(&g->lock);
	g->starting--;
	for (;;) {
		struct nas_job *j;
		int (*fn)(void *);
		void (*release)(void *);
		void *fa;
		int r, rr, on_fd;

		while (!g->stop && !g->qhead) {
			g->idle++;
			pthread_cond_wait(&g->work, &g->lock);
			g->idle--;
		}
		if (!g->qhead)
			break; /* stopping */
		j = g->qhead;
		g->qhead = j->next;
		if (!g->qhead)
			g->qtail = NULL;
		g->queued--;
		j->state = JOB_RUNNING;
		j->start_ms = mono_ms();
		j->slot = &slot;
		slot.job = j;
		slot.abandoned = 0;
		fn = j->fn;
		fa = j->arg;
		release = j->release;
		on_fd = j->on_fd;
		pthread_mutex_unlock(&g->lock);

		r = fn(fa);
		/* EIO or ESTALE say the NAS is down only if NAS_HUB fails too:
		 * asked now, on this thread, within the caller's deadline, so
		 * that the caller (a reader of a local revision, say) is answered
		 * from what is kept rather than with the error while the prober
		 * makes up its mind.  (A read's descriptor: its caller looks.) */
		if ((r == -EIO || r == -ESTALE) && !on_fd && (rr = nas_root_check(g->root)) < 0) {
			char why[96];

			snprintf(why, sizeof(why), "NAS_HUB itself fails: %s", strerror(-rr));
			set_down(g, why);
			r = -EHOSTDOWN;
		}

		pthread_mutex_lock(&g->lock);
		g->answered++;
		if (slot.abandoned) {
			g->stuck--;
			pthread_cond_broadcast(&g->changed);
			pthread_mutex_unlock(&g->lock);
			if (release)
				release(fa);
			judge(g, r, on_fd);
			pthread_mutex_lock(&g->lock);
		} else {
			slot.job->result = r;
			slot.job->state = JOB_DONE;
			pthread_cond_signal(&slot.job->done);
		}
		slot.job = NULL;
	}
	g->threads--;
	pthread_cond_broadcast(&g->changed);
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

/* With the lock held, a job just queued: wake an idle thread, and start one
 * more while the queued jobs outnumber the threads on their way to the
 * queue (idle or starting).  A woken thread counts as idle until it takes
 * the lock again, so every caller of a burst (the kernel's readahead sends
 * several READs at once) would see the same idle thread and only wake it:
 * the jobs would queue behind one thread, on a NAS slow but within
 * nas_timeout, until their callers gave up waiting for a thread. */
static int want_thread_locked(struct nas_gate *g)
{
	pthread_attr_t a;
	pthread_t t;
	int r;

	if (g->idle > 0)
		pthread_cond_signal(&g->work);
	if (g->queued <= g->idle + g->starting)
		return 0;
	if (g->threads >= NAS_GATE_THREADS)
		return 0; /* a busy thread takes it when done */
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256 * 1024);
	r = thread_start(&t, &a, nas_thread, g);
	pthread_attr_destroy(&a);
	if (r)
		return r;
	g->threads++;
	g->starting++;
	return 0;
}

static void unqueue_locked(struct nas_gate *g, struct nas_job *j)
{
	struct nas_job **pp = &g->qhead, *prev = NULL;

	for (; *pp; prev = *pp, pp = &(*pp)->next)
		if (*pp == j) {
			*pp = j->next;
			if (g->qtail == j)
				g->qtail = prev;
			g->queued--;
			return;
		}
}

/* How a caller's wait for its job ended (wait_job_locked). */
enum wait_end {
	WAIT_DONE, /* answered */
	WAIT_LATE, /* the NAS held it past the deadline, or held every thread
		    * while it waited for one: the NAS is down */
	WAIT_BUSY, /* no thread free within nas_timeout, the threads answering
		    * others all along: a slow NAS with more calls than threads */
};

/* Under the lock: wait for @j (queued).  The deadline is the NAS's: the
 * call is late once a NAS thread has held it nas_timeout (with @progress,
 * nas_timeout past its last answer).  A call still queued nas_timeout after
 * it came is given up: late if no NAS thread ended a call meanwhile and
 * no call of many operations got answers (each thread is held in the NAS
 * that long: hung), busy if they did.  So a caller waits at most
 * nas_timeout for a thread and nas_timeout on the NAS, and time spent
 * queued behind calls the NAS answers never marks it down. */
static enum wait_end wait_job_locked(struct nas_gate *g, struct nas_job *j,
				     _Atomic uint64_t *progress)
{
	uint64_t seen = progress ? atomic_load(progress) : 0, answered = g->answered, now;
	int64_t until = mono_ms() + g->timeout_ms;

	while (j->state != JOB_DONE) {
		struct timespec dl = mono_timespec(until);

		if (pthread_cond_timedwait(&j->done, &g->lock, &dl) != ETIMEDOUT ||
		    j->state == JOB_DONE)
			continue;
		if (j->state == JOB_QUEUED)
			return g->answered != answered ? WAIT_BUSY : WAIT_LATE;
		until = j->start_ms + g->timeout_ms;
		if (progress && (now = atomic_load(progress)) != seen) {
			seen = now; /* answers came since the deadline was set: not hung */
			until = mono_ms() + g->timeout_ms;
			g->answered++; /* so a call queued behind this one is not late */
		}
		if (until <= mono_ms())
			return WAIT_LATE;
	}
	return WAIT_DONE;
}

/* A call found no free NAS thread in time (WAIT_BUSY): counted, and said
 * at most once a second (a burst gives up many at once). */
static void gave_up_busy(struct nas_gate *g)
{
	uint64_t n = atomic_fetch_add(&g->busy, 1) + 1;
	int64_t now = mono_ms();
	int say;

	pthread_mutex_lock(&g->lock);
	say = !g->busy_said_ms || now - g->busy_said_ms >= 1000;
	if (say)
		g->busy_said_ms = now;
	pthread_mutex_unlock(&g->lock);
	if (say)
		gate_log(g, LOG_WARNING, "NAS %s: a call waited %u ms for one of the %d NAS threads, "
			 "all in calls the NAS answers slowly; refused (EBUSY), the NAS is not taken "
			 "for down (%llu such calls so far)", g->root, g->timeout_ms,
			 NAS_GATE_THREADS, (unsigned long long)n);
}

/* Run a job, as @flags (JOB_*) say; @progress: nas_call_progress's. */
static int run_job(struct nas_gate *g, int (*fn)(void *), void *arg, void (*release)(void *),
		   int flags, _Atomic uint64_t *progress)
{
	struct nas_job j = { .fn = fn, .arg = arg, .release = release, .state = JOB_QUEUED,
			     .on_fd = !!(flags & JOB_ON_FD) };
	enum wait_end end;
	int r, refused;

	pthread_mutex_lock(&g->lock);
	refused = !(flags & JOB_FORCE) && !atomic_load_explicit(&g->up, memory_order_acquire);
	if (!refused && g->stuck >= NAS_GATE_THREADS) {
		refused = 1;
		set_down_locked(g, "every NAS thread is stuck in a call");
	}
	if (refused || g->stop) {
		pthread_mutex_unlock(&g->lock);
		atomic_fetch_add(&g->failed_down, 1);
		return -EHOSTDOWN;
	}
	cond_init_mono(&j.done);
	if (g->qtail)
		g->qtail->next = &j;
	else
		g->qhead = &j;
	g->qtail = &j;
	g->queued++;
	if ((r = want_thread_locked(g)) < 0 && g->threads == 0) {
		unqueue_locked(g, &j);
		pthread_mutex_unlock(&g->lock);
		pthread_cond_destroy(&j.done);
		return r;
	}
	end = wait_job_locked(g, &j, progress);
	if (end == WAIT_DONE) {
		/* -ETIMEDOUT from nas_call means "the gate owns @arg now": a call
		 * that timed out by itself (a soft NFS mount) says so otherwise */
		r = j.result == -ETIMEDOUT ? -ENOTCONN : j.result;
	} else if (j.state == JOB_QUEUED) {
		unqueue_locked(g, &j); /* never ran */
		r = end == WAIT_BUSY ? -EBUSY : -ETIMEDOUT;
	} else {
		j.slot->job = NULL;
		j.slot->abandoned = 1;
		g->stuck++;
		release = NULL; /* the thread's, when fn ends */
		r = -ETIMEDOUT;
	}
	pthread_mutex_unlock(&g->lock);
	pthread_cond_destroy(&j.done);
	if (end == WAIT_BUSY) {
		gave_up_busy(g); /* @arg stays the caller's: fn never ran */
	} else if (end == WAIT_LATE) {
		deadline_passed(g);
		if (release)
			release(arg);
	} else {
		judge(g, r, j.on_fd);
	}
	return r;
}

int nas_call(struct nas_gate *g, int (*fn)(void *arg), void *arg, void (*release)(void *arg))
{
	if (!g) {
		int r = fn(arg);

		return r == -ETIMEDOUT ? -ENOTCONN : r;
	}
	return run_job(g, fn, arg, release, 0, NULL);
}

int nas_call_on_fd(struct nas_gate *g, int (*fn)(void *arg), void *arg,
		   void (*release)(void *arg))
{
	if (!g)
		return nas_call(g, fn, arg, release);
	return run_job(g, fn, arg, release, JOB_ON_FD, NULL);
}

int nas_call_progress(struct nas_gate *g, int (*fn)(void *arg), void *arg,
		      void (*release)(void *arg), _Atomic uint64_t *progress)
{
	if (!g)
		return nas_call(g, fn, arg, release);
	return run_job(g, fn, arg, release, 0, progress);
}

int nas_gate_admit(struct nas_gate *g)
{
	if (atomic_load_explicit(&g->up, memory_order_acquire))
		return 0;
	atomic_fetch_add(&g->failed_down, 1);
	return -EHOSTDOWN;
}

void nas_gate_done(struct nas_gate *g, int r)
{
	if (r == -ETIMEDOUT)
		deadline_passed(g);
	else
		judge(g, r, 1);
}

/* ---- the prober ---- */

struct probe_arg {
	struct nas_gate *g;
	char root[4096];
	int need_entries;       /* the gate's, when the probe started */
};

int nas_root_gone(const char *root)
{
	struct dirent *e;
	DIR *d = opendir(root);
	int r = 1;

	if (!d)
		return errno == ENOENT || errno == ENOTDIR ? 1 : -errno;
	errno = 0;
	while (r == 1 && (e = readdir(d)))
		r = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
	if (r == 1 && errno)
		r = -errno;
	closedir(d);
	return r;
}

int nas_missing_or_gone(const char *root, int hub, int err)
{
	if ((err == -ENOENT || err == -ENOTDIR) && *root && nas_root_gone(root) == 1)
		return hub ? -ENOMEDIUM : -ENOLINK;
	return err;
}

const char *nas_err_why(int err)
{
	return err == -ENOMEDIUM ? NAS_GONE_WHY : err == -ENOLINK ? NAS_ROOT_GONE_WHY :
	       strerror(-err);
}

static int probe_fn(void *arg)
{
	struct probe_arg *p = arg;
	int r = nas_root_check(p->root);

	/* An empty directory answers a stat at once: the mount point of a NAS
	 * not mounted (yet, or any more) does. */
	if (r == 0 && p->need_entries && (r = nas_root_gone(p->root)) != 0)
		return r == 1 ? -ENOMEDIUM : r;
	return r;
}

/* A probe that passed its deadline ended: the NAS answered something, so
 * probe again now rather than after the backoff. */
static void probe_release(void *arg)
{
	struct probe_arg *p = arg;
	struct nas_gate *g = p->g;

	pthread_mutex_lock(&g->lock);
	g->probe_busy = 0;
	g->probe_now = 1;
	pthread_cond_broadcast(&g->probe);
	pthread_mutex_unlock(&g->lock);
	free(p);
}

static int probe_once(struct nas_gate *g)
{
	struct probe_arg *p = malloc(sizeof(*p));
	int r;

	if (!p)
		return -ENOMEM;
	p->g = g;
	snprintf(p->root, sizeof(p->root), "%s", g->root);
	pthread_mutex_lock(&g->lock);
	p->need_entries = g->need_entries;
	g->probe_busy = 1;
	pthread_mutex_unlock(&g->lock);
	r = run_job(g, probe_fn, p, probe_release, JOB_FORCE, NULL);
	if (r != -ETIMEDOUT) {
		pthread_mutex_lock(&g->lock);
		g->probe_busy = 0;
		pthread_mutex_unlock(&g->lock);
		free(p);
	}
	return r;
}

static void set_up(struct nas_gate *g)
{
	struct timespec ts;
	int64_t was = 0;
	int changed = 0;

	clock_gettime(CLOCK_REALTIME, &ts);
	pthread_mutex_lock(&g->lock);
	g->need_entries = 0;
	if (!atomic_load(&g->up)) {
		was = g->since;
		g->since = ts.tv_sec;
		atomic_store_explicit(&g->up, 1, memory_order_release);
		atomic_fetch_add(&g->generation, 1);
		pthread_cond_broadcast(&g->changed);
		changed = 1;
	}
	pthread_mutex_unlock(&g->lock);
	if (changed)
		gate_log(g, LOG_NOTICE, "NAS %s is up again (down %lld s)", g->root,
			 (long long)(ts.tv_sec - was));
}

static void *prober(void *arg)
{
	struct nas_gate *g = arg;
	int64_t backoff = NAS_GATE_PROBE_MIN_MS;

	pthread_setname_np(pthread_self(), "wfs-nasprobe");
	pthread_mutex_lock(&g->lock);
	while (!g->stop) {
		int down = !atomic_load(&g->up), asked = g->probe_now, r;

		/* One probe at a time: one stuck in a hung NAS holds a thread
		 * already, and its end is the first sign the NAS is back. */
		if (g->probe_busy || (!down && !asked)) {
			backoff = NAS_GATE_PROBE_MIN_MS;
			pthread_cond_wait(&g->probe, &g->lock);
			continue;
		}
		g->probe_now = 0;
		pthread_mutex_unlock(&g->lock);
		r = probe_once(g);
		if (r == 0) {
			set_up(g);
		} else if (!down && r != -EBUSY) { /* an EIO or ESTALE the root confirms */
			char why[128];

			snprintf(why, sizeof(why), "NAS_HUB itself fails: %s", strerror(-r));
			set_down(g, why);
		}
		pthread_mutex_lock(&g->lock);
		if (r != 0 && !g->stop) {
			struct timespec dl = mono_timespec(mono_ms() + backoff);

			pthread_cond_timedwait(&g->probe, &g->lock, &dl);
			backoff = backoff * 2 > NAS_GATE_PROBE_MAX_MS ? NAS_GATE_PROBE_MAX_MS
								       : backoff * 2;
		}
	}
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

/* ---- life cycle, state ---- */

int nas_gate_init(struct nas_gate *g, const char *root, unsigned timeout_ms,
		  void (*log)(void *arg, int prio, const char *msg), void *log_arg)
{
	struct timespec ts;

	memset(g, 0, sizeof(*g));
	if (snprintf(g->root, sizeof(g->root), "%s", root) >= (int)sizeof(g->root))
		return -ENAMETOOLONG;
	g->timeout_ms = timeout_ms ? timeout_ms : NAS_GATE_TIMEOUT_MS;
	g->log = log;
	g->log_arg = log_arg;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->work, NULL);
	cond_init_mono(&g->probe);
	cond_init_mono(&g->changed);
	clock_gettime(CLOCK_REALTIME, &ts);
	g->since = ts.tv_sec;
	atomic_store(&g->up, 1);
	return 0;
}

int nas_gate_start(struct nas_gate *g)
{
	int r = thread_start(&g->prober, NULL, prober, g);

	if (r)
		return r;
	g->started = 1;
	return 0;
}

void nas_gate_destroy(struct nas_gate *g)
{
	struct timespec dl = mono_timespec(mono_ms() + 2000);
	int left;

	pthread_mutex_lock(&g->lock);
	g->stop = 1;
	pthread_cond_broadcast(&g->work);
	pthread_cond_broadcast(&g->probe);
	pthread_mutex_unlock(&g->lock);
	if (g->started)
		pthread_join(g->prober, NULL);
	g->started = 0;
	/* Idle threads end now; one stuck in the NAS ends when the NAS lets
	 * it -- not waited for past a bound (the process is leaving). */
	pthread_mutex_lock(&g->lock);
	while (g->threads > g->stuck &&
	       pthread_cond_timedwait(&g->changed, &g->lock, &dl) != ETIMEDOUT)
		;
	left = (int)g->threads;
	pthread_mutex_unlock(&g->lock);
	if (left)
		gate_log(g, LOG_WARNING, "NAS %s: %d calls still stuck at exit", g->root, left);
	/* The lock and conds stay: a stuck thread may still take them. */
}

int nas_cannot_answer(int r)
{
	return r == -ETIMEDOUT || r == -EHOSTDOWN || r == -EBUSY || nas_gate_unavailable(r);
}

int nas_gate_up(struct nas_gate *g)
{
	return !g || atomic_load_explicit(&g->up, memory_order_acquire);
}

void nas_gate_count_record(struct nas_gate *g)
{
	if (g)
		atomic_fetch_add_explicit(&g->from_record, 1, memory_order_relaxed);
}

void nas_gate_stats(struct nas_gate *g, struct nas_gate_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!g) {
		out->up = 1;
		return;
	}
	pthread_mutex_lock(&g->lock);
	out->up = atomic_load(&g->up);
	out->since = g->since;
	out->stuck = g->stuck;
	snprintf(out->reason, sizeof(out->reason), "%s", g->reason);
	pthread_mutex_unlock(&g->lock);
	out->outages = atomic_load(&g->outages);
	out->timeouts = atomic_load(&g->timeouts);
	out->failed_down = atomic_load(&g->failed_down);
	out->busy = atomic_load(&g->busy);
	out->from_record = atomic_load_explicit(&g->from_record, memory_order_relaxed);
}

uint64_t nas_gate_wait_change(struct nas_gate *g, uint64_t gen, int64_t timeout_ms)
{
	struct timespec dl = mono_timespec(mono_ms() + timeout_ms);
	uint64_t now;

	if (!g)
		return gen;
	pthread_mutex_lock(&g->lock);
	while ((now = atomic_load(&g->generation)) == gen &&
	       pthread_cond_timedwait(&g->changed, &g->lock, &dl) != ETIMEDOUT)
		;
	now = atomic_load(&g->generation);
	pthread_mutex_unlock(&g->lock);
	return now;
}
