/* A child process after fork and the DockNet sockets it inherits, where the pipe's stack stays
 * the parent's: the parent uses the listener after the fork, before the child tries it, so the
 * child cannot take the stack (a child takes it only while its parent does not use it). The
 * child's listener is then one no connection ever reaches (never ready, accept would wait).
 * Its connection works as on kernel sockets (the parent serves it for the child), and the
 * parent's carries on after the child closed its copy. A connection handed to a child forked
 * for it, the parent closing its own copy at once, is served by the child to the end.
 * (Children that take the stack: prefork.c.)
 *
 *   forked server PORT      listen, fork a child that tries the listener once the parent has
 *                           used it, accept one client, fork a child that tries the
 *                           connection, then echo one message
 *   forked client IP PORT   connect, wait for the server's "R", send "ping", expect it back
 *   forked handoff PORT N   accept N connections, each handed to a child forked for it (the
 *                           parent closes its copy at once and accepts the next, as
 *                           PostgreSQL's postmaster does); the child reads a line with epoll,
 *                           answers what it sees of the connection, naps, reads UP_BULK bytes
 *                           (its parent holds what it cannot take yet), sends BULK bytes,
 *                           shuts down and waits for the client's close
 *   forked handoff-client IP PORT N   open N connections, then talk to each
 *   forked inetd PORT N     accept N connections, each handed to a program as inetd does: a
 *                           child puts it on its standard input and output and runs a shell
 *                           that reads a line and answers it
 *   forked inetd-client IP PORT N     one connection after another: a line, then the answer
 *   forked postmaster PORT N   handoff as PostgreSQL 15's postmaster does it: signals are
 *                           blocked but in its select() on the listener, and its handlers fork
 *                           (SIGUSR1, sent every 200 us by a thread of its own, forks a child
 *                           that exits at once, as an autovacuum worker's start does; SIGCHLD
 *                           reaps); each connection is handed to a child as handoff does, and
 *                           it ends when the N children have exited
 *   forked leave PORT       accept one connection, answer its line as inetd's shell does and
 *                           exit at once without closing it (the answer and the end of stream
 *                           must reach the client all the same)
 *
 * Prints one line per outcome: "name: value". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "listen.h"

static const char *err(int r) {
  static char b[64];
  if (r >= 0) {
    snprintf(b, sizeof b, "%d", r);
    return b;
  }
  snprintf(b, sizeof b, "-1 %s", errno == EOPNOTSUPP ? "EOPNOTSUPP"
                                 : errno == EPERM    ? "EPERM"
                                 : errno == EAGAIN   ? "EAGAIN"
                                                     : strerror(errno));
  return b;
}

static int connect_to(const char *ip, int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, ip, &a.sin_addr);
  for (int tries = 0; tries < 50; tries++) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (void *)&a, sizeof a) == 0)
      return s;
    close(s);
    usleep(100000);
  }
  return -1;
}

/* In a child: each call on `fd` (a listener when `listening`), printed with `tag`. With
 * `parent_first` the parent makes a call on it after the fork and before the child's. */
static void try_in_child(int fd, const char *tag, int listening, int parent_first) {
  int go[2];
  if (pipe(go)) {
    perror("pipe");
    exit(1);
  }
  pid_t p = fork();
  if (p == 0) {
    char buf[16];
    close(go[1]);
    if (read(go[0], buf, 1) != 1)
      _exit(1);
    if (listening) {
      fcntl(fd, F_SETFL, O_NONBLOCK);
      printf("%s.accept: %s\n", tag, err(accept4(fd, NULL, NULL, SOCK_NONBLOCK)));
    }
    else {
      /* nothing comes before the parent's "R": the client waits for it */
      printf("%s.recv: %s\n", tag, err(recv(fd, buf, sizeof buf, MSG_DONTWAIT)));
    }
    struct pollfd pf = {fd, POLLIN, 0};
    int n = poll(&pf, 1, 300);
    printf("%s.poll: %d nval %d\n", tag, n, (pf.revents & POLLNVAL) != 0);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    printf("%s.epoll_ctl: %s\n", tag, err(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)));
    printf("%s.close: %s\n", tag, err(close(fd)));
    fflush(stdout);
    _exit(0);
  }
  close(go[0]);
  if (parent_first) {
    /* a look that takes nothing (a client may be connecting already) */
    struct pollfd pf = {fd, POLLIN, 0};
    printf("parent.first: %s\n", err(poll(&pf, 1, 0) < 0 ? -1 : 0));
  }
  if (write(go[1], "g", 1) != 1)
    perror("write");
  close(go[1]);
  waitpid(p, NULL, 0);
}

