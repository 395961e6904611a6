/* Servers that fork after they listen, and programs that daemonize: the same outcomes on kernel
 * sockets and over DockNet (where the pipe's stack moves whole to the first worker that uses
 * the listener, which hands the others the connections it leaves waiting while it sleeps).
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
 *   prefork slow PORT N         the "blocking" workers, each taking 100 ms over an answer (a
 *                               synchronous worker's request, as gunicorn's); the parent also
 *                               prints how many workers answered any ("busy workers: B"), and
 *                               300 ms after the fork sends each worker a signal whose handler
 *                               has SA_RESTART (its accept must carry on)
 *   prefork dial PORT N IP P    the "slow" workers, each asking a backend at IP:P before it
 *                               answers (connect, "ping", "pong": a worker's database call);
 *                               "dial.failed: ERRNO" when that fails, and no answer
 *   prefork intrude             a process of the same container but not of the server's family,
 *                               at the Unix socket through which the worker that drives the stack
 *                               hands connections to its siblings (DockNet only): a hello with a
 *                               wrong token, a request for a connection with a wrong token,
 *                               garbage, and silence must each be dropped, and nothing handed over
 *                               ("intruder.dropped: 4", or "intruder.no-service")
 *   prefork client IP PORT K    K connections, one after another: "ping", expect "pong"; then
 *                               one "quit", which ends the server
 *   prefork parallel IP PORT K  K connections at once, a "ping" on each, then every "pong";
 *                               then one "quit"
 *
 * The server prints how many connections were answered in all ("served: K"), the client how
 * many answers it got; a blocking worker also compares its listener and its first connection
 * with what the kernel's answer ("listener.wrong: WHAT" for each that differs). A connection's "quit" ends the server: the worker that takes it tells
 * the parent over a pipe made before the fork, and the parent ends the workers (SIGTERM, sent
 * again until each ends) and adds up what each served (its exit status). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/un.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "listen.h"

static volatile sig_atomic_t stop;
static void on_usr1(int s) { (void)s; } /* installed with SA_RESTART: interrupts nothing */
static int slow_ms; /* how long a worker takes over each answer */
static struct sockaddr_in dial_to; /* "dial": the backend each answer asks first (port 0: none) */

/* Asks the backend: connects, sends "ping", expects "pong". 1 when it answered. */
static int dial(void) {
  /* a socket of the worker's own, not connected, in an epoll set of its own: taken and
   * waited on */
  int k = socket(AF_INET, SOCK_STREAM, 0), ep = epoll_create1(0);
  struct epoll_event kev = {.events = EPOLLOUT}, kout;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, k, &kev) || epoll_wait(ep, &kout, 1, 0) < 0) {
    const char *m = "dial.failed: epoll of a socket of the worker's own\n";
    if (write(1, m, strlen(m)) < 0)
      perror("write");
  }
  close(ep);
  close(k);
  int d = socket(AF_INET, SOCK_STREAM, 0), one = 1, v = 0;
  setsockopt(d, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char b[4];
  const char *what = NULL;
  int ok = d >= 0 && connect(d, (void *)&dial_to, sizeof dial_to) == 0;
  if (ok) {
    /* the connection answers as a connected TCP socket, the option set before it kept */
    struct sockaddr_in p;
    socklen_t pl = sizeof p, vl = sizeof v;
    if (getpeername(d, (void *)&p, &pl) || p.sin_port != dial_to.sin_port ||
        p.sin_addr.s_addr != dial_to.sin_addr.s_addr)
      what = "getpeername";
    else if (getsockopt(d, IPPROTO_TCP, TCP_NODELAY, &v, &vl) || v != 1)
      what = "TCP_NODELAY";
  }
  ok = ok && !what && send(d, "ping", 4, 0) == 4 && recv(d, b, 4, MSG_WAITALL) == 4 &&
       !memcmp(b, "pong", 4);
  if (!ok) {
    char m[96];
    int k = snprintf(m, sizeof m, "dial.failed: %s\n", what ? what : strerrorname_np(errno));
    if (write(1, m, k) != k)
      perror("write");
  }
  if (d >= 0)
    close(d);
  return ok;
}
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
      if (slow_ms)
        usleep(slow_ms * 1000);
      if (!dial_to.sin_port || dial())
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

