#!/bin/bash
# Counts the syscalls of nginx and CART per proxied request (issue 13,
# target 5), with the kernel's tracepoints (perf stat, no strace slowdown),
# during each one's turn of one `cart-bench overhead` round, then samples
# both with perf record (kernel against user time). Run from the repository
# root as root, with no other load; writes into this directory.
#   bench/results/2026-12-02-syscalls/run.sh <tag> <stat|record>
set -e
D=bench/results/2026-12-02-syscalls
tag=$1 mode=$2
# A previous run's processes must be gone, or pgrep finds them.
while pgrep -x cart >/dev/null || pgrep -f "nginx: worker" >/dev/null; do sleep 0.5; done
( nice -n -15 bin/cart-bench overhead --bin $PWD/bin --rounds 1 --duration 20s > $D/overhead-$tag.txt 2>&1 ) &
bp=$!
sleep 2
for who in nginx cart; do
  pids=""
  for i in $(seq 1 120); do
    if [ $who = nginx ]; then pids=$(pgrep -f "nginx: worker" | tr '\n' ' '); else pids=$(pgrep -x cart | tr '\n' ' '); fi
    [ -n "$pids" ] && break; sleep 0.5
  done
  # Its turn has begun when its first process uses CPU.
  p=$(echo $pids | awk '{print $1}')
  for i in $(seq 1 200); do
    a=$(awk '{print $14+$15}' /proc/$p/stat); sleep 0.5; b=$(awk '{print $14+$15}' /proc/$p/stat)
    [ $((b-a)) -ge 10 ] && break
  done
  sleep 3
  pl=$(echo $pids | tr ' ' ','); pl=${pl%,}
  if [ $mode = stat ]; then
    perf stat -e syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_nanosleep,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_getsockopt,context-switches,task-clock \
      -p $pl sleep 5 2> $D/perfstat-$who-$tag.txt
  else
    perf record -F 1000 -o /tmp/perf-$who-$tag.data -p $pl sleep 5 2> /dev/null
    perf report -i /tmp/perf-$who-$tag.data --no-children --sort dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -8 > $D/perfdso-$who-$tag.txt
  fi
done
wait $bp
cat $D/overhead-$tag.txt
