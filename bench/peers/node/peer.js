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

const [mode, ...rest] = process.argv.slice(2);
if (mode === "cycles") {
  cycles(Number(rest[0]), rest.slice(1)).catch((e) => { console.error(e); process.exit(1); });
} else if (mode === "contend") {
  contend(rest[0], Number(rest[1]), BigInt(rest[2]), Number(rest[3]), Number(rest[4]))
    .catch((e) => { console.error(e); process.exit(1); });
} else {
  console.error("usage: cycles N URL... | contend URL TASKS START_NS MILLIS HOLD_US");
  process.exit(2);
}