#define BULK (256 * 1024)
#define UP_BULK (1024 * 1024)

/* A forked child's side of one handed-off connection. */
static int serve_handed(int c) {
  struct sockaddr_in me, peer;
  socklen_t l = sizeof me;
  if (getsockname(c, (void *)&me, &l) || (l = sizeof peer, getpeername(c, (void *)&peer, &l)))
    return 10;
  int one = 1, nd = 0, ty = 0;
  socklen_t ol = sizeof nd;
  if (setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) ||
      getsockopt(c, IPPROTO_TCP, TCP_NODELAY, &nd, &ol))
    return 11;
  ol = sizeof ty;
  if (getsockopt(c, SOL_SOCKET, SO_TYPE, &ty, &ol))
    return 12;
  fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev))
    return 13;
  char line[64];
  size_t got = 0;
  while (got == 0 || line[got - 1] != '\n') {
    struct epoll_event out;
    if (epoll_wait(ep, &out, 1, 10000) != 1)
      return 14;
    ssize_t n = read(c, line + got, sizeof line - 1 - got);
    if (n <= 0 && !(n < 0 && errno == EAGAIN))
      return 15;
    if (n > 0)
      got += n;
    if (got >= sizeof line - 1)
      return 16;
  }
  line[got - 1] = 0;
  char ans[160];
  int k = snprintf(ans, sizeof ans, "%s port=%d peer_port=%d nodelay=%d stream=%d\n", line,
                   ntohs(me.sin_port), ntohs(peer.sin_port), nd != 0, ty == SOCK_STREAM);
  fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK);
  if (send(c, ans, k, 0) != k)
    return 17;
  /* the client sends UP_BULK bytes meanwhile: more than the sockets between hold */
  usleep(200000);
  static char in[65536];
  for (long got = 0; got < UP_BULK;) {
    ssize_t n = recv(c, in, sizeof in < UP_BULK - got ? sizeof in : UP_BULK - got, 0);
    if (n <= 0)
      return 20;
    for (ssize_t j = 0; j < n; j++)
      if (in[j] != (char)((got + j) * 5 + 1))
        return 21;
    got += n;
  }
  static char bulk[BULK];
  for (int i = 0; i < BULK; i++)
    bulk[i] = (char)(i * 7 + 3);
  for (size_t off = 0; off < BULK;) {
    ssize_t n = send(c, bulk + off, BULK - off, 0);
    if (n <= 0)
      return 18;
    off += n;
  }
  shutdown(c, SHUT_WR);
  char b[16];
  if (recv(c, b, sizeof b, 0) != 0)
    return 19;
  close(c);
  return 0;
}

