#!/usr/bin/env bash
# Unmodified servers and load generators over the kernel's bridge and over DockNet with the
# preload library, same placement (server core 1, client core 0), same run:
#   wrk against nginx (a 612-byte page, keep-alive), redis-benchmark GET/SET against redis,
#   and pgbench (select-only, then the default TPC-B-like, 8 clients) against PostgreSQL, whose
#   postmaster forks a backend per connection (over DockNet the postmaster's library serves each
#   connection for its backend), and wrk against nginx as a reverse proxy (proxy_pass, upstream
#   keep-alive) to a second nginx, beside wrk straight to that backend, and wrk against gunicorn
#   with 4 sync workers (a pre-forked pool, a connection per request), answering at once, after
#   a 5 ms wait (a database's answer; the other workers serve meanwhile), and after a call to a
#   backend container (a new connection to redis, PING) and the 5 ms wait. PostgreSQL, the proxy
#   and gunicorn run unpinned (their processes and the daemon share both cores), the others pinned.
# Builds everything it uses under a name unique to this run and removes it on exit.
#
#   ./scripts/preload-bench.sh [SECONDS]      (root; after cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
docknet_usage "$@"
docknet_root "$@"

SECS=${1:-5}
BIN=$PWD/target/release
[ -f "$BIN/libdocknet_preload.so" ] || { echo "build first: cargo build --release" >&2; exit 1; }
for t in nginx wrk redis-server redis-benchmark pgbench gunicorn; do
    command -v $t >/dev/null || { echo "$t is missing (./scripts/setup.sh installs it)" >&2; exit 1; }
done
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$PGBIN/postgres" ] || { echo "postgres is missing (./scripts/setup.sh installs it)" >&2; exit 1; }
TAG=dnplb$$
WORK=$(mktemp -d /tmp/$TAG.XXXX)
chmod 755 "$WORK"  # shown to the containers, each of which runs as a user of its own
RUN=/dev/shm/$TAG
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    # the daemon's fd holder outlives a killed daemon on purpose: end it by its pid
    [ -f "$RUN/holder.pid" ] && kill -9 "$(cat "$RUN/holder.pid")" 2>/dev/null || true
    for ns in h s c b; do ip netns del $TAG$ns 2>/dev/null || true; done
    # (and what the kernel modes' servers left in the host's /tmp: pid files, temporary
    # directories, PostgreSQL's cluster, all named after the run)
    rm -rf "$WORK" "$RUN" /tmp/$TAG-*
}
trap cleanup EXIT INT TERM

mkdir -p "$WORK/www" "$RUN"
head -c 612 /dev/zero | tr '\0' 'x' > "$WORK/www/index.html"
cat > "$WORK/nginx.conf" <<EOF
daemon off; master_process off; worker_processes 1;
error_log stderr error; pid /tmp/$TAG-nginx.pid;
events { worker_connections 4096; }
http { access_log off; sendfile on; keepalive_requests 1000000;
  client_body_temp_path /tmp/$TAG-b; proxy_temp_path /tmp/$TAG-p; fastcgi_temp_path /tmp/$TAG-f;
  uwsgi_temp_path /tmp/$TAG-u; scgi_temp_path /tmp/$TAG-s;
  server { listen 80; root $WORK/www; } }
EOF
NGINX=(nginx -c "$WORK/nginx.conf")
# PostgreSQL made afresh in the server's /tmp (a container's own), trusting the test network;
# its shared memory in files of the cluster (not /dev/shm), so a killed server leaves nothing
cat > "$WORK/pg.sh" <<EOF
set -e
rm -rf /tmp/$TAG-pg /tmp/$TAG-pgs; mkdir /tmp/$TAG-pgs
$PGBIN/initdb -D /tmp/$TAG-pg -A trust -U postgres >/dev/null
echo "host all all 0.0.0.0/0 trust" >> /tmp/$TAG-pg/pg_hba.conf
exec $PGBIN/postgres -D /tmp/$TAG-pg -k /tmp/$TAG-pgs -c listen_addresses='*' -c fsync=off \\
    -c synchronous_commit=off -c max_connections=50 -c dynamic_shared_memory_type=mmap
