#!/usr/bin/env bash
# What a semaphore permit's uncontended cycle costs the Redis server, in instructions, against
# P7's raw floor: the acquire and release scripts as scripts.rs composes them, and the floor's
# (FLOOR_PERMIT_ACQUIRE in crates/distlock-bench/src/p7.rs, then ZREM), each run N times inside
# one EVAL by a redis-server under callgrind, which counts only that EVAL (instrumentation
# switched on around it); the same EVAL with no iteration is subtracted. Counts are the same
# from run to run, whatever else the machine does. They leave out what every command costs
# outside its script (reading the request, the reply, the socket: the same two commands on
# both sides), so the ratio of cycles in P7 is closer to 1 than the ratio of these counts.
# Usage: bash bench/permit_cost.sh [N]   (needs valgrind and redis-server)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
N="${1:-2000}"
command -v valgrind >/dev/null || { echo "permit_cost.sh: needs valgrind" >&2; exit 1; }
ROOT="$root" N="$N" python3 - <<'PY'
import glob, os, re, socket, subprocess, tempfile, time
root, n = os.environ["ROOT"], int(os.environ["N"])
S = root + "/crates/distlock-redis/src/scripts/"
rd = lambda f: open(S + f).read()
# As scripts.rs composes them (PERMIT_ACQUIRE_SOURCE, PERMIT_RELEASE_SOURCE).
acquire = rd("fence.lua") + rd("permit_acquire.lua") + rd("permits.lua") + rd("permit_acquire_rest.lua")
release = (rd("permit_release.lua") + rd("fence.lua") + rd("queue.lua") + rd("permits.lua")
           + rd("permit_release_rest.lua"))
p7 = open(root + "/crates/distlock-bench/src/p7.rs").read()
floor = re.search(r'const FLOOR_PERMIT_ACQUIRE: &str = r"(.*?)";', p7, re.S).group(1)
K = ("{'distlock:{p}:permits','distlock:{p}:pmeta','distlock:{p}:pqueue','distlock:{p}:plive',"
     "'distlock:{p}:fence','distlock:{p}'}")
# The permit's member is '<fence> <holder value>' (see permits.lua); the floor's acquire returns
# 1 and takes no holder value.
cycles = {
    "distlock": (acquire, release,
                 "local x = acq(K, {tok,'4','30000','','0','60000',tok..' 1764000000000 host/1','0'})\n"
                 "if x[1] ~= 1 then bad = bad + 1 end\n"
                 "rel({K[1],K[2],K[3],K[4],K[6]}, {tok, tok..' chan', "
                 "string.format('%d', x[2])..' '..tok..' 1764000000000 host/1'})\n"),
    "floor": (floor, "return redis.call('ZREM', KEYS[1], ARGV[1])",
              "if acq(K, {tok,'4','30000'}) ~= 1 then bad = bad + 1 end\n"
              "rel(K, {tok})\n"),
}
def body(acq, rel, step, count):
    return ("local function acq(KEYS, ARGV)\n" + acq + "\nend\n"
            "local function rel(KEYS, ARGV)\n" + rel + "\nend\n"
            "local K = " + K + "\nlocal bad = 0\n"
            "for i = 1, " + str(count) + " do\nlocal tok = 'tok' .. i\n" + step + "end\nreturn bad")
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
out = {}
for name, (acq, rel, step) in cycles.items():
    d = tempfile.mkdtemp()
    port = free_port()
    srv = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                            f"--callgrind-out-file={d}/out.%p", "redis-server", "--port", str(port),
                            "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli = lambda *a: subprocess.run(["redis-cli", "-p", str(port)] + list(a),
                                    capture_output=True, text=True).stdout.strip()
    try:
        for _ in range(150):
            if cli("PING") == "PONG":
                break
            time.sleep(0.2)
        cli("EVAL", body(acq, rel, step, 10), "0")
        totals = []
        for count in (0, n):
            cli("FLUSHALL")
            ctl = lambda *a: subprocess.run(["callgrind_control", *a, str(srv.pid)], capture_output=True)
            ctl("-z"); ctl("-i", "on")
            bad = cli("EVAL", body(acq, rel, step, count), "0")
            ctl("-i", "off"); ctl("-d")
            if bad != "0":
                raise SystemExit(f"permit_cost.sh: {name}: {bad} cycles did not take a permit")
            time.sleep(0.3)
            dump = max(glob.glob(d + "/out.*"), key=os.path.getmtime)
            totals.append(next(int(l.split()[1]) for l in open(dump) if l.startswith("totals:")))
        out[name] = (totals[1] - totals[0]) / n
    finally:
        srv.terminate(); srv.wait()
        subprocess.run(["rm", "-rf", d])
ver = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
print(f"Redis {ver.removeprefix('v=')}, callgrind, {n} cycles inside one EVAL, instructions per cycle:")
for name, v in out.items():
    print(f"  {name:9} {v:10,.0f}")
print(f"  distlock / floor: {out['distlock'] / out['floor']:.2f}")
PY
