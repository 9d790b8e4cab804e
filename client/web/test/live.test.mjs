// Drafts and presence (SPEC §7) in the JS session, and the summary feed, driven by frames.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Conversation, Message, ReplicaSession, SummaryFeed, appendToDraft } from '../convsync.js';

const LINEAGE = 9;
const plain = (value) => JSON.parse(JSON.stringify(value));

function live(records = []) {
  const session = new ReplicaSession('ui', { live: true });
  const hello = session.hello();
  assert.deepEqual(hello.features, ['hub_rebase', 'drafts', 'presence']);
  session.receive({ type: 'welcome', lineage: LINEAGE, revision: records.length, acked: 0 });
  session.receive({ type: 'records', from: 0, records, origin: null });
  assert.ok(session.ready);
  return session;
}

const DRAFT = 'msg_019a0000000070008000000000000001';

test('a draft snapshot, then appends by code-point offset, resends skipped, gaps ignored', () => {
  const session = live();
  const events = session.receive({
    type: 'drafts',
    drafts: [{ id: DRAFT, role: 'assistant', client: 'agent', parts: { text: 'Hi 👩‍👩‍👧' }, since: 1 }],
    more: false,
  });
  assert.deepEqual(events, [{ type: 'draft', id: DRAFT }]);
  const draft = session.drafts.get(DRAFT);
  assert.equal(draft.lengths.text, 8); // H, i, space, and the family's five code points
  // Offset 8: appended. Offset 6 with overlapping text: only the new code points land.
  session.receive({ type: 'draft', id: DRAFT, op: 'append', part: 'text', offset: 8, text: ' 🇫🇷' });
  session.receive({ type: 'draft', id: DRAFT, op: 'append', part: 'text', offset: 9, text: '🇫🇷!' });
  assert.equal(draft.parts.text, 'Hi 👩‍👩‍👧 🇫🇷!');
  // A gap is not applied.
  const gap = session.receive({ type: 'draft', id: DRAFT, part: 'text', offset: 99, text: 'x' });
  assert.deepEqual(gap, []);
  assert.equal(draft.parts.text, 'Hi 👩‍👩‍👧 🇫🇷!');
  // A tool call's arguments stream under call:<id>, the name with the first append.
  session.receive({
    type: 'draft',
    id: DRAFT,
    part: 'call:c1',
    offset: 0,
    text: '{"ci',
    name: 'w',
  });
  session.receive({ type: 'draft', id: DRAFT, part: 'call:c1', offset: 3, text: 'ity"}' });
  assert.equal(draft.parts['call:c1'], '{"city"}');
  assert.equal(draft.names['call:c1'], 'w');
});

test('the record that makes a draft id held ends the draft, in the same step', () => {
  const session = live();
  session.receive({ type: 'drafts', drafts: [{ id: DRAFT, parts: { text: 'par' } }] });
  const log = new Conversation();
  log.push({ message: Message.assistant('partial answer'), id: DRAFT });
  const events = session.receive({ type: 'records', from: 0, records: plain(log.unsaved()) });
  assert.deepEqual(events.at(-1), { type: 'draft_end', id: DRAFT, status: 'committed' });
  assert.equal(session.drafts.size, 0);
  // A late append for it is ignored: the final message is all there is.
  const late = session.receive({ type: 'draft', id: DRAFT, part: 'text', offset: 3, text: 'x' });
  assert.deepEqual(late, []);
  assert.equal(session.drafts.size, 0);
});

test('draft_end removes; a fresh snapshot after a welcome replaces the drafts', () => {
  const session = live();
  const other = 'msg_019a0000000070008000000000000002';
  session.receive({ type: 'drafts', drafts: [{ id: DRAFT, parts: {} }, { id: other }] });
  assert.deepEqual(session.receive({ type: 'draft_end', id: DRAFT, status: 'aborted' }), [
    { type: 'draft_end', id: DRAFT, status: 'aborted' },
  ]);
  const gone = session.disconnected('bye');
  assert.deepEqual(gone.slice(1), [{ type: 'draft_end', id: other, status: 'lost' }]);
  assert.equal(session.drafts.size, 0);
});

test('presence: a snapshot, then diffs joined, changed, left', () => {
  const session = live();
  const a = { connection: 'c1', client: 'agent', kind: 'agent', status: 'thinking' };
  let events = session.receive({ type: 'presence', connections: [a] });
  assert.deepEqual(events, [{ type: 'presence', joined: ['c1'], left: [], changed: [] }]);
  events = session.receive({
    type: 'presence_diff',
    joined: [{ connection: 'c2', client: 'ui' }],
    changed: [{ ...a, status: 'running_tool' }], // the hub sends the whole entry
    left: [],
  });
  assert.deepEqual(events, [{ type: 'presence', joined: ['c2'], left: [], changed: ['c1'] }]);
  assert.equal(session.presence.get('c1').status, 'running_tool');
  assert.equal(session.presence.get('c1').client, 'agent');
  session.receive({ type: 'presence_diff', joined: [], changed: [], left: ['c2', 'nope'] });
  assert.deepEqual([...session.presence.keys()], ['c1']);
});

test('presence: a status cleared (omitted from the changed entry) is cleared here too', () => {
  const session = live();
  const a = { connection: 'c1', client: 'agent', kind: 'agent', status: 'generating', detail: 3 };
  session.receive({ type: 'presence', connections: [a] });
  // `set_status(None)` or a draft's end: the hub omits the cleared fields (omit_defaults).
  const cleared = { connection: 'c1', client: 'agent', kind: 'agent' };
  session.receive({ type: 'presence_diff', joined: [], changed: [cleared], left: [] });
  assert.equal(session.presence.get('c1').status, undefined);
  assert.equal(session.presence.get('c1').detail, undefined);
  assert.deepEqual(session.presence.get('c1'), cleared);
});

