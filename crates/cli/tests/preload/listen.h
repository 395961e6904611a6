/* The test programs' listening socket: TCP on `port` (any address), non-blocking when asked,
 * or the program ends. Included by forked.c and prefork.c. */
#ifndef DOCKNET_TEST_LISTEN_H
#define DOCKNET_TEST_LISTEN_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

static int listen_tcp(int port, int nonblock) {
  int l = socket(AF_INET, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (bind(l, (void *)&a, sizeof a) || listen(l, 64)) {
    perror("listen");
    exit(1);
  }
  return l;
}

#endif
