#!/usr/bin/env bash
# What a semaphore permit's uncontended cycle costs the Redis server, in instructions, against
# P7's raw floor, whole commands included (reading the request, running the script, the
# reply): the acquire script as scripts.rs composes it and the release as the client sends it
# (ZREM of the member and ZCARD of the queue in one round trip), and the floor's acquire
# script (FLOOR_PERMIT_ACQUIRE in crates/distlock-bench/src/p7.rs) and ZREM. A redis-server
# runs under callgrind, which counts only while N cycles run (instrumentation switched on
# around them); the same with no cycle is subtracted. A small RESP client sends the commands
# one round trip at a time. Counts are the same from run to run, whatever else the machine
# does; they leave out the kernel's share (the sockets), which is the same on both sides.
# Usage: bash bench/permit_cost.sh [N]   (needs valgrind, redis-server and python3)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
N="${1:-1000}"
command -v valgrind >/dev/null || { echo "permit_cost.sh: needs valgrind" >&2; exit 1; }
ROOT="$root" N="$N" python3 - <<'PY'
import glob, os, re, socket, subprocess, tempfile, time
root, n = os.environ["ROOT"], int(os.environ["N"])
S = root + "/crates/distlock-redis/src/scripts/"
rd = lambda f: open(S + f).read()
# As scripts.rs composes it (PERMIT_ACQUIRE_SOURCE).
acquire = rd("fence.lua") + rd("permits.lua") + rd("permit_acquire.lua")
p7 = open(root + "/crates/distlock-bench/src/p7.rs").read()
floor = re.search(r'const FLOOR_PERMIT_ACQUIRE: &str = r"(.*?)";', p7, re.S).group(1)
K = ["distlock:{p}:permits", "distlock:{p}:pmeta", "distlock:{p}:pqueue", "distlock:{p}:plive",
     "distlock:{p}:fence", "distlock:{p}"]

class Resp:
    """One connection; each call sends commands and reads one reply each."""
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.f = self.s.makefile("rb")
    def call(self, *cmds):
        out = b""
        for c in cmds:
            args = [a if isinstance(a, bytes) else str(a).encode() for a in c]
            out += b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
        self.s.sendall(out)
        return [self.read() for _ in cmds]
    def read(self):
        line = self.f.readline()[:-2]
        t, rest = line[:1], line[1:]
        if t in (b"+", b"-"):
            return rest.decode()
        if t == b":":
            return int(rest)
        if t == b"$":
            if int(rest) < 0:
                return None
            data = self.f.read(int(rest) + 2)[:-2]
            return data.decode()
        if t == b"*":
            return [self.read() for _ in range(int(rest))]
        raise RuntimeError(line)

def distlock(r, sha, tok):
    h = f"{tok} 1764000000000 host/1"
    [x] = r.call(["EVALSHA", sha, 6, *K, tok, 4, 30000, "", 0, 60000, h, 0])
    assert x[0] == 1, x
    r.call(["ZREM", K[0], f"{x[1]} {h}"], ["ZCARD", K[2]])

def floor_cycle(r, sha, tok):
    [x] = r.call(["EVALSHA", sha, 1, K[0], tok, 4, 30000])
    assert x == 1, x
    r.call(["ZREM", K[0], tok])

cycles = {"distlock": (acquire, distlock), "floor": (floor, floor_cycle)}
out = {}
for name, (script, cycle) in cycles.items():
    d = tempfile.mkdtemp()
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    srv = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                            f"--callgrind-out-file={d}/out.%p", "redis-server", "--port", str(port),
                            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(150):
            try:
                r = Resp(port)
                if r.call(["PING"]) == ["PONG"]:
                    break
            except OSError:
                time.sleep(0.2)
        [sha] = r.call(["SCRIPT", "LOAD", script])
        for i in range(50):
            cycle(r, sha, f"warm{i}")
        totals = []
        for count in (0, n):
            ctl = lambda *a: subprocess.run(["callgrind_control", *a, str(srv.pid)], capture_output=True)
            ctl("-z"); ctl("-i", "on")
            for i in range(count):
                cycle(r, sha, f"tok{i}")
            r.call(["PING"])
            ctl("-i", "off"); ctl("-d")
            time.sleep(0.3)
            dump = max(glob.glob(d + "/out.*"), key=os.path.getmtime)
            totals.append(next(int(l.split()[1]) for l in open(dump) if l.startswith("totals:")))
        out[name] = (totals[1] - totals[0]) / n
    finally:
        srv.terminate(); srv.wait()
        subprocess.run(["rm", "-rf", d])
ver = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
print(f"Redis {ver.removeprefix('v=')}, callgrind, {n} cycles, server instructions per cycle (whole commands):")
for name, v in out.items():
    print(f"  {name:9} {v:10,.0f}")
print(f"  distlock / floor: {out['distlock'] / out['floor']:.2f}")
PY
