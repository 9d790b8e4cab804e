// The socket shells against a real hub in a process of its own, on Node's own WebSocket:
// a hub killed with -9 and started again on the same port is reconnected to (Node's socket
// fires `error` and no `close` on a refused connection), and a frozen hub (SIGSTOP) is noticed.
//
// Needs a global WebSocket (Node 22, or Node 20 with --experimental-websocket) and a Python
// with the hub's dependencies (CONVSYNC_PYTHON, else the worktree's .venv); skipped without
// them. tests/web/test_js_liveness.py runs this file with both, so the suite never skips it.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { Message, SummaryFeed, connect } from '../convsync.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const VENV_PYTHON = join(ROOT, '.venv', 'bin', 'python');
const PYTHON = process.env.CONVSYNC_PYTHON ?? (existsSync(VENV_PYTHON) ? VENV_PYTHON : null);
const SCALE = Number(process.env.CONVSYNC_TIMEOUT_SCALE ?? '1');
const skip =
  typeof globalThis.WebSocket !== 'function'
    ? 'no global WebSocket (Node 20: run with --experimental-websocket)'
    : PYTHON === null
      ? 'no Python for the hub (set CONVSYNC_PYTHON)'
      : false;

const HUB_SCRIPT = `
import asyncio, sys
from server import Hub, HubConfig
from server.store import open_store

async def main(db, port):
    config = HubConfig.from_env(ping_interval=None)
    async with Hub(open_store(db), host="127.0.0.1", port=port, config=config) as hub:
        print(hub.port, flush=True)
        await hub.serve_forever()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
`;

/** A hub process on a SQLite file: port 0 the first time, the same port after. */
class HubProcess {
  constructor() {
    this.dir = mkdtempSync(join(tmpdir(), 'convsync-liveness-'));
    this.port = 0;
    this.child = null;
  }

  get url() {
    return `ws://127.0.0.1:${this.port}`;
  }

  /** Start and resolve once the hub answers (it prints its port when it serves). */
  async start() {
    for (let attempt = 0; attempt < 5; attempt += 1) {
      const child = spawn(PYTHON, ['-c', HUB_SCRIPT, join(this.dir, 'hub.db'), String(this.port)], {
        env: { ...process.env, PYTHONPATH: ROOT },
        stdio: ['ignore', 'pipe', 'ignore'],
      });
      const line = await new Promise((done) => {
        const lines = createInterface({ input: child.stdout });
        lines.once('line', (text) => done(text.trim()));
        child.once('exit', () => done(null));
      });
      if (line !== null && /^\d+$/.test(line)) {
        this.child = child;
        this.port = Number(line);
        return;
      }
      child.kill('SIGKILL');
      await sleep(200); // the port can be briefly taken after a kill: try again
    }
    throw new Error(`the hub did not start on port ${this.port}`);
  }

  signal(name) {
    this.child?.kill(name);
  }

  async kill() {
    const child = this.child;
    this.child = null;
    if (child === null || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((done) => child.once('exit', done));
    child.kill('SIGCONT'); // a frozen hub cannot exit otherwise
    child.kill('SIGKILL');
    await exited;
  }

  async stop() {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

function sleep(ms) {
  return new Promise((done) => setTimeout(done, ms));
}

/** Resolves with the first `state` event of `shell` to be `state`, or rejects after `ms`. */
function stateReached(shell, state, ms) {
  return new Promise((done, fail) => {
    if (shell.state === state) return done(Date.now());
    const timer = setTimeout(() => {
      stop();
      fail(new Error(`not ${state} within ${ms} ms (still ${shell.state})`));
    }, ms * SCALE);
    const stop = shell.on('state', (event) => {
      if (event.state !== state) return;
      clearTimeout(timer);
      stop();
      done(Date.now());
    });
  });
}

/** Kill the hub with -9, let refused attempts pile up, start it again on the same port, and
 * return how long after it answered `shell` was connected again. */
async function restartUnder(shell, hub) {
  const port = hub.port;
  const lost = stateReached(shell, 'disconnected', 5000);
  await hub.kill();
  await lost;
  await sleep(1000); // attempts against the closed port are refused meanwhile
  assert.equal(shell.state, 'disconnected');
  await hub.start();
  const answered = Date.now();
  assert.equal(hub.port, port, 'the hub came back on the same port');
  const connectedAt = await stateReached(shell, 'connected', 2000);
  return connectedAt - answered;
}

// Backoff capped at 500 ms: the default cap (5 s, full jitter) could itself wait longer than
// the 2 s bar after a second of refused attempts; the bar is on noticing, not on the cap.
const RETRY = { backoff: 50, maxBackoff: 500 };

test('a Replica reconnects after the hub is killed -9 and comes back on its port', { skip }, async () => {
  const hub = new HubProcess();
  await hub.start();
  const replica = connect(hub.url, 'liveness.replica', { client: 'js-liveness', ...RETRY });
  try {
    await replica.ready;
    replica.conversation.push(Message.user('before'));
    await replica.flush();
    const took = await restartUnder(replica, hub);
    assert.ok(took <= 2000 * SCALE, `reconnected ${took} ms after the hub answered`);
    replica.conversation.push(Message.user('after'));
    await replica.flush();
    assert.equal(replica.conversation.messages().length, 2);
  } finally {
    replica.close();
    await hub.stop();
  }
});

test('a SummaryFeed reconnects after the hub is killed -9 and comes back on its port', { skip }, async () => {
  const hub = new HubProcess();
  await hub.start();
  const replica = connect(hub.url, 'liveness.feed', { client: 'js-writer', ...RETRY });
  const feed = new SummaryFeed(hub.url, { prefix: 'liveness.', ...RETRY });
  try {
    await replica.ready;
    replica.conversation.push(Message.user('hello'));
    await replica.flush();
    replica.close();
    void feed.start();
    await stateReached(feed, 'connected', 5000);
    assert.deepEqual([...feed.rows.keys()], ['liveness.feed']);
    const took = await restartUnder(feed, hub);
    assert.ok(took <= 2000 * SCALE, `reconnected ${took} ms after the hub answered`);
    assert.equal(feed.rows.get('liveness.feed')?.entries, 1);
  } finally {
    feed.close();
    replica.close();
    await hub.stop();
  }
});

test('a SummaryFeed notices a frozen hub (SIGSTOP) within keepalive + 1 s', { skip }, async () => {
  const hub = new HubProcess();
  await hub.start();
  const keepalive = 1000;
  const feed = new SummaryFeed(hub.url, { keepalive, ...RETRY });
  const states = [];
  feed.on('state', (event) => states.push(event));
  try {
    void feed.start();
    await stateReached(feed, 'connected', 5000);
    await sleep(keepalive); // pings answered meanwhile: still connected
    assert.equal(feed.state, 'connected');
    hub.signal('SIGSTOP');
    const frozenAt = Date.now();
    const noticedAt = await stateReached(feed, 'disconnected', keepalive + 1000);
    assert.ok(noticedAt - frozenAt <= (keepalive + 1000) * SCALE, `${noticedAt - frozenAt} ms`);
    assert.match(states.at(-1).reason, /^keepalive timed out/);
    hub.signal('SIGCONT');
    await stateReached(feed, 'connected', 5000);
  } finally {
    feed.close();
    await hub.stop();
  }
});
