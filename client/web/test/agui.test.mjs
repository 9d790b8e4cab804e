// AG-UI's own client (`HttpAgent` from @ag-ui/client) against a real hub with Python workers
// (tests/support/kithub.py): a turn streamed with reasoning, text and a tool call, which the
// client's own schemas and verifier accept; a client reattaching mid-run ends with exactly the
// uncut client's messages; an approval answered through `resume` lands once, and a second
// resume of it gets RUN_ERROR; a stop ends the run cancelled.
//
// Needs a Python with the hub's dependencies (CONVSYNC_PYTHON, else the worktree's .venv) and
// the npm packages (scripts/ensure-npm); skipped without Python. tests/web/test_js_agui.py
// runs this file with both (so the suite never skips it) and checks the raw streams written to
// CONVSYNC_AGUI_RAW with the Python `ag_ui.core` models.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { HttpAgent } from '@ag-ui/client';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const VENV_PYTHON = join(ROOT, '.venv', 'bin', 'python');
const PYTHON = process.env.CONVSYNC_PYTHON ?? (existsSync(VENV_PYTHON) ? VENV_PYTHON : null);
const SCALE = Number(process.env.CONVSYNC_TIMEOUT_SCALE ?? '1');
const RAW = process.env.CONVSYNC_AGUI_RAW ?? null;
const skip = PYTHON === null ? 'no Python for the hub (set CONVSYNC_PYTHON)' : false;

