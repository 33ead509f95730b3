// redis-semaphore (its Mutex, Semaphore and RedlockMutex) on ioredis behind the protocol of
// bench/peers/README.md:
//   node semaphore.js cycles N URL...                      Mutex (RedlockMutex over several URLs)
//   node semaphore.js contend URL TASKS START_NS MILLIS HOLD_US            Mutex, one hot key
//   node semaphore.js handoff URL HOLD_US GAP_US START_NS MILLIS           Mutex
//   node semaphore.js renew URL N MILLIS TTL_MS                            Mutex with its refresh
//   node semaphore.js rw-cycles KIND N URL          KIND write: the Mutex; read: n/a
//   node semaphore.js sem-cycles N PERMITS URL                             Semaphore
//   node semaphore.js sem-contend URL PERMITS TASKS START_NS MILLIS HOLD_US Semaphore, one name
//   node semaphore.js rw-mix ...                                           n/a
// Tasks are concurrent async functions on Node's one thread. Every lock object is made fresh
// for each acquisition (each has its own random identifier), with the library's defaults
// otherwise: its refresh timer runs while a lock is held, and waiting is its own polling
// (an attempt every retryInterval = 10 ms).
"use strict";
const Redis = require("ioredis");
const { Mutex, Semaphore, RedlockMutex } = require("redis-semaphore");

const TTL_MS = 30000;
const monoNs = () => process.hrtime.bigint(); // CLOCK_MONOTONIC, as the other processes use
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function na(why) {
  console.log(`n/a (${why})`);
  process.exit(3);
}

// Runs `cycle` 50 times to warm up, then `n` times; prints cycles per second.
async function timed(n, cycle) {
  for (let i = 0; i < 50; i++) await cycle();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) await cycle();
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log((n / secs).toFixed(1));
}

// One uncontended tryAcquire + release of a fresh lock made by `make`.
function once(make) {
  return async () => {
    const lock = make();
    if (!(await lock.tryAcquire())) throw new Error("the uncontended lock was busy");
    await lock.release();
  };
}

const noWait = { lockTimeout: TTL_MS, acquireAttemptsLimit: 1 };

async function cycles(n, urls) {
  const clients = urls.map((u) => new Redis(u));
  const make =
    clients.length > 1
      ? () => new RedlockMutex(clients, "peer:redis-semaphore:redlock", noWait)
      : () => new Mutex(clients[0], "peer:redis-semaphore", noWait);
  await timed(n, once(make));
  clients.forEach((c) => c.disconnect());
}

async function rwCycles(kind, n, url) {
  if (kind !== "write") na("redis-semaphore has no read-write lock");
  const client = new Redis(url);
  await timed(n, once(() => new Mutex(client, "peer:redis-semaphore:rw", noWait)));
  client.disconnect();
}

async function semCycles(n, permits, url) {
  const client = new Redis(url);
  await timed(n, once(() => new Semaphore(client, "peer:redis-semaphore:sem", permits, noWait)));
  client.disconnect();
}

// TASKS lockers on one name from START_NS for MILLIS ms, each holding HOLD_US; `make` gives a
// fresh lock whose acquire waits the library's way until at most the end of the run.
async function contendWith(url, tasks, startNs, millis, holdUs, make) {
  const client = new Redis(url);
  const end = startNs + BigInt(millis) * 1000000n;
  let got = 0;
  let errors = 0;
  const task = async () => {
    while (monoNs() < startNs) await sleep(0.2);
    while (monoNs() < end) {
      const left = Math.max(Number(end - monoNs()) / 1e6, 1);
      const lock = make(client, { lockTimeout: TTL_MS, acquireTimeout: left });
      let ok;
      try {
        ok = await lock.tryAcquire();
      } catch (e) {
        errors++;
        continue;
      }
      if (!ok) continue;
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

async function handoff(url, holdUs, gapUs, startNs, millis) {
  const client = new Redis(url);
  const end = startNs + BigInt(millis) * 1000000n;
  const events = [];
  let errors = 0;
  let asked = null;
  while (monoNs() < startNs) await sleep(0.2);
  while (monoNs() < end) {
    if (asked === null) asked = monoNs();
    const called = asked;
    const left = Math.max(Number(end - monoNs()) / 1e6, 1);
    const lock = new Mutex(client, "peer:redis-semaphore:handoff", {
      lockTimeout: TTL_MS,
      acquireTimeout: left,
    });
    let ok;
    try {
      ok = await lock.tryAcquire();
    } catch (e) {
      errors++;
      continue;
    }
    if (!ok) continue;
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

// N mutexes kept alive by the library's refresh timer, set to the same TTL/3 pace as distlock's
// watchdog.
async function renew(url, n, millis, ttlMs) {
  const client = new Redis(url);
  let lost = 0;
  const locks = [];
  for (let i = 0; i < n; i++) {
    const lock = new Mutex(client, `peer:redis-semaphore:held:${i}`, {
      lockTimeout: ttlMs,
      acquireAttemptsLimit: 1,
      refreshInterval: Math.max(Math.round(ttlMs / 3), 1),
      onLockLost: () => lost++,
    });
    if (!(await lock.tryAcquire())) throw new Error("a held key was busy");
    locks.push(lock);
  }
  console.log("ready");
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  await sleep(millis);
  const cpu = process.cpuUsage(cpu0);
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const held = locks.filter((l) => l.isAcquired).length;
  console.log(JSON.stringify({ held, cpu_s: (cpu.user + cpu.system) / 1e6, seconds: secs }));
  process.stdin.once("data", async () => {
    await Promise.all(locks.map((l) => l.release()));
    client.disconnect();
    if (lost > 0) console.error(`${lost} locks were lost`);
    process.exit(0);
  });
}

const fail = (e) => {
  console.error(e);
  process.exit(1);
};
const [mode, ...rest] = process.argv.slice(2);
const mutex = (client, opts) => new Mutex(client, "peer:redis-semaphore:hot", opts);
if (mode === "cycles") {
  cycles(Number(rest[0]), rest.slice(1)).catch(fail);
} else if (mode === "contend") {
  contendWith(rest[0], Number(rest[1]), BigInt(rest[2]), Number(rest[3]), Number(rest[4]), mutex)
    .catch(fail);
} else if (mode === "handoff") {
  handoff(rest[0], Number(rest[1]), Number(rest[2]), BigInt(rest[3]), Number(rest[4])).catch(fail);
} else if (mode === "renew") {
  renew(rest[0], Number(rest[1]), Number(rest[2]), Number(rest[3])).catch(fail);
} else if (mode === "rw-cycles") {
  rwCycles(rest[0], Number(rest[1]), rest[2]).catch(fail);
} else if (mode === "sem-cycles") {
  semCycles(Number(rest[0]), Number(rest[1]), rest[2]).catch(fail);
} else if (mode === "sem-contend") {
  const permits = Number(rest[1]);
  const sem = (client, opts) =>
    new Semaphore(client, "peer:redis-semaphore:sem-hot", permits, opts);
  contendWith(rest[0], Number(rest[2]), BigInt(rest[3]), Number(rest[4]), Number(rest[5]), sem)
    .catch(fail);
} else if (mode === "rw-mix") {
  na("redis-semaphore has no read-write lock");
} else {
  console.error("usage: see bench/peers/README.md");
  process.exit(2);
}
