// Two JavaScript replicas editing one message or note at once, for tests/web/test_js_edit_merge.py:
// node --experimental-websocket js_edit.mjs URL ID MODE OLD_A NEW_A OLD_B NEW_B
//   MODE message: A pushes FOX; both replicas, caught up, replace OLD with NEW in it before
//                 either sends; both flush until they agree.
//   MODE note:    the same on a note's text.
// Prints one JSON line: {a, b} (each replica's text), state (A's value), conflicts
// ([{client, reason, theirs, ours}]: the texts of both versions), then exits.
import { Author, connect, jsonEqual, Message } from '../../client/web/convsync.js';

const FOX = 'The quick brown fox jumps over the lazy dog.';
const [url, id, mode, oldA, newA, oldB, newB] = process.argv.slice(2);
const out = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);
const deadline = setTimeout(() => {
  out({ error: 'timed out' });
  process.exit(2);
}, 20_000);

async function until(check) {
  while (!check()) await new Promise((resolve) => setTimeout(resolve, 5));
}

const a = connect(url, id, { client: 'js-a' });
const b = connect(url, id, { client: 'js-b' });
const conflicts = [];
const textOf = (item) =>
  item === null || item === undefined
    ? null
    : 'message' in item
      ? item.message.content[0].text
      : item.value.text;
for (const [client, replica] of [
  ['a', a],
  ['b', b],
]) {
  replica.on('conflict', (event) =>
    conflicts.push({
      client,
      reason: event.reason,
      theirs: textOf(event.theirs),
      ours: textOf(event.ours),
    }),
  );
}
await Promise.all([a.ready, b.ready]);

let note = null;
if (mode === 'note') {
  const value = { title: 'plan', text: FOX };
  note = a.conversation.addAside({ kind: 'note', after: null, author: Author.user(), value });
} else {
  a.conversation.push(Message.user(FOX));
}
await a.flush();
await until(() => b.revision === a.revision && b.session.settled);

/** Replace `old` with `word` in the message (or note), through the public API. */
function edit(replica, old, word) {
  const conversation = replica.conversation;
  if (note !== null) {
    const held = conversation.aside(note);
    const value = { ...held.value, text: FOX.replace(old, word) };
    conversation.replaceAside(note, { ...held, value });
  } else {
    const entry = conversation.entry(0);
    const message = Message.user(FOX.replace(old, word));
    conversation.splice(0, 1, [{ ...entry, message }], Author.user());
  }
}

edit(a, oldA, newA); // neither has heard of the other's edit
edit(b, oldB, newB);
const agreed = () =>
  a.session.settled &&
  b.session.settled &&
  a.revision === b.revision &&
  jsonEqual(a.conversation.state(), b.conversation.state());
for (let round = 0; round < 2; round += 1) {
  // a rebase late in the run may push again
  await Promise.all([a.flush(), b.flush()]);
  await until(agreed);
}
const shown = (replica) =>
  note !== null
    ? replica.conversation.aside(note).value.text
    : textOf(replica.conversation.entry(0));
out({ a: shown(a), b: shown(b), state: a.conversation.state(), revision: a.revision, conflicts });
a.close();
b.close();
clearTimeout(deadline);
