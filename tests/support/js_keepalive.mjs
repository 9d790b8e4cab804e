// For tests/net/test_keepalive.py: node --experimental-websocket js_keepalive.mjs URL ID KEEPALIVE_MS
// A JS replica that prints a JSON line when ready and one per state change and per session
// event of the connection ({state, reason} / {event}), and exits 0 once it is connected again
// after a disconnect (or 2 after 60 s).
import { connect } from '../../client/web/convsync.js';

const [url, id, keepalive] = process.argv.slice(2);
const out = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);
setTimeout(() => {
  out({ error: 'timed out' });
  process.exit(2);
}, 60_000);

const replica = connect(url, id, { client: 'js-keepalive', keepalive: Number(keepalive) });
let lost = false;
replica.on('state', ({ state, reason }) => {
  out({ state, reason });
  if (state === 'disconnected') lost = true;
  if (state === 'connected' && lost) {
    replica.close();
    process.exit(0);
  }
});
replica.on('*', (event) => {
  if (event.type === 'connected' || event.type === 'disconnected') out({ event: event.type });
});
await replica.ready;
out({ ready: true });