EOF
# (setpriv execs, where runuser forks: the server is the process the run ends by its pid)
PG=(setpriv --reuid=postgres --regid=postgres --init-groups bash "$WORK/pg.sh")
pgb() { # the client's commands against HOST
    echo "pgbench -q -i -h $1 -U postgres postgres >/dev/null 2>&1 && \
        pgbench -n -S -c 8 -j 2 -T $SECS -h $1 -U postgres postgres && \
        pgbench -n -c 8 -j 2 -T $SECS -h $1 -U postgres postgres"
}
# nginx as a reverse proxy on port 8080 to the backend BACKEND (an nginx serving the page)
proxy_conf() {
    cat > "$WORK/proxy-$1.conf" <<EOF
daemon off; master_process off; worker_processes 1;
error_log stderr error; pid /tmp/$TAG-proxy.pid;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  client_body_temp_path /tmp/$TAG-pb; proxy_temp_path /tmp/$TAG-pp; fastcgi_temp_path /tmp/$TAG-pf;
  uwsgi_temp_path /tmp/$TAG-pu; scgi_temp_path /tmp/$TAG-ps;
  upstream be { server $1:80; keepalive 64; keepalive_requests 1000000; }
  server { listen 8080;
    location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
EOF
    echo "$WORK/proxy-$1.conf"
}
# a WSGI application answering the same 612-byte page
cat > "$WORK/app.py" <<EOF
def app(environ, start_response):
    body = b"x" * 612
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "612")])
    return [body]
EOF
# and one that waits 5 ms per request first (a synchronous worker's database call)
cat > "$WORK/appwait.py" <<EOF
import time
def app(environ, start_response):
    time.sleep(0.005)
    body = b"x" * 612
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "612")])
    return [body]
EOF
# and one that asks a backend first (a new connection to redis, PING, then the 5 ms of a
# query), made for each mode's backend address (the redis of container b)
for m in kernel:10.79.0.4 docknet:10.78.0.4; do
cat > "$WORK/appdb_${m%%:*}.py" <<EOF
import socket, time
def app(environ, start_response):
    with socket.create_connection(("${m#*:}", 6379), timeout=5) as s:
        s.sendall(b"PING\r\n")
        if not s.recv(16).startswith(b"+PONG"):
            raise RuntimeError("no PONG")
    time.sleep(0.005)
    body = b"x" * 612
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "612")])
    return [body]
EOF
done
chmod 644 "$WORK/app.py" "$WORK/appwait.py" "$WORK"/appdb_*.py
GUNICORN=(gunicorn -w 4 -b 0.0.0.0:8000 --chdir "$WORK" app:app)
GUNICORN_WAIT=(gunicorn -w 4 -b 0.0.0.0:8000 --chdir "$WORK" appwait:app)
REDIS=(redis-server --bind 0.0.0.0 --port 6379 --save '' --appendonly no --protected-mode no --dir /tmp)
WRK=(wrk -t1 -c32 -d${SECS}s)
RB=(redis-benchmark -p 6379 -t set,get -n 400000 -c 50 -q)

# the kernel's bridge (Docker's default network): a bridge in a host namespace, a veth per side
ip netns add ${TAG}h; ip netns add ${TAG}s; ip netns add ${TAG}c; ip netns add ${TAG}b
ip -n ${TAG}h link add br0 type bridge; ip -n ${TAG}h link set br0 up
for x in s c b; do
    ip link add ${TAG}$x type veth peer name eth0 netns ${TAG}$x
    ip link set ${TAG}$x netns ${TAG}h
    ip -n ${TAG}h link set ${TAG}$x master br0 up
    ip -n ${TAG}$x link set lo up; ip -n ${TAG}$x link set eth0 up
done
ip -n ${TAG}s addr add 10.79.0.2/24 dev eth0
ip -n ${TAG}b addr add 10.79.0.4/24 dev eth0
ip -n ${TAG}c addr add 10.79.0.3/24 dev eth0