static int handoff(int port, int n) {
  int l = listen_tcp(port, 0);
  for (int i = 0; i < n; i++) {
    int c = accept(l, NULL, NULL);
    if (c < 0) {
      perror("accept");
      return 1;
    }
    pid_t p = fork();
    if (p == 0) {
      close(l);
      _exit(serve_handed(c));
    }
    close(c);
  }
  int ok = 0;
  for (int i = 0; i < n; i++) {
    int st;
    if (wait(&st) > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
      ok++;
    else if (WIFEXITED(st))
      printf("child.exit: %d\n", WEXITSTATUS(st));
  }
  printf("served: %d of %d\n", ok, n);
  return 0;
}

static int handoff_client(const char *ip, int port, int n) {
  int s[64];
  if (n > 64)
    return 2;
  for (int i = 0; i < n; i++) {
    s[i] = connect_to(ip, port);
    if (s[i] < 0) {
      printf("client.connect: failed\n");
      return 1;
    }
  }
  int good = 0;
  for (int i = 0; i < n; i++) {
    char hello[32], ans[200];
    int k = snprintf(hello, sizeof hello, "hello %d\n", i);
    send(s[i], hello, k, 0);
    struct sockaddr_in me;
    socklen_t l = sizeof me;
    getsockname(s[i], (void *)&me, &l);
    size_t got = 0;
    while (got < sizeof ans - 1 && (got == 0 || ans[got - 1] != '\n')) {
      ssize_t r = recv(s[i], ans + got, 1, 0);
      if (r <= 0)
        break;
      got += r;
    }
    ans[got] = 0;
    char want[200];
    snprintf(want, sizeof want, "hello %d port=%d peer_port=%d nodelay=1 stream=1\n", i, port,
             ntohs(me.sin_port));
    static char up[UP_BULK];
    for (long j = 0; j < UP_BULK; j++)
      up[j] = (char)(j * 5 + 1);
    for (long off = 0; off < UP_BULK;) {
      ssize_t r = send(s[i], up + off, UP_BULK - off, 0);
      if (r <= 0)
        break;
      off += r;
    }
    long bytes = 0, bad = 0;
    char buf[65536];
    for (;;) {
      ssize_t r = recv(s[i], buf, sizeof buf, 0);
      if (r <= 0)
        break;
      for (ssize_t j = 0; j < r; j++)
        bad += buf[j] != (char)((bytes + j) * 7 + 3);
      bytes += r;
    }
    close(s[i]);
    int ok = !strcmp(ans, want) && bytes == BULK && bad == 0;
    if (!ok)
      printf("client.%d: answer %s(want %s) bytes %ld bad %ld\n", i, ans, want, bytes, bad);
    good += ok;
  }
  printf("client.handed: %d of %d\n", good, n);
  return 0;
}

static volatile sig_atomic_t aux_forks, served_ok, served_bad, kicking = 1;
static pid_t served[64];

static void on_usr1(int sig) {
  (void)sig;
  int e = errno;
  pid_t p = fork();
  if (p == 0)
    _exit(0);
  if (p > 0)
    aux_forks++;
  errno = e;
}

static void on_chld(int sig) {
  (void)sig;
  int e = errno, st;
  pid_t p;
  while ((p = waitpid(-1, &st, WNOHANG)) > 0)
    for (int i = 0; i < 64; i++)
      if (served[i] == p) {
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
          served_ok++;
        else
          served_bad++;
      }
  errno = e;
}

static void *kicker(void *arg) {
  (void)arg;
  while (kicking) {
    kill(getpid(), SIGUSR1);
    usleep(200);
  }
  return NULL;
}

static int postmaster(int port, int n) {
  if (n > 64)
    return 2;
  int l = listen_tcp(port, 0);
  sigset_t block, none;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  sigaddset(&block, SIGCHLD);
  sigemptyset(&none);
  sigprocmask(SIG_BLOCK, &block, NULL);
  struct sigaction a = {.sa_handler = on_usr1};
  sigfillset(&a.sa_mask);
  sigaction(SIGUSR1, &a, NULL);
  a.sa_handler = on_chld;
  sigaction(SIGCHLD, &a, NULL);
  pthread_t t;
  /* (the kicker inherits the blocked mask: the signals land on the main thread, in select) */
  pthread_create(&t, NULL, kicker, NULL);
  int accepted = 0;
  while (served_ok + served_bad < n) {
    fd_set r;
    FD_ZERO(&r);
    FD_SET(l, &r);
    struct timeval tv = {1, 0};
    sigprocmask(SIG_SETMASK, &none, NULL);
    int k = select(l + 1, &r, NULL, NULL, &tv);
    sigprocmask(SIG_SETMASK, &block, NULL);
    if (k <= 0 || accepted == n || !FD_ISSET(l, &r))
      continue;
    int c = accept(l, NULL, NULL);
    if (c < 0)
      continue;
    pid_t p = fork();
    if (p == 0) {
      close(l);
      sigprocmask(SIG_SETMASK, &none, NULL);
      _exit(serve_handed(c));
    }
    served[accepted++] = p;
    close(c);
  }
  kicking = 0;
  pthread_join(t, NULL);
  printf("postmaster.served: %d of %d, aux forks %d\n", served_ok, n, aux_forks > 0);
  return 0;
}

static int inetd(int port, int n) {
  int l = listen_tcp(port, 0);
  int ok = 0;
  for (int i = 0; i < n; i++) {
    int c = accept(l, NULL, NULL);
    if (c < 0) {
      perror("accept");
      return 1;
    }
    pid_t p = fork();
    if (p == 0) {
      close(l);
      if (dup2(c, 0) != 0 || dup2(c, 1) != 1)
        _exit(20);
      close(c);
      execl("/bin/sh", "sh", "-c", "read l; echo \"inetd $l\"", (char *)NULL);
      _exit(21);
    }
    close(c);
    int st;
    if (waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 0)
      ok++;
  }
  printf("inetd.served: %d of %d\n", ok, n);
  return 0;
}

static int leave(int port) {
  int l = listen_tcp(port, 0);
  int c = accept(l, NULL, NULL);
  char line[64];
  size_t got = 0;
  while (got < sizeof line - 1 && (got == 0 || line[got - 1] != '\n')) {
    ssize_t r = recv(c, line + got, 1, 0);
    if (r <= 0)
      break;
    got += r;
  }
  line[got] = 0;
  char ans[96];
  int k = snprintf(ans, sizeof ans, "inetd %s", line);
  printf("leave.send: %d\n", send(c, ans, k, 0) == k);
  exit(0);
}

static int inetd_client(const char *ip, int port, int n) {
  int good = 0;
  for (int i = 0; i < n; i++) {
    int s = connect_to(ip, port);
    if (s < 0) {
      printf("client.connect: failed\n");
      return 1;
    }
    char hello[32], ans[64] = {0}, want[64];
    int k = snprintf(hello, sizeof hello, "hello %d\n", i);
    send(s, hello, k, 0);
    size_t got = 0;
    for (;;) {
      ssize_t r = recv(s, ans + got, sizeof ans - 1 - got, 0);
      if (r <= 0)
        break;
      got += r;
    }
    close(s);
    snprintf(want, sizeof want, "inetd hello %d\n", i);
    if (!strcmp(ans, want))
      good++;
    else
      printf("client.%d: %s", i, ans);
  }
  printf("client.inetd: %d of %d\n", good, n);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 3 && !strcmp(argv[1], "server")) {
    int l = listen_tcp(atoi(argv[2]), 0);
    try_in_child(l, "listener", 1, 1);
    int c = accept(l, NULL, NULL);
    printf("parent.accept: %d\n", c >= 0);
    try_in_child(c, "conn", 0, 0);
    send(c, "R", 1, 0);
    char buf[16];
    int n = recv(c, buf, 4, MSG_WAITALL);
    printf("parent.recv: %d\n", n);
    printf("parent.send: %s\n", err(send(c, buf, n > 0 ? n : 0, 0)));
    sleep(1);
    return 0;
  }
  if (argc == 4 && !strcmp(argv[1], "client")) {
    int s = connect_to(argv[2], atoi(argv[3]));
    if (s < 0) {
      printf("client.connect: failed\n");
      return 1;
    }
    char r, buf[8] = {0};
    int n = recv(s, &r, 1, 0);
    printf("client.ready: %d %c\n", n, n == 1 ? r : '-');
    send(s, "ping", 4, 0);
    n = recv(s, buf, 4, MSG_WAITALL);
    printf("client.echo: %d %s\n", n, buf);
    return 0;
  }
  if (argc == 4 && !strcmp(argv[1], "handoff"))
    return handoff(atoi(argv[2]), atoi(argv[3]));
  if (argc == 5 && !strcmp(argv[1], "handoff-client"))
    return handoff_client(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (argc == 4 && !strcmp(argv[1], "postmaster"))
    return postmaster(atoi(argv[2]), atoi(argv[3]));
  if (argc == 4 && !strcmp(argv[1], "inetd"))
    return inetd(atoi(argv[2]), atoi(argv[3]));
  if (argc == 3 && !strcmp(argv[1], "leave"))
    return leave(atoi(argv[2]));
  if (argc == 5 && !strcmp(argv[1], "inetd-client"))
    return inetd_client(argv[2], atoi(argv[3]), atoi(argv[4]));
  fprintf(stderr, "usage: forked server PORT | forked client IP PORT | forked handoff PORT N | "
                  "forked handoff-client IP PORT N | forked postmaster PORT N | forked inetd PORT N | forked inetd-client IP PORT N | forked leave PORT\n");
  return 2;
}
