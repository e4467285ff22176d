#!/usr/bin/env bash
# Builds the serving image (Dockerfile) with podman, runs it on a tiny model mounted at
# /models/model, and checks it as a load balancer and a client would: the container's health
# check, /health/live and /health/ready, a chat completion, the non-root user, and that
# `podman stop` (SIGTERM) drains and exits 0. Then (unless ASTRAI_TEST_COMPOSE=0) the compose
# setup: two replicas behind HAProxy, requests through the proxy, one replica stopped.
#
#   scripts/test-image.sh            (scripts/test.sh runs it when ASTRAI_TEST_IMAGE=1)
#
# Skips (exit 0, with the reason) where podman cannot run containers. No registry is reached:
# the Debian 12 base image is made here with debootstrap from Debian's packages (once; kept as
# localhost/astrai-base:bookworm), or named by ASTRAI_IMAGE_BASE.
# Costs (2 cores): base image ~2.5 min once; image build 27 min cold (measured while the cores
# were shared with other builds), 2.6 min after a one-file change (ccache mount), seconds when
# podman's layer cache holds it; the checks ~40 s.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
log() { echo "test-image: $*"; }

if ! command -v podman >/dev/null 2>&1; then
  log "skipped: podman is not installed (apt-get install podman runc debootstrap)"
  exit 0
fi
if ! podman info >/dev/null 2>&1; then
  log "skipped: podman info fails: $(podman info 2>&1 | tail -n 1)"
  exit 0
fi

# This workplace's machines (a VM without CAP_SYS_RESOURCE, cgroups v1 with a v2 hierarchy
# beside it) need two settings podman's defaults do not have: rlimits no higher than ours
# (podman asks for nofile and nproc 1048576, which only CAP_SYS_RESOURCE may set), and runc
# (crun 1.8 refuses "cgroups in hybrid mode"). Harmless elsewhere; a caller's CONTAINERS_CONF wins.
work=$(mktemp -d /tmp/astrai-image.XXXXXX)
cleanup_cmds=()
cleanup() {
  for c in "${cleanup_cmds[@]}"; do eval "$c" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
if [ -z "${CONTAINERS_CONF:-}" ]; then
  nproc_limit=$(ulimit -Hu); [ "$nproc_limit" = unlimited ] || [ "$nproc_limit" -gt 4096 ] && nproc_limit=4096
  nofile_limit=$(ulimit -Hn); [ "$nofile_limit" = unlimited ] && nofile_limit=65536
  {
    echo "[containers]"
    echo "default_ulimits = [\"nofile=$nofile_limit:$nofile_limit\", \"nproc=$nproc_limit:$nproc_limit\"]"
    if [ -d /sys/fs/cgroup/unified ] && command -v runc >/dev/null 2>&1; then
      echo "[engine]"
      echo "runtime = \"runc\""
    fi
  } > "$work/containers.conf"
  export CONTAINERS_CONF="$work/containers.conf"
fi

base=${ASTRAI_IMAGE_BASE:-localhost/astrai-base:bookworm}
if ! podman image exists "$base"; then
  if [ -n "${ASTRAI_IMAGE_BASE:-}" ]; then log "ASTRAI_IMAGE_BASE=$base does not exist"; exit 1; fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "skipped: no base image $base and no debootstrap to make one (apt-get install debootstrap)"
    exit 0
  fi
  log "making the Debian 12 base image $base with debootstrap"
  t0=$SECONDS
  mirror=$(awk '/^URIs:/ {print $2; exit} /^deb / {print $2; exit}' /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null || true)
  debootstrap --variant=minbase bookworm "$work/rootfs" "${mirror:-http://deb.debian.org/debian}" > "$work/debootstrap.log" 2>&1 ||
    { tail -n 20 "$work/debootstrap.log"; exit 1; }
  rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
  tar -C "$work/rootfs" -c . | podman import - "$base" >/dev/null
  rm -rf "$work/rootfs"
  log "base image made in $((SECONDS - t0)) s"
fi
# Whether a container starts at all (rlimits, cgroups, runtime).
if ! out=$(podman run --rm "$base" true 2>&1); then
  log "skipped: podman cannot run a container here: $out"
  exit 0
fi

log "building localhost/astrai:test"
t0=$SECONDS
podman build --format docker --build-arg BUILD_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" \
  -t localhost/astrai:test . > "$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; exit 1; }
log "image built in $((SECONDS - t0)) s; $(podman image inspect localhost/astrai:test --format '{{.Size}}' |
  awk '{printf "%.0f MB", $1 / 1e6}')"

# A tiny random-weight Qwen3 model with the real tokenizer (as the server's end-to-end tests use).
scripts/fetch-assets.sh >/dev/null
ASTRAI_ASSETS="$root/assets" /usr/bin/python3 tests/serve/make_model.py "$work/model" >/dev/null
chmod -R a+rX "$work"

port=${ASTRAI_IMAGE_PORT:-18431}
name=astrai-image-test-$$
cleanup_cmds+=("podman rm -f $name")
# The image's CMD with a short --grace (a replaced CMD must keep --host 0.0.0.0).
podman run -d --name "$name" -p "127.0.0.1:$port:8000" -v "$work/model:/models/model:ro" \
  localhost/astrai:test --model /models/model --host 0.0.0.0 --port 8000 --grace 2 > /dev/null 2> "$work/run.log"
# (Without systemd podman cannot schedule the periodic health checks and says so on stderr;
# `podman healthcheck run` below runs the image's check.)
base_url=http://127.0.0.1:$port
ok=0
for _ in $(seq 1 300); do
  if curl -fsS -o /dev/null "$base_url/health/ready" 2>/dev/null; then ok=1; break; fi
  sleep 0.2