/** The hub process and its line protocol (one JSON command, one JSON answer). */
class KitHub {
  async start() {
    this.child = spawn(PYTHON, [join(ROOT, 'tests', 'support', 'kithub.py')], {
      env: { ...process.env, PYTHONPATH: ROOT },
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    this.lines = createInterface({ input: this.child.stdout })[Symbol.asyncIterator]();
    this.url = (await this.next()).url;
  }

  async next() {
    const { value, done } = await within(30, this.lines.next(), 'the hub script to answer');
    assert.ok(!done, 'the hub script ended');
    return JSON.parse(value);
  }

  async ask(command) {
    this.child.stdin.write(JSON.stringify(command) + '\n');
    return this.next();
  }

  stop() {
    this.child?.stdin.end();
  }
}

function within(seconds, promise, what) {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), seconds * 1000 * SCALE);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

const hub = new KitHub();
let raws = 0;
const warnings = [];

before(async () => {
  if (skip) return;
  await hub.start();
  const warn = console.warn;
  console.warn = (...args) => {
    warnings.push(args.map(String).join(' '));
    warn(...args);
  };
});
after(() => hub.stop());

/** A fetch that keeps each response body's text (for the Python models' check). */
function recordingFetch(name) {
  return async (url, init) => {
    const response = await fetch(url, init);
    if (!RAW || !response.body) return response;
    const [mine, theirs] = response.body.tee();
    const file = join(RAW, `${name}-${(raws += 1)}.sse`);
    new Response(mine).text().then(
      (text) => writeFileSync(file, text),
      () => {},
    );
    return new Response(theirs, { status: response.status, headers: response.headers });
  };
}

function agent(thread, name = thread) {
  return new HttpAgent({ url: `${hub.url}/v1/agui/${thread}`, threadId: thread, fetch: recordingFetch(name) });
}

/** Run `a` once, collecting the events the client applied. */
async function run(a, params = {}, seen = []) {
  const result = await within(60, a.runAgent(params, { onEvent: ({ event }) => void seen.push(event) }), 'a run');
  return { result, seen };
}

const say = (a, text) => a.addMessage({ id: crypto.randomUUID(), role: 'user', content: text });

test('a turn streams into the client: reasoning, text, a tool call, its result, the answer', { skip }, async () => {
  await hub.ask({ worker: 'ag-turn', tokens: 30 });
  const a = agent('ag-turn');
  say(a, 'What is the weather in Lisbon?');
  const { seen } = await run(a);
  const types = seen.map((e) => e.type);
  assert.equal(types[0], 'RUN_STARTED');
  assert.equal(types.at(-1), 'RUN_FINISHED');
  for (const kind of ['REASONING_MESSAGE_CONTENT', 'TEXT_MESSAGE_CONTENT', 'TOOL_CALL_ARGS', 'TOOL_CALL_RESULT']) {
    assert.ok(types.includes(kind), kind);
  }
  assert.ok(types.filter((t) => t === 'TEXT_MESSAGE_CONTENT').length > 3, 'the answer streamed in pieces');
  const roles = a.messages.map((m) => m.role);
  assert.deepEqual(roles, ['user', 'reasoning', 'assistant', 'tool', 'assistant']);
  const [, reasoning, step, tool, answer] = a.messages;
  assert.match(reasoning.content, /call the tool/);
  assert.equal(step.toolCalls[0].function.name, 'weather');
  assert.deepEqual(JSON.parse(step.toolCalls[0].function.arguments), { city: 'Lisbon' });
  assert.equal(tool.content, '18°C, clear');
  assert.match(answer.content, /w29 \(turn 1\) $/);
  // the messages are the entries the hub holds, under the entries' ids
  const state = await hub.ask({ state: 'ag-turn' });
  const ids = state.entries.map((e) => e.source_id ?? e.id);
  assert.deepEqual(
    a.messages.filter((m) => m.role !== 'reasoning').map((m) => m.id),
    ids,
  );
  assert.equal(state.entries.at(-1).message.content[0].text, answer.content);
  assert.deepEqual(warnings.filter((w) => w.includes('[ag-ui]')), []);
});

test('a client reattaching mid-run ends with exactly the uncut client messages', { skip }, async () => {
  await hub.ask({ worker: 'ag-reattach', tokens: 150, delay: 0.01 });
  const uncut = agent('ag-reattach', 'uncut');
  say(uncut, 'Tell me, slowly.');
  let late = null;
  let contents = 0;
  const lateDone = new Promise((resolveLate, rejectLate) => {
    const watcher = {
      onTextMessageContentEvent: () => {
        contents += 1;
        if (contents === 20 && late === null) {
          late = agent('ag-reattach', 'late'); // a fresh page: no messages, no new one
          run(late).then(resolveLate, rejectLate);
        }
      },
    };
    uncut.subscribe(watcher);
  });
  await run(uncut);
  const { seen } = await lateDone;
  assert.ok(contents >= 20, 'the late client attached while the answer streamed');
  assert.equal(seen[1].type, 'MESSAGES_SNAPSHOT');
  assert.ok(seen.some((e) => e.type === 'TEXT_MESSAGE_CONTENT'), 'the late client got the rest live');
  assert.deepEqual(late.messages, uncut.messages);
  const answer = uncut.messages.at(-1).content;
  assert.match(answer, /^w0 w1 .* w149 \(turn 1\) $/);
});

test('an approval answered through resume lands once; a second resume gets RUN_ERROR', { skip }, async () => {
  await hub.ask({ worker: 'ag-ask', tokens: 10 });
  const a = agent('ag-ask');
  say(a, 'Weather please; I approve each call first.'); // the worker asks on "approve"
  const first = await run(a);
  const finished = first.seen.at(-1);
  assert.equal(finished.type, 'RUN_FINISHED');
  assert.equal(finished.outcome.type, 'interrupt');
  const [interrupt] = finished.outcome.interrupts;
  assert.match(interrupt.id, /^aside_/);
  assert.equal(interrupt.reason, 'tool_approval');
  assert.equal(interrupt.toolCallId, a.messages.at(-1).toolCalls[0].id);
  assert.deepEqual(a.pendingInterrupts.map((i) => i.id), [interrupt.id]);

  const resume = [{ interruptId: interrupt.id, status: 'resolved', payload: true }];
  const second = await run(a, { resume });
  assert.equal(second.seen.at(-1).type, 'RUN_FINISHED');
  assert.equal(a.messages.at(-2).role, 'tool');
  assert.equal(a.messages.at(-2).content, '18°C, clear'); // approved: the tool ran
  const state = await hub.ask({ state: 'ag-ask' });
  const approvals = state.asides.filter((s) => s.kind === 'rig.approval');
  assert.equal(approvals.length, 1);
  assert.equal(approvals[0].id, interrupt.id);
  assert.equal(approvals[0].value.state, 'approved');

  const { seen: refused } = await run(a, { resume }); // RUN_ERROR is the run's end, not a throw
  assert.deepEqual(refused.map((e) => e.type), ['RUN_ERROR']);
  assert.equal(refused[0].code, 'decided');
  const again = await hub.ask({ state: 'ag-ask' });
  assert.deepEqual(again, state, 'the second resume changed nothing');
});

test('a stop ends the run cancelled, the answer so far kept', { skip }, async () => {
  await hub.ask({ worker: 'ag-stop', tokens: 400, delay: 0.02 });
  const a = agent('ag-stop');
  say(a, 'A very long answer, please.');
  let stopped = null;
  const seen = [];
  a.subscribe({
    onTextMessageContentEvent: ({ event }) => {
      if (stopped === null && event.delta.includes('w5 ')) {
        stopped = fetch(`${hub.url}/v1/agui/ag-stop/stop`, { method: 'POST' }).then((r) => r.json());
      }
    },
  });
  await run(a, {}, seen);
  assert.deepEqual(await stopped, { stopped: true });
  const finished = seen.at(-1);
  assert.equal(finished.type, 'RUN_FINISHED');
  assert.deepEqual(finished.outcome, { type: 'cancelled' });
  const state = await hub.ask({ state: 'ag-stop' });
  const kept = state.entries.findLast((e) => e.message.role === 'assistant');
  assert.equal(kept.message.stop.reason, 'aborted');
  assert.ok(!kept.message.content[0].text.includes('w399'), 'cut short');
});