kernel() { # kernel NAME SERVER... -- CLIENT...
    local name=$1; shift
    local srv=() cli=()
    while [ "$1" != "--" ]; do srv+=("$1"); shift; done; shift; cli=("$@")
    local pin=(taskset -c 1) pinc=(taskset -c 0)
    [ -n "${UNPINNED:-}" ] && pin=() pinc=()
    ip netns exec ${TAG}s "${pin[@]}" "${srv[@]}" >/dev/null 2>&1 & PIDS+=($!)
    sleep ${SETTLE:-1}
    echo "== $name over the bridge${UNPINNED:+, unpinned}"
    ip netns exec ${TAG}c "${pinc[@]}" "${cli[@]}" 2>&1 | tr '\r' '\n' | grep -E "Requests/sec|requests per second|^tps" | sed 's/^ *//'
    kill -9 "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
}

"$BIN/docknet" --log warn daemon --run-dir "$RUN" --socket "$RUN/ctl.sock" --idle adaptive >/dev/null 2>&1 & PIDS+=($!)
sleep 1
D=("$BIN/docknet" --socket "$RUN/ctl.sock")
"${D[@]}" pipe create ${TAG}s --ip 10.78.0.2/24 >/dev/null
"${D[@]}" pipe create ${TAG}c --ip 10.78.0.3/24 >/dev/null
"${D[@]}" pipe create ${TAG}b --ip 10.78.0.4/24 >/dev/null
"${D[@]}" fc connect ${TAG}s ${TAG}c >/dev/null
"${D[@]}" fc connect ${TAG}s ${TAG}b >/dev/null
"${D[@]}" fc connect ${TAG}c ${TAG}b >/dev/null

docknet() { # docknet NAME SERVER... -- CLIENT...
    local name=$1; shift
    local srv=() cli=()
    while [ "$1" != "--" ]; do srv+=("$1"); shift; done; shift; cli=("$@")
    local pin=(--cpu 1) pinc=(--cpu 0) user=()
    [ -n "${UNPINNED:-}" ] && pin=() pinc=()
    # (PostgreSQL's programs look their user up by name: the host's postgres user)
    if [ "${srv[0]}" = setpriv ]; then user=(--user postgres); srv=("${srv[@]:4}"); fi
    "${D[@]}" run --pipe ${TAG}s "${pin[@]}" "${user[@]}" --preload --bind "$WORK" -- "${srv[@]}" >/dev/null 2>&1 & PIDS+=($!)
    sleep ${SETTLE:-1}
    echo "== $name over docknet-fc-preload${UNPINNED:+, unpinned}"
    "${D[@]}" run --pipe ${TAG}c "${pinc[@]}" "${user[@]}" --preload -- "${cli[@]}" 2>&1 | tr '\r' '\n' | grep -E "Requests/sec|requests per second|^tps" | sed 's/^ *//'
    kill -9 "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
    sleep 0.5
}

kernel "wrk -> nginx" "${NGINX[@]}" -- "${WRK[@]}" http://10.79.0.2/
docknet "wrk -> nginx" "${NGINX[@]}" -- "${WRK[@]}" http://10.78.0.2/
kernel "redis-benchmark -> redis" "${REDIS[@]}" -- "${RB[@]}" -h 10.79.0.2
docknet "redis-benchmark -> redis" "${REDIS[@]}" -- "${RB[@]}" -h 10.78.0.2
UNPINNED=1 SETTLE=2 kernel "wrk -> gunicorn (4 workers)" "${GUNICORN[@]}" -- "${WRK[@]}" http://10.79.0.2:8000/
UNPINNED=1 SETTLE=2 docknet "wrk -> gunicorn (4 workers)" "${GUNICORN[@]}" -- "${WRK[@]}" http://10.78.0.2:8000/
UNPINNED=1 SETTLE=2 kernel "wrk -> gunicorn (4 workers, 5 ms waits)" "${GUNICORN_WAIT[@]}" -- "${WRK[@]}" http://10.79.0.2:8000/
UNPINNED=1 SETTLE=2 docknet "wrk -> gunicorn (4 workers, 5 ms waits)" "${GUNICORN_WAIT[@]}" -- "${WRK[@]}" http://10.78.0.2:8000/
UNPINNED=1 SETTLE=4 kernel "pgbench -> PostgreSQL" "${PG[@]}" -- bash -c "$(pgb 10.79.0.2)"
UNPINNED=1 SETTLE=4 docknet "pgbench -> PostgreSQL" "${PG[@]}" -- bash -c "$(pgb 10.78.0.2)"