/* What a worker's listener and its first connection answer, as on kernel sockets (whichever
 * worker drives the stack, and the others through the listener they adopted): a line
 * "listener.wrong: WHAT" for each that differs. */
static void check_listener(int l, int c) {
  struct sockaddr_in a, b;
  socklen_t al = sizeof a, bl = sizeof b;
  int v = 0;
  socklen_t vl = sizeof v;
  char m[160], buf[8];
  const char *wrong[8];
  int n = 0;
  if (getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &v, &vl) || v != 1)
    wrong[n++] = "SO_ACCEPTCONN";
  if (getsockname(l, (struct sockaddr *)&a, &al) || getsockname(c, (struct sockaddr *)&b, &bl) ||
      a.sin_port != b.sin_port)
    wrong[n++] = "getsockname";
  al = sizeof a;
  if (getpeername(l, (struct sockaddr *)&a, &al) == 0 || errno != ENOTCONN)
    wrong[n++] = "getpeername of the listener";
  al = sizeof a;
  if (getpeername(c, (struct sockaddr *)&a, &al) || a.sin_port == 0 || a.sin_addr.s_addr == 0)
    wrong[n++] = "getpeername of the connection";
  vl = sizeof v;
  if (getsockopt(c, SOL_SOCKET, SO_ACCEPTCONN, &v, &vl) || v != 0)
    wrong[n++] = "SO_ACCEPTCONN of the connection";
  if (recv(l, buf, sizeof buf, MSG_DONTWAIT) >= 0 || errno != ENOTCONN)
    wrong[n++] = "recv";
  for (int i = 0; i < n; i++) {
    int k = snprintf(m, sizeof m, "listener.wrong: %s\n", wrong[i]);
    if (write(1, m, k) != k)
      perror("write");
  }
}