done
[ $ok = 1 ] || { podman logs "$name"; log "FAIL: /health/ready never said 200"; exit 1; }

fails=0
check() {  # check NAME COMMAND...: runs it, counts a failure
  if "${@:2}"; then log "ok: $1"; else log "FAIL: $1"; fails=$((fails + 1)); fi
}
status_of() { curl -s -o /dev/null -w '%{http_code}' "$1"; }
check "podman healthcheck run (the image's HEALTHCHECK: curl /health)" podman healthcheck run "$name"
check "/health/live is 200" test "$(status_of "$base_url/health/live")" = 200
check "/health/ready is 200" test "$(status_of "$base_url/health/ready")" = 200
check "runs as the non-root user astrai" test "$(podman exec "$name" id -un)" = astrai
reply=$(curl -fsS "$base_url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0}' || true)
check "chat completion through the published port" \
  /usr/bin/python3 -c 'import json,sys; r=json.loads(sys.argv[1]); assert r["choices"][0]["message"]["content"] is not None and r["usage"]["completion_tokens"] > 0, r' "$reply"
# SIGTERM with a stream in flight: the stream ends with [DONE] and the process exits 0.
curl -sN "$base_url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":3000,"stream":true,"ignore_eos":true}' \
  > "$work/stream.txt" 2>/dev/null &
stream_pid=$!
for _ in $(seq 1 100); do grep -q '"content"' "$work/stream.txt" 2>/dev/null && break; sleep 0.1; done
t0=$SECONDS
podman stop -t 60 "$name" > /dev/null 2>&1
stop_s=$((SECONDS - t0))
wait "$stream_pid" || true
code=$(podman inspect "$name" --format '{{.State.ExitCode}}')
check "podman stop: SIGTERM drains and exits 0 (exit $code, ${stop_s} s)" test "$code" = 0
check "the in-flight stream ended with [DONE]" grep -q 'data: \[DONE\]' "$work/stream.txt"
check "the log shows the drain" sh -c "podman logs $name 2>&1 | grep -q 'SIGTERM: draining'"

if [ "${ASTRAI_TEST_COMPOSE:-1}" = 1 ]; then
  if ! command -v podman-compose >/dev/null 2>&1; then
    log "compose: skipped: podman-compose is not installed (apt-get install podman-compose)"
  else
    # The compose file's images, built from the same base; the server image is the one above.
    podman tag localhost/astrai:test localhost/astrai:latest
    podman build --format docker --build-arg RUNTIME_IMAGE="$base" -t localhost/astrai-proxy:latest \
      -f deploy/Dockerfile.haproxy deploy > "$work/proxy-build.log" 2>&1 || { tail -n 20 "$work/proxy-build.log"; exit 1; }
    project=astraiimagetest$$
    compose=(podman-compose -p "$project" -f docker-compose.yml)
    lb_port=$((port + 1))
    export ASTRAI_MODEL_DIR="$work/model" ASTRAI_PORT="127.0.0.1:$lb_port"
    cleanup_cmds+=("${compose[*]} down -t 5" "podman network rm ${project}_default")
    "${compose[@]}" up -d --no-build > "$work/compose.log" 2>&1 || { cat "$work/compose.log"; exit 1; }
    lb=http://127.0.0.1:$lb_port
    ok=0
    for _ in $(seq 1 300); do
      [ "$(status_of "$lb/health/ready")" = 200 ] && { ok=1; break; }
      sleep 0.2
    done
    check "compose: the proxy answers /health/ready" test $ok = 1
    # Both replicas serve (leastconn over idle replicas alternates); then one is stopped and
    # every request still succeeds through the other.
    for r in astrai-1 astrai-2; do
      for _ in $(seq 1 300); do
        podman exec "${project}_${r}_1" curl -fs -o /dev/null http://127.0.0.1:8000/health/ready 2>/dev/null && break
        sleep 0.2
      done
    done
    sleep 3  # and marked up by the proxy's checks (every 2 s)
    n_ok=0
    for i in $(seq 1 6); do
      curl -fsS -o /dev/null "$lb/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4}' && n_ok=$((n_ok + 1))
    done
    check "compose: 6 of 6 requests through the proxy ($n_ok)" test $n_ok = 6
    served() {  # chat completions answered 200 by one replica, from its /metrics
      podman exec "${project}_$1_1" curl -s http://127.0.0.1:8000/metrics |
        awk '/^astrai_http_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\}/ {n = $2} END {print n + 0}'
    }
    s1=$(served astrai-1); s2=$(served astrai-2)
    check "compose: both replicas served requests (astrai-1 $s1, astrai-2 $s2)" test "$s1" -gt 0 -a "$s2" -gt 0
    # astrai-1 is stopped (SIGTERM, drain) while requests keep coming: none may fail.
    for i in $(seq 1 20); do
      curl -s -o /dev/null -w '%{http_code}\n' "$lb/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4}'
    done > "$work/during-stop.txt" &
    loop_pid=$!
    sleep 1
    podman stop -t 45 "${project}_astrai-1_1" > /dev/null 2>&1
    wait "$loop_pid"
    n_ok=$(grep -c '^200$' "$work/during-stop.txt" || true)
    check "compose: astrai-1 stopped amid 20 requests, 20 of 20 succeed ($n_ok)" test "$n_ok" = 20
  fi
fi

[ $fails = 0 ] || { log "$fails check(s) failed"; podman logs "$name" 2>&1 | tail -n 20; exit 1; }
log "all checks passed"
