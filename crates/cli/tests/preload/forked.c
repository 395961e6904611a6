/* A child process after fork and the DockNet sockets it inherits, where the pipe's stack stays
 * the parent's: the parent uses the listener after the fork, before the child tries it, so the
 * child cannot take the stack (a child takes it only while its parent does not use it). The
 * child's listener is then one no connection ever reaches (never ready, accept would wait),
 * and every call on its connection but close fails at once. The parent's connection carries
 * on. (Children that take the stack: prefork.c.)
 *
 *   forked server PORT      listen, fork a child that tries the listener once the parent has
 *                           used it, accept one client, fork a child that tries the
 *                           connection, then echo one message
 *   forked client IP PORT   connect, wait for the server's "R", send "ping", expect it back
 *
 * Prints one line per outcome: "name: value". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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
      printf("%s.recv: %s\n", tag, err(recv(fd, buf, sizeof buf, MSG_DONTWAIT)));
      printf("%s.send: %s\n", tag, err(send(fd, "x", 1, MSG_DONTWAIT)));
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

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 3 && !strcmp(argv[1], "server")) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    if (bind(l, (void *)&a, sizeof a) || listen(l, 8)) {
      perror("listen");
      return 1;
    }
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
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    inet_pton(AF_INET, argv[2], &a.sin_addr);
    for (int i = 0; i < 50; i++) {
      int s = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(s, (void *)&a, sizeof a) == 0) {
        char r, buf[8] = {0};
        int n = recv(s, &r, 1, 0);
        printf("client.ready: %d %c\n", n, n == 1 ? r : '-');
        send(s, "ping", 4, 0);
        n = recv(s, buf, 4, MSG_WAITALL);
        printf("client.echo: %d %s\n", n, buf);
        return 0;
      }
      close(s);
      usleep(100000);
    }
    printf("client.connect: failed\n");
    return 1;
  }
  fprintf(stderr, "usage: forked server PORT | forked client IP PORT\n");
  return 2;
}