static int worker_blocking(int l, int quit) {
  int served = 0, checked = 0;
  while (!stop) {
    int c = accept(l, NULL, NULL);
    if (c >= 0 && !checked++)
      check_listener(l, c);
    if (c >= 0)
      served += serve_one(c, quit);
    else if (errno == EINTR && !stop)
      printf("listener.wrong: accept interrupted by a handler with SA_RESTART\n");
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
  if (slow_ms) {
    /* a signal whose handler has SA_RESTART, to workers blocked in accept: nothing ends */
    usleep(300000);
    for (int i = 0; i < n; i++)
      kill(pids[i], SIGUSR1);
  }
  char c;
  while (read(q[0], &c, 1) < 0 && errno == EINTR) {
  }
  /* SIGTERM again every 20 ms until each worker ends, as a supervisor would: a SIGTERM that
   * lands after a worker's look at `stop` and before its accept begins finds no call to
   * interrupt (on kernel sockets too), and that worker would wait for a connection forever */
  int served = 0, busy = 0;
  for (int i = 0; i < n; i++) {
    int st = 0;
    pid_t r;
    do {
      kill(pids[i], SIGTERM);
      r = waitpid(pids[i], &st, WNOHANG);
      if (r == 0)
        usleep(20000);
    } while (r == 0);
    if (r > 0 && WIFEXITED(st)) {
      served += WEXITSTATUS(st);
      busy += WEXITSTATUS(st) > 0;
    }
  }
  printf("served: %d\n", served);
  if (slow_ms)
    printf("busy workers: %d\n", busy);
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

/* Connects to the first "@docknet-share-PID" Unix socket of this network namespace, sends
 * `len` bytes of `msg`, and waits up to 3 s: 1 when the other end closed without sending a
 * thing (dropped), 0 otherwise. */
static int dropped_after(const char *name, const void *msg, size_t len) {
  int u = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  size_t n = strlen(name);
  memcpy(a.sun_path + 1, name, n);
  if (connect(u, (void *)&a, sizeof(sa_family_t) + 1 + n)) {
    close(u);
    return 0;
  }
  if (len && send(u, msg, len, MSG_NOSIGNAL) != (ssize_t)len) {
    close(u);
    return 0;
  }
  struct timeval tv = {.tv_sec = 3};
  setsockopt(u, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char b[64];
  ssize_t r = recv(u, b, sizeof b, 0);
  close(u);
  return r == 0;
}

static int intrude(void) {
  char name[108] = "";
  for (int t = 0; t < 20 && !name[0]; t++) {
    FILE *f = fopen("/proc/net/unix", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      char *p = strstr(line, "@docknet-share-");
      if (p) {
        sscanf(p + 1, "%107s", name);
        break;
      }
    }
    if (f)
      fclose(f);
    if (!name[0])
      usleep(100000);
  }
  /* (no /proc/net/unix in the container: every pid's name is tried) */
  for (int pid = 1; pid < 65536 && !name[0]; pid++) {
    char n[64];
    snprintf(n, sizeof n, "docknet-share-%d", pid);
    int u = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path + 1, n, strlen(n));
    if (connect(u, (void *)&a, sizeof(sa_family_t) + 1 + strlen(n)) == 0)
      strcpy(name, n);
    close(u);
  }
  if (!name[0]) {
    printf("intruder.no-service\n");
    return 0;
  }
  /* magic "DNSH", a descriptor (each the listener might be), a token that is not the family's */
  unsigned char hello[16] = {0x48, 0x53, 0x4e, 0x44, 3, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
  int all = 1;
  for (int fd = 3; fd < 16; fd++) {
    hello[4] = fd;
    all &= dropped_after(name, hello, sizeof hello);
  }
  char junk[40];
  memset(junk, 0x5a, sizeof junk);
  /* magic "DNSD", a token that is not the family's, an address: a connection asked for */
  unsigned char dial_req[20] = {0x44, 0x53, 0x4e, 0x44, 1, 2, 3, 4, 5, 6, 7, 8, 10, 0, 0, 1, 0x1d, 0x56};
  int d = all + dropped_after(name, dial_req, sizeof dial_req) + dropped_after(name, junk, sizeof junk) +
          dropped_after(name, NULL, 0);
  printf("intruder.dropped: %d\n", d);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct sigaction sa = {.sa_handler = on_term}; /* no SA_RESTART: accept ends with EINTR */
  sigaction(SIGTERM, &sa, NULL);
  struct sigaction su = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
  sigaction(SIGUSR1, &su, NULL);
  if (argc == 4 && !strcmp(argv[1], "slow")) {
    int n = atoi(argv[3]);
    if (n < 1 || n > 16)
      return 2;
    slow_ms = 100;
    return run_workers(listen_tcp(atoi(argv[2]), 0), n, 1, 0);
  }
  if (argc == 6 && !strcmp(argv[1], "dial")) {
    int n = atoi(argv[3]);
    if (n < 1 || n > 16)
      return 2;
    slow_ms = 100;
    dial_to.sin_family = AF_INET;
    dial_to.sin_port = htons(atoi(argv[5]));
    inet_pton(AF_INET, argv[4], &dial_to.sin_addr);
    return run_workers(listen_tcp(atoi(argv[2]), 0), n, 1, 0);
  }
  if (argc == 2 && !strcmp(argv[1], "intrude"))
    return intrude();
  if (argc == 5 && !strcmp(argv[1], "parallel")) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    inet_pton(AF_INET, argv[2], &a.sin_addr);
    int k = atoi(argv[4]), answered = 0, s[65];
    if (k < 1 || k > 64)
      return 2;
    for (int i = 0; i <= k; i++) {
      s[i] = -1;
      for (int t = 0; t < 100 && s[i] < 0; t++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c, (void *)&a, sizeof a) == 0) {
          s[i] = c;
          break;
        }
        close(c);
        usleep(50000);
      }
      if (s[i] < 0) {
        printf("client.connect: failed\n");
        return 1;
      }
      if (i == k)
        break; /* the "quit" goes once every answer came */
      send(s[i], "ping", 4, 0);
    }
    for (int i = 0; i < k; i++) {
      char b[4];
      if (recv(s[i], b, 4, MSG_WAITALL) == 4 && !memcmp(b, "pong", 4))
        answered++;
      close(s[i]);
    }
    int q = s[k];
    char b[4];
    send(q, "quit", 4, 0);
    recv(q, b, 4, MSG_WAITALL);
    close(q);
    printf("client.answered: %d\n", answered);
    return 0;
  }
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
                  "prefork slow PORT N | prefork intrude | "
                  "prefork client|parallel IP PORT K\n");
  return 2;
}
