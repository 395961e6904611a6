/* The socket calls' outcomes, printed one per line: the test runs this program on kernel
 * sockets and under libdocknet_preload.so and requires the two outputs to be the same.
 *
 *   check server BIND_IP PORT     TCP server (a thread per connection) + UDP echo on PORT
 *   check client SERVER_IP PORT   runs every case against the server, prints the outcomes
 *
 * A connection's first byte says what the server does with it:
 *   'e' echo until end of stream, then close      'h' read to end of stream, answer "bye", close
 *   'r' reset (SO_LINGER 0, close)                'c' close at once
 *   'q' stop the server
 */
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
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static struct sockaddr_in at(const char *ip, int port) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

/* prints "name: value" or "name: -1 ERRNO" */
static long show(const char *name, long r) {
  if (r < 0)
    printf("%s: -1 %s\n", name, strerrorname_np(errno));
  else
    printf("%s: %ld\n", name, r);
  fflush(stdout);
  return r;
}

static void *conn_thread(void *arg) {
  int c = (int)(long)arg;
  char code, buf[4096];
  if (read(c, &code, 1) != 1) {
    close(c);
    return NULL;
  }
  if (code == 'e') {
    ssize_t n;
    while ((n = read(c, buf, sizeof buf)) > 0)
      if (write(c, buf, n) != n)
        break;
  } else if (code == 'h') {
    while (read(c, buf, sizeof buf) > 0) {
    }
    if (write(c, "bye", 3) != 3)
      perror("server write");
  } else if (code == 'r') {
    struct linger l = {1, 0};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  } else if (code == 'q') {
    exit(0);
  }
  close(c);
  return NULL;
}

static void *udp_echo(void *arg) {
  int u = (int)(long)arg;
  char buf[2048];
  for (;;) {
    struct sockaddr_in from;
    socklen_t fl = sizeof from;
    ssize_t n = recvfrom(u, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
    if (n >= 0)
      sendto(u, buf, n, 0, (struct sockaddr *)&from, fl);
  }
  return NULL;
}

static int server(const char *ip, int port) {
  struct sockaddr_in a = at(ip, port);
  int one = 1;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1024)) {
    perror("server bind/listen");
    return 1;
  }
  int u = socket(AF_INET, SOCK_DGRAM, 0);
  if (bind(u, (struct sockaddr *)&a, sizeof a)) {
    perror("server udp bind");
    return 1;
  }
  pthread_t t;
  pthread_create(&t, NULL, udp_echo, (void *)(long)u);
  fprintf(stderr, "listening\n");
  for (;;) {
    int c = accept(l, NULL, NULL);
    if (c < 0)
      continue;
    pthread_create(&t, NULL, conn_thread, (void *)(long)c);
    pthread_detach(t);
  }
}

static const char *SIP;
static int PORT;

/* a blocking connection whose first byte is `code` */
static int conn(char code) {
  struct sockaddr_in a = at(SIP, PORT);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  for (int i = 0; i < 100; i++) {
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0)
      break;
    usleep(20000);
  }
  if (write(s, &code, 1) != 1)
    perror("conn write");
  return s;
}

static void on_alarm(int sig) { (void)sig; }

static void *late_writer(void *arg) {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  usleep(300000);
  if (write((int)(long)arg, "late", 4) != 4)
    perror("late write");
  return NULL;
}

static void *late_shutdown_rd(void *arg) {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  usleep(200000);
  if (shutdown((int)(long)arg, SHUT_RD))
    perror("late shutdown");
  return NULL;
}

/* 4 MiB of a hashed pattern (a byte moved, lost or doubled shows), written in writes of
 * varied sizes; the writer ends its side when done, so a reader never waits for bytes that
 * will not come */
#define BULK (4 << 20)
static unsigned char bulk_byte(long i) {
  return (unsigned char)(((unsigned long)i * 2654435761UL) >> 24);
}

