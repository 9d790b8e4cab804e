// The client side of bench/peer_hocuspocus/run.py: one workload on one system, in Node.
//
//   node clients.mjs SYSTEM WORKLOAD URL TEXTS [ARG...]
//
// SYSTEM is `convsync` (the JS replica, client/web/convsync.js, against a convsync hub) or
// `hocuspocus` (@hocuspocus/provider with a Y.Array `messages` of Y.Maps {id, role, text}
// against a Hocuspocus server). TEXTS is a JSON file of message texts (the same on both sides).
// Both sides use the `ws` package as their WebSocket. Prints one JSON line with the figures.
//
//   converge N READERS        ms from the writer's first append until every reader holds N
//   catch-up N                build N (writer + one watcher), then ms from a fresh client's
//                             connect until it holds N: {build, catchup}
//   latency RATE SECONDS      one writer at RATE messages/s for SECONDS, one reader: the ms
//                             from each append call to its arrival at the reader: {samples}
//   load CONVERSATIONS N      CONVERSATIONS writers, N messages each, all held open; prints
//                             {ready: true} once every one is stored, then waits for stdin
//                             to close
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { randomUUID } from 'node:crypto';
import WebSocket from 'ws';
import * as Y from 'yjs';
import { HocuspocusProvider } from '@hocuspocus/provider';
import { connect, Message } from '../../client/web/convsync.js';

const [system, workload, url, textsFile, ...args] = process.argv.slice(2);
const texts = JSON.parse(readFileSync(textsFile, 'utf8'));
const WAIT = 180_000; // ms any one wait may last
// Resolves once written: a pipe is written asynchronously, and exiting first cuts the line.
const out = (value) =>
  new Promise((resolve) => process.stdout.write(`${JSON.stringify(value)}\n`, resolve));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function until(check, what) {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const poll = () => {
      if (check()) resolve(undefined);
      else if (performance.now() - started > WAIT) reject(new Error(`timed out: ${what}`));
      else setTimeout(poll, 1);
    };
    poll();
  });
}

// ---------------------------------------------------------------------- convsync

class ConvsyncClient {
  constructor(id, client) {
    this.replica = connect(url, id, { client, WebSocket });
    this.waiters = new Set();
    this.replica.progress.add(() => {
      for (const waiter of Array.from(this.waiters)) waiter();
    });
  }

  get length() {
    return this.replica.conversation.length;
  }

  async open() {
    await this.replica.ready;
  }

  /** Resolves once the conversation holds `n` entries (checked after every message). */
  holds(n) {
    return new Promise((resolve, reject) => {
      if (this.length >= n) return resolve(undefined);
      const timer = setTimeout(() => reject(new Error(`timed out at ${this.length}/${n}`)), WAIT);
      const check = () => {
        if (this.length >= n) {
          this.waiters.delete(check);
          clearTimeout(timer);
          resolve(undefined);
        }
      };
      this.waiters.add(check);
    });
  }

  append(text) {
    this.replica.conversation.push(Message.user(text));
  }

  /** Calls `seen(k)` for each new message `"<k> ..."` as it arrives. */
  watch(seen) {
    let at = this.length;
    this.waiters.add(() => {
      const conversation = this.replica.conversation;
      for (; at < conversation.length; at += 1) {
        seen(Number.parseInt(conversation.entry(at).message.content[0].text, 10));
      }
    });
  }

  async settle() {
    await this.replica.flush();
  }

  close() {
    this.replica.close();
  }
}

// ---------------------------------------------------------------------- hocuspocus

class HocuspocusClient {
  constructor(id) {
    this.doc = new Y.Doc();
    this.messages = this.doc.getArray('messages');
    this.waiters = new Set();
    this.doc.on('update', () => {
      for (const waiter of Array.from(this.waiters)) waiter();
    });
    this.synced = new Promise((resolve) => {
      this.provider = new HocuspocusProvider({
        url,
        name: id,
        document: this.doc,
        WebSocketPolyfill: WebSocket,
        onSynced: () => resolve(undefined),
      });
    });
  }

  get length() {
    return this.messages.length;
  }

  async open() {
    await this.synced;
  }

  holds(n) {
    return new Promise((resolve, reject) => {
      if (this.length >= n) return resolve(undefined);
      const timer = setTimeout(() => reject(new Error(`timed out at ${this.length}/${n}`)), WAIT);
      const check = () => {
        if (this.length >= n) {
          this.waiters.delete(check);
          clearTimeout(timer);
          resolve(undefined);
        }
      };
      this.waiters.add(check);
    });
  }

  append(text) {
    const doc = this.doc;
    doc.transact(() => {
      const map = new Y.Map();
      map.set('id', `msg_${randomUUID().replaceAll('-', '')}`);
      map.set('role', 'user');
      map.set('text', text);
      this.messages.push([map]);
    });
  }