test('without live, drafts and presence are ignored and not asked for', () => {
  const session = new ReplicaSession('ui');
  assert.deepEqual(session.hello().features, ['hub_rebase']);
  session.receive({ type: 'welcome', lineage: 1, revision: 0, acked: 0 });
  assert.deepEqual(session.receive({ type: 'drafts', drafts: [{ id: DRAFT }] }), []);
  assert.equal(session.drafts.size, 0);
});

test('appendToDraft counts code points, never UTF-16 units', () => {
  const draft = { parts: {}, names: {}, lengths: {} };
  assert.ok(appendToDraft(draft, 'text', 0, '😀'));
  assert.equal(draft.lengths.text, 1);
  assert.ok(appendToDraft(draft, 'text', 1, 'a'));
  assert.ok(!appendToDraft(draft, 'text', 1, 'a')); // a resend
  assert.equal(draft.parts.text, '😀a');
});

test('the summary feed: a snapshot replaces the rows, diffs update them', () => {
  const feed = new SummaryFeed('ws://x', { WebSocket: function () {} });
  const seen = [];
  feed.on('rows', (event) => seen.push(event));
  feed.receive({ type: 'summary', rows: [{ id: 'a', revision: 1 }], more: false });
  feed.receive({ type: 'summary_diff', rows: [{ id: 'b', revision: 2 }, { nope: 1 }] });
  assert.deepEqual([...feed.rows.keys()], ['a', 'b']);
  feed.receive({ type: 'summary', rows: [{ id: 'b', revision: 3 }], more: true });
  assert.deepEqual([...feed.rows.keys()], ['b']);
  assert.equal(feed.more, true);
  assert.deepEqual(
    seen.map((event) => [event.snapshot, event.rows.length]),
    [
      [true, 1],
      [false, 1],
      [true, 1],
    ],
  );
  assert.throws(() => feed.receive({ type: 'error', code: 'forbidden', detail: 'no' }));
});

test('the hub shapes: open with info, defaulted fields left out, refusals end nothing', () => {
  const session = live();
  const info = { id: DRAFT, role: 'assistant', principal: 'anonymous', client: 'agent', since: 5 };
  assert.deepEqual(session.receive({ type: 'draft', id: DRAFT, op: 'open', info }), [
    { type: 'draft', id: DRAFT },
  ]);
  assert.equal(session.drafts.get(DRAFT).client, 'agent');
  // offset 0 and part "text" are defaults the hub leaves out.
  session.receive({ type: 'draft', id: DRAFT, op: 'append', text: 'Hel' });
  session.receive({ type: 'draft', id: DRAFT, op: 'append', offset: 3, text: 'lo' });
  assert.equal(session.drafts.get(DRAFT).parts.text, 'Hello');
  // A second open (a producer's idempotent reopen) keeps the text so far.
  session.receive({ type: 'draft', id: DRAFT, op: 'open', info });
  assert.equal(session.drafts.get(DRAFT).parts.text, 'Hello');
  for (const status of ['gap', 'unknown', 'refused']) {
    assert.deepEqual(session.receive({ type: 'draft_end', id: DRAFT, status }), []);
  }
  assert.ok(session.drafts.has(DRAFT));
  assert.deepEqual(session.receive({ type: 'draft_end', id: DRAFT, status: 'stopped' }), [
    { type: 'draft_end', id: DRAFT, status: 'stopped' },
  ]);
});

test('a summary feed closed while it waits for its token opens no socket', async () => {
  // close() during start()'s getToken: a socket was opened anyway (review, stop 22).
  let made = 0;
  let release;
  const token = new Promise((resolve) => (release = resolve));
  const feed = new SummaryFeed('ws://x', {
    WebSocket: function () {
      made += 1;
    },
    getToken: () => token,
  });
  const starting = feed.start();
  feed.close();
  release('jwt');
  await starting;
  assert.equal(made, 0);
  assert.equal(feed.state, 'closed');
});

test('the summary feed: rows that leave the window go, `more` follows, a new window is asked', () => {
  const sent = [];
  const feed = new SummaryFeed('ws://x', { WebSocket: function () {}, order: 'updated', limit: 2 });
  feed.receive({ type: 'summary', order: 'updated', rows: [{ id: 'a' }, { id: 'b' }], more: false });
  const seen = [];
  feed.on('rows', (event) => seen.push(event));
  feed.receive({ type: 'summary_diff', rows: [{ id: 'c' }], left: ['a'], more: true });
  assert.deepEqual([...feed.rows.keys()].sort(), ['b', 'c']);
  assert.equal(feed.more, true);
  assert.deepEqual(seen[0].left, ['a']);
  feed.receive({ type: 'summary_diff', rows: [{ id: 'b', revision: 2 }] });
  assert.equal(feed.more, true, 'a diff without `more` keeps it');
  feed.ws = { readyState: 1, send: (data) => sent.push(JSON.parse(data)) };
  feed.state = 'connected';
  feed.window({ order: 'id', after: 'b', limit: 5 });
  assert.deepEqual(sent, [{ type: 'window', prefix: '', order: 'id', after: 'b', limit: 5 }]);
  feed.ws = null;
});
