// node-redlock (v5) on ioredis behind the protocol of bench/peers/README.md:
//   node peer.js cycles N URL...
//   node peer.js contend URL TASKS START_NS MILLIS HOLD_US
// Tasks are concurrent async functions on Node's one thread.
"use strict";
const Redis = require("ioredis");
const Redlock = require("redlock").default;

const TTL_MS = 30000;
const monoNs = () => process.hrtime.bigint(); // CLOCK_MONOTONIC, as the other processes use
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function cycles(n, urls) {
  const clients = urls.map((u) => new Redis(u));
  const redlock = new Redlock(clients, { retryCount: 0 });
  const cycle = async () => {
    const lock = await redlock.acquire(["peer:node-redlock"], TTL_MS);
    await lock.release();
  };
  for (let i = 0; i < 50; i++) await cycle();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await cycle();
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log((n / secs).toFixed(1));
  clients.forEach((c) => c.disconnect());
}

async function contend(url, tasks, startNs, millis, holdUs) {
  const client = new Redis(url);
  // The library's defaults for waiting: 10 retries 200 ms apart, with jitter.
  const redlock = new Redlock([client]);
  const end = startNs + BigInt(millis) * 1000000n;
  let got = 0;
  let errors = 0;
  const task = async () => {
    while (monoNs() < startNs) await sleep(0.2);
    while (monoNs() < end) {
      let lock;
      try {
        lock = await redlock.acquire(["peer:node-redlock:hot"], TTL_MS);
      } catch (e) {
        errors++;
        continue;
      }
      if (monoNs() < end) got++;
      if (holdUs > 0) await sleep(holdUs / 1000);
      try {
        await lock.release();
      } catch (e) {
        errors++;
      }
    }
  };
  await Promise.all(Array.from({ length: tasks }, task));
  console.log(JSON.stringify({ acquisitions: got, errors }));
  client.disconnect();
}

// N locks held with redlock's automatic extension (`using`), extended when a third of the
// TTL is left... that is, at the same TTL/3 pace as distlock's watchdog.
async function renew(url, n, millis, ttlMs) {
  const client = new Redis(url);
  const redlock = new Redlock([client], { retryCount: 0, automaticExtensionThreshold: (2 * ttlMs) / 3 });
  let ready = 0;
  let release;
  const released = new Promise((r) => (release = r));
  let measured;
  const signals = [];
  const all = Array.from({ length: n }, (_, i) =>
    redlock.using([`peer:node-redlock:held:${i}`], ttlMs, async (signal) => {
      signals.push(signal);
      ready++;
      if (ready === n) measured = measure();
      await released;
      return !signal.aborted;
    }),
  );
  async function measure() {
    console.log("ready");
    const cpu0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    await sleep(millis);
    const cpu = process.cpuUsage(cpu0);
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    return { cpu_s: (cpu.user + cpu.system) / 1e6, seconds: secs };
  }
  while (ready < n) await sleep(10);
  const m = await measured;
  // Held: the automatic extension has not aborted the routine (it aborts on a failed extension).
  const results = { held: signals.filter((s) => !s.aborted).length, ...m };
  console.log(JSON.stringify(results));
  process.stdin.once("data", () => release());
  const held = await Promise.all(all);
  client.disconnect();
  if (held.some((h) => !h)) console.error("some locks were lost");
  process.exit(0);
}

// One locker taking turns with another process: each acquisition's times, for P3.
async function handoff(url, holdUs, gapUs, startNs, millis) {
  const client = new Redis(url);
  const redlock = new Redlock([client], { retryCount: -1 });
  const end = startNs + BigInt(millis) * 1000000n;
  const events = [];
  let errors = 0;
  let asked = null;
  while (monoNs() < startNs) await sleep(0.2);
  while (monoNs() < end) {
    if (asked === null) asked = monoNs();
    const called = asked;
    let lock;
    try {
      lock = await redlock.acquire(["peer:node-redlock:handoff"], TTL_MS);
    } catch (e) {
      errors++;
      continue;
    }
    asked = null;
    const acquired = monoNs();
    await sleep(holdUs / 1000);
    const sent = monoNs();
    await lock.release();
    events.push([acquired, sent, called].map(Number));
    await sleep(gapUs / 1000);
  }
  console.log(JSON.stringify({ events, errors }));
  client.disconnect();
}

const [mode, ...rest] = process.argv.slice(2);
if (mode === "cycles") {
  cycles(Number(rest[0]), rest.slice(1)).catch((e) => { console.error(e); process.exit(1); });
} else if (mode === "handoff") {
  handoff(rest[0], Number(rest[1]), Number(rest[2]), BigInt(rest[3]), Number(rest[4]))
    .catch((e) => { console.error(e); process.exit(1); });
} else if (mode === "renew") {
  renew(rest[0], Number(rest[1]), Number(rest[2]), Number(rest[3]))
    .catch((e) => { console.error(e); process.exit(1); });
} else if (mode === "contend") {
  contend(rest[0], Number(rest[1]), BigInt(rest[2]), Number(rest[3]), Number(rest[4]))
    .catch((e) => { console.error(e); process.exit(1); });
} else if (mode === "rw-cycles" || mode === "rw-mix") {
  console.log("n/a (node-redlock has no read-write lock)");
  process.exit(3);
} else if (mode === "sem-cycles" || mode === "sem-contend") {
  console.log("n/a (node-redlock has no semaphore)");
  process.exit(3);
} else {
  console.error("usage: cycles N URL... | contend URL TASKS START_NS MILLIS HOLD_US");
  process.exit(2);
}