  /** Several messages in one transaction (the memory workload's build only). */
  appendMany(run) {
    this.doc.transact(() => {
      this.messages.push(
        run.map((text) => {
          const map = new Y.Map();
          map.set('id', `msg_${randomUUID().replaceAll('-', '')}`);
          map.set('role', 'user');
          map.set('text', text);
          return map;
        }),
      );
    });
  }

  watch(seen) {
    this.messages.observe((event) => {
      for (const delta of event.changes.delta) {
        for (const map of delta.insert ?? []) seen(Number.parseInt(map.get('text'), 10));
      }
    });
  }

  async settle() {
    // Every local update was handed to the socket; the server has it once it answers a
    // round trip: wait until nothing is unsynced.
    await until(() => this.provider.unsyncedChanges === 0, 'unsynced changes');
  }

  close() {
    this.provider.destroy();
  }
}

const Client = system === 'convsync' ? ConvsyncClient : HocuspocusClient;
const client = (id, name) => new Client(id, name);
const newId = () => `peer-${randomUUID().slice(0, 12)}`;

// ---------------------------------------------------------------------- workloads

async function converge(n, readers) {
  const id = newId();
  const all = [];
  for (let k = 0; k < readers; k += 1) all.push(client(id, `reader-${k}`));
  const writer = client(id, 'writer');
  await Promise.all([...all, writer].map((c) => c.open()));
  const begin = performance.now();
  for (const text of texts.slice(0, n)) writer.append(text);
  await Promise.all(all.map((reader) => reader.holds(n)));
  const ms = performance.now() - begin;
  for (const c of [...all, writer]) c.close();
  return { ms };
}

async function catchUp(n) {
  const id = newId();
  const writer = client(id, 'writer');
  const watcher = client(id, 'watcher');
  await Promise.all([writer.open(), watcher.open()]);
  let begin = performance.now();
  for (const text of texts.slice(0, n)) writer.append(text);
  await watcher.holds(n);
  await writer.settle();
  const build = performance.now() - begin;
  watcher.close();
  await sleep(200); // the watcher's socket is gone; the writer keeps the room loaded
  begin = performance.now();
  const fresh = client(id, 'fresh');
  await fresh.open();
  await fresh.holds(n);
  const catchup = performance.now() - begin;
  if (fresh.length !== n) throw new Error(`fresh holds ${fresh.length}, not ${n}`);
  fresh.close();
  writer.close();
  return { build, catchup };
}

async function latency(rate, seconds) {
  const id = newId();
  const writer = client(id, 'writer');
  const reader = client(id, 'reader');
  await Promise.all([writer.open(), reader.open()]);
  const sentAt = [];
  const samples = [];
  reader.watch((k) => {
    if (sentAt[k] !== undefined && k >= 0) samples[k] = performance.now() - sentAt[k];
  });
  const total = Math.round(rate * seconds);
  const warmup = Math.round(rate * 0.5); // the first half second is not counted
  const begin = performance.now();
  let sent = 0;
  while (sent < total + warmup) {
    const due = Math.min(total + warmup, Math.floor(((performance.now() - begin) / 1000) * rate) + 1);
    for (; sent < due; sent += 1) {
      sentAt[sent] = performance.now();
      writer.append(`${sent} ${texts[sent % texts.length]}`);
    }
    const next = begin + (sent / rate) * 1000;
    await sleep(Math.max(0, next - performance.now()));
  }
  await until(() => samples.filter((x) => x !== undefined).length >= total + warmup, 'samples');
  writer.close();
  reader.close();
  return { samples: samples.slice(warmup) };
}

async function load(conversations, n) {
  const writers = [];
  const build = async (c) => {
    const writer = client(`load-${c}`, `writer-${c}`);
    await writer.open();
    const run = texts.slice(0, n);
    if (writer.appendMany) {
      for (let k = 0; k < run.length; k += 100) writer.appendMany(run.slice(k, k + 100));
    } else {
      for (const text of run) writer.append(text);
    }
    await writer.settle();
    writers.push(writer);
  };
  for (let c = 0; c < conversations; c += 10) {
    const batch = [];
    for (let k = c; k < Math.min(conversations, c + 10); k += 1) batch.push(build(k));
    await Promise.all(batch);
  }
  await out({ ready: true });
  await new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.on('close', resolve);
    process.stdin.resume();
  });
  for (const writer of writers) writer.close();
  return null;
}

const deadline = setTimeout(() => {
  out({ error: 'timed out' }).then(() => process.exit(2));
}, 15 * 60_000);

try {
  let result;
  if (workload === 'converge') result = await converge(Number(args[0]), Number(args[1]));
  else if (workload === 'catch-up') result = await catchUp(Number(args[0]));
  else if (workload === 'latency') result = await latency(Number(args[0]), Number(args[1]));
  else if (workload === 'load') result = await load(Number(args[0]), Number(args[1]));
  else throw new Error(`unknown workload ${workload}`);
  if (result !== null) await out(result);
  clearTimeout(deadline);
  process.exit(0);
} catch (error) {
  await out({ error: String(error?.stack ?? error) });
  process.exit(1);
}
