/* Servers that fork after they listen, and programs that daemonize: the same outcomes on kernel
 * sockets and over DockNet (where the pipe's stack moves whole to the first worker that uses
 * the listener, and the others never see a connection).
 *
 *   prefork workers PORT N      listen (non-blocking), fork N workers that each wait in epoll for
 *                               the listener, accept, and answer "ping" with "pong"; the parent
 *                               only waits, as nginx's master does
 *   prefork blocking PORT N     the same with workers blocked in accept (Apache's prefork)
 *   prefork workers PORT N MS   the same, but the parent waits 50 ms after it listens before it
 *                               forks, and the workers MS before they use the listener (a
 *                               worker that first loads its application, as gunicorn's does)
 *   prefork daemon PORT         fork at once and let the parent exit; the child listens (a
 *                               program that daemonizes before it opens its sockets)
 *   prefork daemon-late PORT    listen, then fork; the parent exits, the child serves
 *   prefork client IP PORT K    K connections, one after another: "ping", expect "pong"; then
 *                               one "quit", which ends the server
 *
 * The server prints how many connections were answered in all ("served: K"), the client how
 * many answers it got. A connection's "quit" ends the server: the worker that takes it tells
 * the parent over a pipe made before the fork, and the parent ends the workers (SIGTERM, sent
 * again until each ends) and adds up what each served (its exit status). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "listen.h"

static volatile sig_atomic_t stop;
static void on_term(int s) {
  (void)s;
  stop = 1;
}

/* One connection: 1 for a "ping" answered, 0 for anything else; a "quit" is told on `quit`. */
static int serve_one(int c, int quit) {
  char b[4];
  int r = 0;
  if (recv(c, b, 4, MSG_WAITALL) == 4) {
    if (!memcmp(b, "ping", 4)) {
      r = send(c, "pong", 4, 0) == 4;
    } else if (!memcmp(b, "quit", 4)) {
      send(c, "bye!", 4, 0);
      if (write(quit, "q", 1) < 0)
        perror("write");
    }
  }
  close(c);
  return r;
}

static int worker_epoll(int l, int quit, int wait_ms) {
  usleep(wait_ms * 1000);
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev)) {
    perror("epoll_ctl");
    return 0;
  }
  int served = 0;
  while (!stop) {
    struct epoll_event out[4];
    if (epoll_wait(ep, out, 4, 200) <= 0)
      continue;
    for (;;) {
      int c = accept4(l, NULL, NULL, 0);
      if (c < 0)
        break;
      served += serve_one(c, quit);
    }
  }
  return served;
}

static int worker_blocking(int l, int quit) {
  int served = 0;
  while (!stop) {
    int c = accept(l, NULL, NULL);
    if (c >= 0)
      served += serve_one(c, quit);
    else if (errno != EINTR && errno != EAGAIN)
      perror("accept");
  }
  return served;
}

/* Forks `n` workers on `l`, waits for a "quit", ends them and prints what they served. */
static int run_workers(int l, int n, int blocking, int wait_ms) {
  if (wait_ms > 0)
    usleep(50000);
  int q[2];
  if (pipe(q)) {
    perror("pipe");
    return 1;
  }
  pid_t pids[16];
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      close(q[0]);
      _exit(blocking ? worker_blocking(l, q[1]) : worker_epoll(l, q[1], wait_ms));
    }
  }
  printf("workers: %d\n", n);
  char c;
  while (read(q[0], &c, 1) < 0 && errno == EINTR) {
  }
  /* SIGTERM again every 20 ms until each worker ends, as a supervisor would: a SIGTERM that
   * lands after a worker's look at `stop` and before its accept begins finds no call to
   * interrupt (on kernel sockets too), and that worker would wait for a connection forever */
  int served = 0;
  for (int i = 0; i < n; i++) {
    int st = 0;
    pid_t r;
    do {
      kill(pids[i], SIGTERM);
      r = waitpid(pids[i], &st, WNOHANG);
      if (r == 0)
        usleep(20000);
    } while (r == 0);
    if (r > 0 && WIFEXITED(st))
      served += WEXITSTATUS(st);
  }
  printf("served: %d\n", served);
  return 0;
}

/* The daemon's child: serves until a "quit", then prints what it served. */
static int daemon_child(int l) {
  int q[2];
  if (pipe2(q, O_NONBLOCK)) {
    perror("pipe");
    return 1;
  }
  int served = 0;
  char c;
  for (;;) {
    int s = accept(l, NULL, NULL);
    if (s < 0) {
      perror("accept");
      return 1;
    }
    served += serve_one(s, q[1]);
    if (read(q[0], &c, 1) == 1)
      break; /* that was the "quit" */
  }
  printf("served: %d\n", served);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct sigaction sa = {.sa_handler = on_term}; /* no SA_RESTART: accept ends with EINTR */
  sigaction(SIGTERM, &sa, NULL);
  if ((argc == 4 && (!strcmp(argv[1], "workers") || !strcmp(argv[1], "blocking"))) ||
      (argc == 5 && !strcmp(argv[1], "workers"))) {
    int blocking = !strcmp(argv[1], "blocking");
    int n = atoi(argv[3]), wait_ms = argc == 5 ? atoi(argv[4]) : 0;
    if (n < 1 || n > 16 || wait_ms < 0 || wait_ms > 10000)
      return 2;
    return run_workers(listen_tcp(atoi(argv[2]), !blocking), n, blocking, wait_ms);
  }
  if (argc == 3 && (!strcmp(argv[1], "daemon") || !strcmp(argv[1], "daemon-late"))) {
    int late = !strcmp(argv[1], "daemon-late");
    int l = late ? listen_tcp(atoi(argv[2]), 0) : -1;
    pid_t p = fork();
    if (p < 0) {
      perror("fork");
      return 1;
    }
    if (p > 0)
      return 0; /* the parent goes at once */
    setsid();
    return daemon_child(late ? l : listen_tcp(atoi(argv[2]), 0));
  }
  if (argc == 5 && !strcmp(argv[1], "client")) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    inet_pton(AF_INET, argv[2], &a.sin_addr);
    int k = atoi(argv[4]), answered = 0;
    for (int i = 0; i <= k; i++) {
      int s = -1;
      for (int t = 0; t < 100; t++) {
        s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (void *)&a, sizeof a) == 0)
          break;
        close(s);
        s = -1;
        usleep(50000);
      }
      if (s < 0) {
        printf("client.connect: failed\n");
        return 1;
      }
      char b[4];
      send(s, i < k ? "ping" : "quit", 4, 0);
      if (recv(s, b, 4, MSG_WAITALL) == 4 && !memcmp(b, "pong", 4))
        answered++;
      close(s);
    }
    printf("client.answered: %d\n", answered);
    return 0;
  }
  fprintf(stderr, "usage: prefork workers|blocking PORT N | prefork workers PORT N MS | "
                  "prefork daemon|daemon-late PORT | "
                  "prefork client IP PORT K\n");
  return 2;
}
