/* An event-loop server with many idle connections and one busy one: what an epoll_wait costs
 * as its set grows (the preload library's epoll looks only at what changed).
 *
 *   idlers server PORT                  epoll over the listener and every connection
 *                                       (level-triggered), echoing what each sends
 *   idlers client IP PORT N SECONDS     N idle connections, then 64 B ping-pongs on one more
 *                                       for SECONDS; prints "idle N: R round trips/s, p50 U us"
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int server(int port) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (bind(l, (void *)&a, sizeof a) || listen(l, 4096)) {
    perror("listen");
    return 1;
  }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
  epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
  struct epoll_event out[64];
  char buf[4096];
  for (;;) {
    int n = epoll_wait(ep, out, 64, -1);
    for (int i = 0; i < n; i++) {
      int fd = out[i].data.fd;
      if (fd == l) {
        int c = accept(l, NULL, NULL);
        if (c < 0)
          continue;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
        continue;
      }
      ssize_t k = read(fd, buf, sizeof buf);
      if (k <= 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
        close(fd);
      } else if (write(fd, buf, k) != k) {
        perror("write");
      }
    }
  }
}

static int dial(const char *ip, int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, ip, &a.sin_addr);
  if (connect(s, (void *)&a, sizeof a)) {
    perror("connect");
    exit(1);
  }
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

static int client(const char *ip, int port, int idle, double secs) {
  for (int i = 0; i < idle; i++)
    dial(ip, port);
  int s = dial(ip, port);
  char m[64] = "ping", r[64];
  static double lat[4000000];
  long n = 0;
  double t0 = now(), end = t0 + secs;
  for (double t = t0; t < end; n++) {
    double a = now();
    if (write(s, m, 64) != 64)
      return 2;
    for (int got = 0; got < 64;) {
      ssize_t k = read(s, r + got, 64 - got);
      if (k <= 0)
        return 3;
      got += k;
    }
    t = now();
    if (n < 4000000)
      lat[n] = t - a;
  }
  double el = now() - t0;
  long k = n < 4000000 ? n : 4000000;
  qsort(lat, k, sizeof lat[0], cmp);
  printf("idle %d: %.0f round trips/s, p50 %.2f us, p99 %.2f us\n", idle, n / el,
         lat[k / 2] * 1e6, lat[k * 99 / 100] * 1e6);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 3 && !strcmp(argv[1], "server"))
    return server(atoi(argv[2]));
  if (argc == 6 && !strcmp(argv[1], "client"))
    return client(argv[2], atoi(argv[3]), atoi(argv[4]), atof(argv[5]));
  fprintf(stderr, "usage: idlers server PORT | idlers client IP PORT N SECONDS\n");
  return 2;
}
