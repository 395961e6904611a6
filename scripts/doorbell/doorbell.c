// Wake-up primitives side by side: N pairs of processes ping-pong a counter in shared memory,
// nothing pinned, and wake each other with
//   futex  FUTEX_WAKE on a shared futex word (what DockLib does), the waiter in FUTEX_WAIT;
//   pipe   a one-byte write to a pipe, the waiter in read(2): the kernel wakes it with the sync
//          hint (WF_SYNC), which asks the scheduler to keep partners on the waker's core;
//   yield  the futex, but the waiter first yields up to 20 times before it sleeps.
// Prints one line: mode, pairs, mean of the pairs' one-way p50 and p99 (round trip / 2, us),
// and round trips per second summed over the pairs.
//
//   doorbell MODE PAIRS SECONDS
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { FUTEX, PIPE, YIELD };
#define MAX_SAMPLES 4000000L

struct pair {
	_Atomic unsigned w[2];
	char pad[56];
};
struct result {
	double p50, p99;
	long n;
};

static long now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;
	return (x > y) - (x < y);
}

static void ring(int mode, _Atomic unsigned *w, int fd)
{
	atomic_fetch_add(w, 1);
	if (mode == PIPE) {
		if (write(fd, "x", 1) != 1)
			_exit(1);
	} else {
		syscall(SYS_futex, w, FUTEX_WAKE, 1, NULL, NULL, 0);
	}
}

static unsigned await(int mode, _Atomic unsigned *w, unsigned seen, int fd)
{
	char c;
	if (mode == PIPE) {
		if (read(fd, &c, 1) != 1)
			_exit(1);
		return atomic_load(w);
	}
	int spins = 0;
	while (atomic_load(w) == seen) {
		if (mode == YIELD && spins++ < 20) {
			sched_yield();
			continue;
		}
		syscall(SYS_futex, w, FUTEX_WAIT, seen, NULL, NULL, 0);
	}
	return atomic_load(w);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: doorbell futex|pipe|yield PAIRS SECONDS\n");
		return 2;
	}
	int mode = !strcmp(argv[1], "pipe") ? PIPE : !strcmp(argv[1], "yield") ? YIELD : FUTEX;
	if (mode == FUTEX && strcmp(argv[1], "futex")) {
		fprintf(stderr, "doorbell: unknown mode %s\n", argv[1]);
		return 2;
	}
	int pairs = atoi(argv[2]);
	double secs = atof(argv[3]);
	if (pairs < 1 || pairs > 512 || secs <= 0) {
		fprintf(stderr, "doorbell: 1-512 pairs, a positive duration\n");
		return 2;
	}
	struct pair *sh = mmap(0, sizeof(*sh) * pairs, PROT_READ | PROT_WRITE,
			       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct result *res = mmap(0, sizeof(*res) * pairs, PROT_READ | PROT_WRITE,
				  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED || res == MAP_FAILED)
		return 1;
	for (int p = 0; p < pairs; p++) {
		int a2b[2], b2a[2];
		if (pipe(a2b) || pipe(b2a))
			return 1;
		for (int side = 0; side < 2; side++) {
			if (fork())
				continue;
			_Atomic unsigned *mine = &sh[p].w[side], *theirs = &sh[p].w[1 - side];
			int rfd = side ? a2b[0] : b2a[0], wfd = side ? b2a[1] : a2b[1];
			unsigned seen = 0;
			if (side == 1) { // the server: answers until told to stop
				for (;;) {
					seen = await(mode, mine, seen, rfd);
					if (seen == 0xffffffffu)
						_exit(0);
					ring(mode, theirs, wfd);
				}
			}
			long *lat = malloc(sizeof(long) * MAX_SAMPLES), n = 0;
			long end = now() + (long)(secs * 1e9);
			while (now() < end && n < MAX_SAMPLES) {
				long t0 = now();
				ring(mode, theirs, wfd);
				seen = await(mode, mine, seen, rfd);
				lat[n++] = now() - t0;
			}
			qsort(lat, n, sizeof(long), cmp);
			res[p] = (struct result){lat[n / 2] / 2000.0, lat[n * 99 / 100] / 2000.0, n};
			atomic_store(theirs, 0xffffffffu - 1);
			ring(mode, theirs, wfd);
			_exit(0);
		}
		close(a2b[0]), close(a2b[1]), close(b2a[0]), close(b2a[1]);
	}
	while (wait(NULL) > 0)
		;
	double p50 = 0, p99 = 0;
	long n = 0;
	for (int p = 0; p < pairs; p++)
		p50 += res[p].p50, p99 += res[p].p99, n += res[p].n;
	printf("%-6s %4d pairs  p50 %8.2f us  p99 %8.2f us  %9.0f round trips/s\n", argv[1], pairs,
	       p50 / pairs, p99 / pairs, n / secs);
	return 0;
}