# the reverse proxy: wrk straight to the backend, then through the proxy (unpinned)
proxy() { # proxy MODE
    local run_b run_s run_c be
    if [ "$1" = kernel ]; then
        be=10.79.0.4
        run_b=(ip netns exec ${TAG}b) run_s=(ip netns exec ${TAG}s) run_c=(ip netns exec ${TAG}c)
    else
        be=10.78.0.4
        run_b=("${D[@]}" run --pipe ${TAG}b --preload --bind "$WORK" --)
        run_s=("${D[@]}" run --pipe ${TAG}s --preload --bind "$WORK" --)
        run_c=("${D[@]}" run --pipe ${TAG}c --preload --)
    fi
    local conf; conf=$(proxy_conf $be)
    "${run_b[@]}" "${NGINX[@]}" >/dev/null 2>&1 & PIDS+=($!); local pb=$!
    "${run_s[@]}" nginx -c "$conf" >/dev/null 2>&1 & PIDS+=($!); local ps=$!
    sleep 1
    local name; [ "$1" = kernel ] && name="the bridge" || name=docknet-fc-preload
    for target in "$be:80 (direct)" "${be%.4}.2:8080 (through the proxy)"; do
        for c in 1 32; do
            echo "== wrk -c$c -> nginx ${target#* } over $name, unpinned"
            "${run_c[@]}" wrk -t1 -c$c -d${SECS}s --latency "http://${target%% *}/" 2>&1 \
                | tr '\r' '\n' | grep -E "Requests/sec| 50%| 99%" | sed 's/^ *//' | paste -sd' '
        done
    done
    kill -9 $ps $pb; wait $ps $pb 2>/dev/null || true
    sleep 0.5
}
proxy kernel
proxy docknet

# gunicorn's workers asking a backend container (redis) for each request: over DockNet the
# workers that do not drive the stack connect through the one that does (unpinned)
backend_call() { # backend_call MODE
    local run_b run_s run_c ip name
    if [ "$1" = kernel ]; then
        ip=10.79.0.2 name="the bridge"
        run_b=(ip netns exec ${TAG}b) run_s=(ip netns exec ${TAG}s) run_c=(ip netns exec ${TAG}c)
    else
        ip=10.78.0.2 name=docknet-fc-preload
        run_b=("${D[@]}" run --pipe ${TAG}b --preload --)
        run_s=("${D[@]}" run --pipe ${TAG}s --preload --bind "$WORK" --)
        run_c=("${D[@]}" run --pipe ${TAG}c --preload --)
    fi
    "${run_b[@]}" "${REDIS[@]}" >/dev/null 2>&1 & PIDS+=($!); local pb=$!
    "${run_s[@]}" gunicorn -w 4 -b 0.0.0.0:8000 --chdir "$WORK" "appdb_$1:app" >/dev/null 2>&1 & PIDS+=($!); local ps=$!
    sleep 2
    echo "== wrk -> gunicorn (4 workers, a redis call and 5 ms per request) over $name, unpinned"
    "${run_c[@]}" "${WRK[@]}" "http://$ip:8000/" 2>&1 | tr '\r' '\n' \
        | grep -E "Requests/sec|Non-2xx|Socket errors|Latency" | sed 's/^ *//' | paste -sd' '
    kill -9 $ps $pb; wait $ps $pb 2>/dev/null || true
    sleep 0.5
}
backend_call kernel
backend_call docknet