static void *bulk_writer(void *arg) {
  int s = (int)(long)arg;
  static unsigned char out[70000];
  static const int sizes[] = {1, 1000, 65536, 70000, 4096, 17};
  long at = 0;
  for (int k = 0; at < BULK; k++) {
    int n = sizes[k % 6];
    if (n > BULK - at)
      n = BULK - at;
    for (int i = 0; i < n; i++)
      out[i] = bulk_byte(at + i);
    for (int done = 0; done < n;) {
      ssize_t w = write(s, out + done, n - done);
      if (w <= 0) {
        perror("bulk write");
        shutdown(s, SHUT_WR);
        return NULL;
      }
      done += w;
    }
    at += n;
  }
  shutdown(s, SHUT_WR);
  return NULL;
}

static int wait_fd(int fd, short ev, int ms) {
  struct pollfd p = {fd, ev, 0};
  return poll(&p, 1, ms) > 0 ? p.revents : 0;
}

static int client(void) {
  char buf[256];
  int one = 1, v;
  socklen_t vl = sizeof v;
  struct sockaddr_in srv = at(SIP, PORT), bad = at(SIP, PORT + 1);

  /* the server may still be starting */
  close(conn('c'));

  /* refused, blocking and non-blocking */
  int s = socket(AF_INET, SOCK_STREAM, 0);
  show("refused.connect", connect(s, (struct sockaddr *)&bad, sizeof bad));
  close(s);
  s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  show("refused_nb.connect", connect(s, (struct sockaddr *)&bad, sizeof bad));
  show("refused_nb.poll_revents", wait_fd(s, POLLOUT, 3000) & (POLLOUT | POLLERR | POLLHUP | POLLIN));
  vl = sizeof v;
  getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &vl);
  printf("refused_nb.so_error: %s\n", v ? strerrorname_np(v) : "0");
  getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &vl);
  printf("refused_nb.so_error_again: %d\n", v);
  close(s);

  /* non-blocking connect, then epoll for writability */
  s = socket(AF_INET, SOCK_STREAM, 0);
  fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
  show("nb.getfl_nonblock", (fcntl(s, F_GETFL) & O_NONBLOCK) != 0);
  show("nb.connect", connect(s, (struct sockaddr *)&srv, sizeof srv));
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLOUT, .data.u64 = 7}, out[4];
  show("nb.epoll_add", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
  show("nb.epoll_add_again", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
  int n = epoll_wait(ep, out, 4, 3000);
  show("nb.epoll_out", n == 1 && (out[0].events & EPOLLOUT) && out[0].data.u64 == 7);
  vl = sizeof v;
  getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &vl);
  show("nb.so_error", v);
  show("nb.connect_again", connect(s, (struct sockaddr *)&srv, sizeof srv));
  struct sockaddr_in pa;
  socklen_t pl = sizeof pa;
  getpeername(s, (struct sockaddr *)&pa, &pl);
  show("nb.peer_port_ok", ntohs(pa.sin_port) == PORT && pl == sizeof pa);
  pl = sizeof pa;
  getsockname(s, (struct sockaddr *)&pa, &pl);
  show("nb.local_family_port", pa.sin_family == AF_INET && pa.sin_port != 0);
  show("nb.send_code", send(s, "e", 1, 0));
  show("nb.recv_empty", recv(s, buf, sizeof buf, 0));
  ioctl(s, FIONREAD, &v);
  show("nb.fionread_empty", v);

  /* level-triggered: reported while readable */
  ev.events = EPOLLIN;
  show("lt.epoll_mod", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
  show("lt.send", send(s, "hello", 5, 0));
  show("lt.wait1", epoll_wait(ep, out, 4, 3000));
  show("lt.wait2", epoll_wait(ep, out, 4, 100));
  usleep(50000);
  ioctl(s, FIONREAD, &v);
  show("lt.fionread", v);
  show("lt.peek", recv(s, buf, sizeof buf, MSG_PEEK));
  show("lt.read", read(s, buf, sizeof buf));
  show("lt.wait_drained", epoll_wait(ep, out, 4, 100));

  /* edge-triggered: once per arrival */
  ev.events = EPOLLIN | EPOLLET;
  show("et.epoll_mod", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
  show("et.send", send(s, "world", 5, 0));
  show("et.wait1", epoll_wait(ep, out, 4, 3000));
  show("et.wait2", epoll_wait(ep, out, 4, 100));
  usleep(50000);
  show("et.read", read(s, buf, sizeof buf));
  show("et.read_again", read(s, buf, sizeof buf));
  show("et.send2", send(s, "again", 5, 0));
  show("et.wait3", epoll_wait(ep, out, 4, 3000));
  usleep(50000);
  show("et.read2", read(s, buf, sizeof buf));

  /* one-shot */
  ev.events = EPOLLIN | EPOLLONESHOT;
  show("os.epoll_mod", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
  show("os.send", send(s, "x", 1, 0));
  show("os.wait1", epoll_wait(ep, out, 4, 3000));
  show("os.wait2", epoll_wait(ep, out, 4, 100));
  show("os.rearm", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
  show("os.wait3", epoll_wait(ep, out, 4, 3000));
  usleep(20000);
  show("os.read", read(s, buf, sizeof buf));

  /* a connection and its dup in one epoll: each member reports for itself */
  {
    int s2 = dup(s), ep2 = epoll_create1(0), k, saw_in = 0;
    struct epoll_event e1 = {.events = EPOLLIN, .data.u64 = 1};
    struct epoll_event e2 = {.events = EPOLLOUT, .data.u64 = 2};
    struct epoll_event o2[4];
    show("epdup.add1", epoll_ctl(ep2, EPOLL_CTL_ADD, s, &e1));
    show("epdup.add2", epoll_ctl(ep2, EPOLL_CTL_ADD, s2, &e2));
    k = epoll_wait(ep2, o2, 4, 100);
    show("epdup.writable_only", k == 1 && o2[0].data.u64 == 2);
    show("epdup.send", send(s, "dd", 2, 0));
    usleep(50000);
    k = epoll_wait(ep2, o2, 4, 3000);
    for (int i = 0; i < k; i++)
      if (o2[i].data.u64 == 1 && (o2[i].events & EPOLLIN))
        saw_in = 1;
    show("epdup.readable", saw_in);
    show("epdup.read", read(s, buf, sizeof buf));
    close(ep2);
    close(s2);
  }

  /* select and poll on the same socket */
  send(s, "sel", 3, 0);
  fd_set rs;
  FD_ZERO(&rs);
  FD_SET(s, &rs);
  struct timeval tv = {3, 0};
  show("select.n", select(s + 1, &rs, NULL, NULL, &tv));
  show("select.isset", FD_ISSET(s, &rs) != 0);
  /* Linux writes back the time not slept: most of the 3 s, never more */
  long left_us = tv.tv_sec * 1000000L + tv.tv_usec;
  show("select.left_most", left_us > 2000000L && left_us <= 3000000L);
  usleep(20000);
  show("select.read", read(s, buf, sizeof buf));
  FD_ZERO(&rs);
  FD_SET(s, &rs);
  tv.tv_sec = 0;
  tv.tv_usec = 100000;
  show("select.timeout", select(s + 1, &rs, NULL, NULL, &tv));
  show("select.timeout_left_none", tv.tv_sec == 0 && tv.tv_usec == 0);
  /* answered at once: all of the time is left */
  send(s, "now", 3, 0);
  wait_fd(s, POLLIN, 3000);
  usleep(20000);
  FD_ZERO(&rs);
  FD_SET(s, &rs);
  tv.tv_sec = 1;
  tv.tv_usec = 500;
  show("select.at_once", select(s + 1, &rs, NULL, NULL, &tv));
  left_us = tv.tv_sec * 1000000L + tv.tv_usec;
  show("select.at_once_left", left_us > 900000L && left_us <= 1000500L);
  show("select.at_once_read", read(s, buf, sizeof buf));

  /* dup: the same connection through two descriptors */
  int d = dup(s);
  show("dup.write", write(d, "dup", 3));
  wait_fd(s, POLLIN, 3000);
  usleep(20000);
  show("dup.read", read(s, buf, sizeof buf));
  close(d);
  show("dup.still_open", write(s, "", 0));

  /* half-close by us: the echo server closes after our FIN */
  show("halfclose.shutdown_wr", shutdown(s, SHUT_WR));
  show("halfclose.poll", wait_fd(s, POLLIN, 3000) & (POLLIN | POLLHUP | POLLRDHUP));
  usleep(50000);
  show("halfclose.read_eof", read(s, buf, sizeof buf));
  show("halfclose.poll_after", wait_fd(s, POLLIN | POLLOUT, 100) & (POLLIN | POLLHUP | POLLRDHUP));
  show("halfclose.send_after_shutdown", send(s, "x", 1, MSG_NOSIGNAL));
  /* closed without EPOLL_CTL_DEL: it leaves the set */
  close(s);
  show("epoll.closed_member", epoll_wait(ep, out, 4, 100));
  close(ep);

  /* readiness raised by another thread ends a wait when it comes, never by a timeout (the
   * wait's own, or the 1 s a blocked DockLib call sleeps between its own polls, which would
   * hide a lost wake-up): one epoll over 1,000 echo connections (every other one
   * edge-triggered), the last made readable by a thread 300 ms later; then poll on the first */
  {
    enum { K = 1000 };
    int cs[K], ep3 = epoll_create1(0);
    for (int i = 0; i < K; i++) {
      cs[i] = conn('e');
      struct epoll_event e = {.events = EPOLLIN | (i % 2 ? EPOLLET : 0), .data.u64 = (unsigned)i};
      epoll_ctl(ep3, EPOLL_CTL_ADD, cs[i], &e);
    }
    show("xthread.epoll_idle", epoll_wait(ep3, out, 4, 50));
    struct timespec t0, t1;
    pthread_t w;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_create(&w, NULL, late_writer, (void *)(long)cs[K - 1]);
    n = epoll_wait(ep3, out, 4, 10000);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long waited = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    show("xthread.epoll_n", n);
    show("xthread.epoll_the_ready_one", n == 1 && out[0].data.u64 == K - 1);
    show("xthread.epoll_not_by_timeout", waited >= 250 && waited < 900);
    pthread_join(w, NULL);
    show("xthread.epoll_read", read(cs[K - 1], buf, sizeof buf));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_create(&w, NULL, late_writer, (void *)(long)cs[0]);
    show("xthread.poll", wait_fd(cs[0], POLLIN, 10000) & POLLIN);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    waited = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    show("xthread.poll_not_by_timeout", waited >= 250 && waited < 900);
    pthread_join(w, NULL);
    for (int i = 0; i < K; i++)
      close(cs[i]);
    close(ep3);
  }

  /* half-close by the server: it answers after our FIN */
  s = conn('h');
  show("srvhalf.write", write(s, "abc", 3));
  show("srvhalf.shutdown_wr", shutdown(s, SHUT_WR));
  wait_fd(s, POLLIN, 3000);
  usleep(50000);
  n = read(s, buf, sizeof buf);
  show("srvhalf.read", n);
  printf("srvhalf.data: %.*s\n", n > 0 ? n : 0, buf);
  show("srvhalf.read_eof", read(s, buf, sizeof buf));
  close(s);

  /* reset by the server */
  s = conn('r');
  show("reset.poll", wait_fd(s, POLLIN, 3000) & (POLLIN | POLLERR | POLLHUP));
  show("reset.recv", recv(s, buf, sizeof buf, 0));
  show("reset.recv_again", recv(s, buf, sizeof buf, 0));
  show("reset.send", send(s, "x", 1, MSG_NOSIGNAL));
  close(s);

  /* closed by the server */
  s = conn('c');
  show("peerclose.poll", wait_fd(s, POLLIN | POLLRDHUP, 3000) & (POLLIN | POLLRDHUP | POLLHUP));
  show("peerclose.read", read(s, buf, sizeof buf));
  close(s);

  /* a bulk echo read by blocking reads of varied sizes (the server's reads block too): every
   * byte arrives once and in order, whatever each read waited for */
  s = conn('e');
  {
    pthread_t bw;
    pthread_create(&bw, NULL, bulk_writer, (void *)(long)s);
    static unsigned char in[100000];
    static const int sizes[] = {65536, 1, 100000, 300, 4096};
    long got = 0, bad = -1;
    for (int k = 0; got < BULK; k++) {
      int want = sizes[k % 5];
      ssize_t n = recv(s, in, want, 0);
      if (n <= 0)
        break;
      for (ssize_t i = 0; i < n; i++)
        if (bad < 0 && in[i] != bulk_byte(got + i))
          bad = got + i;
      got += n;
    }
    if (got < BULK)
      shutdown(s, SHUT_RDWR); /* the writer, blocked on an echo nobody reads, gets EPIPE */
    pthread_join(bw, NULL);
    show("bulk.bytes", got);
    show("bulk.all_bytes_right", bad < 0);
    if (bad >= 0)
      printf("bulk.first_wrong_byte: %ld\n", bad);
  }
  close(s);

  /* receive timeout */
  s = conn('e');
  struct timeval rt = {0, 100000};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt);
  show("rcvtimeo.recv", recv(s, buf, sizeof buf, 0));
  show("rcvtimeo.dontwait", recv(s, buf, sizeof buf, MSG_DONTWAIT));
  close(s);

  /* options */
  s = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  vl = sizeof v;
  getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &vl);
  show("opt.nodelay_unconnected", v != 0);
  close(s);
  s = conn('e');
  vl = sizeof v;
  getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &vl);
  show("opt.nodelay_default", v);
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  vl = sizeof v;
  getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &vl);
  show("opt.nodelay_set", v != 0);
  vl = sizeof v;
  getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &vl);
  show("opt.so_type", v);
  show("opt.keepalive", setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one));
  vl = sizeof v;
  getsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &v, &vl);
  show("opt.keepalive_get", v);
  /* options a program queries without setting them: Linux's defaults */
  static const struct { const char *name; int level, opt; } unset[] = {
      {"opt.unset.fastopen", IPPROTO_TCP, TCP_FASTOPEN},
      {"opt.unset.defer_accept", IPPROTO_TCP, TCP_DEFER_ACCEPT},
      {"opt.unset.cork", IPPROTO_TCP, TCP_CORK},
      {"opt.unset.keepidle", IPPROTO_TCP, TCP_KEEPIDLE},
      {"opt.unset.keepintvl", IPPROTO_TCP, TCP_KEEPINTVL},
      {"opt.unset.keepcnt", IPPROTO_TCP, TCP_KEEPCNT},
      {"opt.unset.user_timeout", IPPROTO_TCP, TCP_USER_TIMEOUT},
      {"opt.unset.rcvlowat", SOL_SOCKET, SO_RCVLOWAT},
      {"opt.unset.ip_tos", IPPROTO_IP, IP_TOS},
  };
  for (unsigned i = 0; i < sizeof unset / sizeof unset[0]; i++) {
    v = -7;
    vl = sizeof v;
    int rc = getsockopt(s, unset[i].level, unset[i].opt, &v, &vl);
    show(unset[i].name, rc == 0 ? v : rc);
  }
  v = 7;
  show("opt.defer_accept_set", setsockopt(s, IPPROTO_TCP, TCP_DEFER_ACCEPT, &v, sizeof v));
  int fl = 1;
  show("opt.fionbio", ioctl(s, FIONBIO, &fl));
  show("opt.fionbio_recv", recv(s, buf, sizeof buf, 0));
  /* close-on-exec by ioctl, as Python's os.set_inheritable sets it */
  show("opt.fioclex", ioctl(s, FIOCLEX) == 0 ? fcntl(s, F_GETFD) : -1);
  show("opt.fionclex", ioctl(s, FIONCLEX) == 0 ? fcntl(s, F_GETFD) : -1);
  close(s);

  /* a listener of our own: nothing to accept yet */
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in any = at("0.0.0.0", 0);
  show("listen.bind", bind(l, (struct sockaddr *)&any, sizeof any));
  show("listen.listen", listen(l, 8));
  pl = sizeof pa;
  getsockname(l, (struct sockaddr *)&pa, &pl);
  show("listen.port_assigned", pa.sin_port != 0);
  vl = sizeof v;
  getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &v, &vl);
  show("listen.acceptconn", v);
  fcntl(l, F_SETFL, O_NONBLOCK);
  show("listen.accept_eagain", accept(l, NULL, NULL));
  /* a listener is neither connected nor connecting */
  show("listen.recv", recv(l, buf, sizeof buf, MSG_DONTWAIT));
  show("listen.send", send(l, "x", 1, MSG_NOSIGNAL));
  pl = sizeof pa;
  struct sockaddr_in lp;
  show("listen.getpeername", getpeername(l, (struct sockaddr *)&lp, &pl));
  struct tcp_info ti;
  socklen_t til = sizeof ti;
  memset(&ti, 0, sizeof ti);
  getsockopt(l, IPPROTO_TCP, TCP_INFO, &ti, &til);
  show("listen.tcp_info_state", ti.tcpi_state);
  int l2 = socket(AF_INET, SOCK_STREAM, 0);
  show("listen.bind_in_use", bind(l2, (struct sockaddr *)&pa, sizeof pa));
  close(l2);
  close(l);

  /* UDP */
  int u = socket(AF_INET, SOCK_DGRAM, 0);
  show("udp.recv_nb_empty", recvfrom(u, buf, sizeof buf, MSG_DONTWAIT, NULL, NULL));
  show("udp.sendto", sendto(u, "datagram", 8, 0, (struct sockaddr *)&srv, sizeof srv));
  struct sockaddr_in from;
  socklen_t fromlen = sizeof from;
  wait_fd(u, POLLIN, 3000);
  n = recvfrom(u, buf, 4, MSG_TRUNC, (struct sockaddr *)&from, &fromlen);
  show("udp.recv_trunc", n);
  show("udp.from_server", from.sin_port == htons(PORT) && fromlen == sizeof from);
  show("udp.connect", connect(u, (struct sockaddr *)&srv, sizeof srv));
  show("udp.send", send(u, "again", 5, 0));
  wait_fd(u, POLLIN, 3000);
  struct iovec iov[2] = {{buf, 2}, {buf + 2, 10}};
  struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
  show("udp.recvmsg", recvmsg(u, &mh, 0));
  show("udp.recvmsg_flags", mh.msg_flags);
  printf("udp.data: %.5s\n", buf);
  /* sendmmsg and recvmmsg: three datagrams out in one call, their echoes back in as few calls
     as they arrive in (MSG_WAITFORONE: the first waits, the rest are taken if there) */
  {
    struct iovec sv[3] = {{"one", 3}, {"three", 5}, {"four", 4}};
    struct mmsghdr sm[3];
    memset(sm, 0, sizeof sm);
    for (int i = 0; i < 3; i++) {
      sm[i].msg_hdr.msg_iov = &sv[i];
      sm[i].msg_hdr.msg_iovlen = 1;
    }
    show("udp.sendmmsg", sendmmsg(u, sm, 3, 0));
    printf("udp.sendmmsg_lens: %u %u %u\n", sm[0].msg_len, sm[1].msg_len, sm[2].msg_len);
    char rb[4][16];
    struct iovec rvv[4];
    struct mmsghdr rm[4];
    char got[64] = "";
    int total = 0, calls_ok = 1;
    for (int tries = 0; total < 3 && tries < 300; tries++) {
      memset(rm, 0, sizeof rm);
      for (int i = 0; i < 4; i++) {
        rvv[i].iov_base = rb[i];
        rvv[i].iov_len = sizeof rb[i];
        rm[i].msg_hdr.msg_iov = &rvv[i];
        rm[i].msg_hdr.msg_iovlen = 1;
      }
      wait_fd(u, POLLIN, 3000);
      int k = recvmmsg(u, rm, 4, MSG_WAITFORONE, NULL);
      if (k <= 0) {
        calls_ok = 0;
        break;
      }
      for (int i = 0; i < k; i++) {
        strncat(got, rb[i], rm[i].msg_len);
        strcat(got, ",");
      }
      total += k;
    }
    printf("udp.recvmmsg: %d %d %s\n", calls_ok, total, got);
    memset(rm, 0, sizeof rm);
    rvv[0].iov_base = rb[0];
    rvv[0].iov_len = sizeof rb[0];
    rm[0].msg_hdr.msg_iov = &rvv[0];
    rm[0].msg_hdr.msg_iovlen = 1;
    show("udp.recvmmsg_empty", recvmmsg(u, rm, 1, MSG_DONTWAIT, NULL));
  }
  show("udp.listen", listen(u, 1));
  close(u);

  /* writev and readv on a connection */
  s = conn('e');
  struct iovec wv[3] = {{"ab", 2}, {"cde", 3}, {"f", 1}};
  show("iov.writev", writev(s, wv, 3));
  wait_fd(s, POLLIN, 3000);
  usleep(20000);
  char r1[3], r2[10];
  struct iovec rv[2] = {{r1, 3}, {r2, 10}};
  show("iov.readv", readv(s, rv, 2));
  printf("iov.data: %.3s%.3s\n", r1, r2);
  close(s);

  /* signals: a handler without SA_RESTART interrupts blocking calls and waits */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, NULL);
  s = conn('e');
  ualarm(100000, 0);
  show("eintr.recv", recv(s, buf, sizeof buf, 0));
  ep = epoll_create1(0);
  ev.events = EPOLLIN;
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
  ualarm(100000, 0);
  show("eintr.epoll_wait", epoll_wait(ep, out, 4, 5000));
  struct pollfd pf = {s, POLLIN, 0};
  ualarm(100000, 0);
  show("eintr.poll", poll(&pf, 1, 5000));
  close(ep);
  /* with SA_RESTART a blocking recv goes on after the handler (the answer comes at 300 ms) */
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct sigaction got;
  sigaction(SIGALRM, NULL, &got);
  show("restart.handler_read_back", got.sa_handler == on_alarm && (got.sa_flags & SA_RESTART));
  pthread_t lw;
  pthread_create(&lw, NULL, late_writer, (void *)(long)s);
  ualarm(100000, 0);
  show("restart.recv", recv(s, buf, sizeof buf, 0));
  pthread_join(lw, NULL);
  /* ... but not when the socket has a receive timeout */
  rt.tv_sec = 2;
  rt.tv_usec = 0;
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof rt);
  ualarm(100000, 0);
  show("restart.recv_with_timeout", recv(s, buf, sizeof buf, 0));
  close(s);

  /* shutdown(SHUT_RD) by another thread ends a blocked recv with end of stream; what had
   * arrived before it is still read */
  s = conn('e');
  pthread_t sh;
  pthread_create(&sh, NULL, late_shutdown_rd, (void *)(long)s);
  show("shutrd.recv_while_blocked", recv(s, buf, sizeof buf, 0));
  pthread_join(sh, NULL);
  show("shutrd.recv_after", recv(s, buf, sizeof buf, 0));
  close(s);
  s = conn('e');
  show("shutrd.send", send(s, "ab", 2, 0));
  show("shutrd.poll_echo", wait_fd(s, POLLIN, 3000) & POLLIN);
  show("shutrd.shutdown", shutdown(s, SHUT_RD));
  show("shutrd.recv_queued", recv(s, buf, sizeof buf, 0));
  show("shutrd.recv_end", recv(s, buf, sizeof buf, 0));
  /* shut for reading: readable at end of stream, for poll and epoll at once */
  show("shutrd.poll_bits", wait_fd(s, POLLIN | POLLRDHUP | POLLOUT, 0));
  ep = epoll_create1(0);
  ev.events = EPOLLIN | EPOLLRDHUP;
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
  show("shutrd.epoll_now", epoll_wait(ep, out, 4, 0) == 1 ? (int)out[0].events : -1);
  close(ep);
  close(s);
  /* ... and another thread's shutdown(SHUT_RD) ends a poll and an epoll_wait that wait for
   * the socket to be readable */
  s = conn('e');
  pthread_create(&sh, NULL, late_shutdown_rd, (void *)(long)s);
  show("shutrd.poll_while_blocked", wait_fd(s, POLLIN | POLLRDHUP, 5000));
  pthread_join(sh, NULL);
  close(s);
  s = conn('e');
  ep = epoll_create1(0);
  ev.events = EPOLLIN | EPOLLRDHUP;
  epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
  pthread_create(&sh, NULL, late_shutdown_rd, (void *)(long)s);
  show("shutrd.epoll_while_blocked", epoll_wait(ep, out, 4, 5000) == 1 ? (int)out[0].events : -1);
  pthread_join(sh, NULL);
  close(ep);
  close(s);

  close(conn('q'));
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s server|client IP PORT\n", argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  /* 1,000 connections on one epoll (and the server's side of each): past the usual soft limit
   * of 1,024 descriptors */
  struct rlimit nofile;
  if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur < 4096 && nofile.rlim_max >= 4096) {
    nofile.rlim_cur = 4096;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  SIP = argv[2];
  PORT = atoi(argv[3]);
  if (!strcmp(argv[1], "server"))
    return server(argv[2], PORT);
  return client();
}
