/* Connection set-up, timed: a client that connects, exchanges one 4-byte message and closes, K
 * times over, and the server it talks to (one thread, one connection at a time).
 *
 *   connects server PORT          answers "ping" with "pong" on each connection, for ever
 *   connects client IP PORT K     prints "connect_us: P50 MEAN" and "rr_us: P50 MEAN" over the
 *                                 last four fifths of the K connections (the first fifth warms up)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

static void report(const char *name, long *v, int n) {
  long sum = 0;
  for (int i = 0; i < n; i++)
    sum += v[i];
  qsort(v, n, sizeof *v, cmp);
  printf("%s: %.1f %.1f\n", name, v[n / 2] / 1000.0, sum / 1000.0 / n);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "server")) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    if (bind(l, (void *)&a, sizeof a) || listen(l, 64)) {
      perror("listen");
      return 1;
    }
    fprintf(stderr, "listening\n");
    for (;;) {
      int c = accept(l, NULL, NULL);
      char b[4];
      if (c < 0)
        continue;
      if (recv(c, b, 4, MSG_WAITALL) == 4 && send(c, "pong", 4, 0) != 4)
        perror("send");
      close(c);
    }
  }
  if (argc == 5 && !strcmp(argv[1], "client")) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    inet_pton(AF_INET, argv[2], &a.sin_addr);
    int k = atoi(argv[4]), warm = k / 5, n = k - warm;
    if (k < 5)
      return 2;
    long *con = calloc(n, sizeof *con), *rr = calloc(n, sizeof *rr);
    for (int i = 0; i < k; i++) {
      int s = socket(AF_INET, SOCK_STREAM, 0);
      char b[4];
      long t0 = ns();
      for (int t = 0; connect(s, (void *)&a, sizeof a); t++) {
        if (t == 100) {
          perror("connect");
          return 1;
        }
        close(s);
        usleep(20000);
        s = socket(AF_INET, SOCK_STREAM, 0);
        t0 = ns();
      }
      long t1 = ns();
      if (send(s, "ping", 4, 0) != 4 || recv(s, b, 4, MSG_WAITALL) != 4 || memcmp(b, "pong", 4)) {
        fprintf(stderr, "no pong\n");
        return 1;
      }
      long t2 = ns();
      close(s);
      if (i >= warm) {
        con[i - warm] = t1 - t0;
        rr[i - warm] = t2 - t1;
      }
    }
    report("connect_us", con, n);
    report("rr_us", rr, n);
    return 0;
  }
  fprintf(stderr, "usage: connects server PORT | connects client IP PORT K\n");
  return 2;
}
