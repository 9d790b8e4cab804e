// A JS subscriber's hot path: a live ReplicaSession taking N records, one `records` message
// each (what a viewer does while others write). Prints the median CPU time (ms) of 7 runs
// after 3 warm-ups, one module per process (so the two never share a JIT):
//   node --expose-gc bench/js_subscriber.mjs [MODULE]   (default: client/web/convsync.js)
// To compare with the single-file replica before issue 24, alternate processes:
//   git show a31d725:client/web/convsync.js > /tmp/base.mjs
//   for i in $(seq 10); do node --expose-gc bench/js_subscriber.mjs /tmp/base.mjs; \
//     node --expose-gc bench/js_subscriber.mjs; done
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const target = process.argv[2] ?? new URL('../client/web/convsync.js', import.meta.url).pathname;
const m = await import(pathToFileURL(resolve(target)).href);
const N = Number(process.env.N ?? 20000);
const writer = new m.Conversation();
for (let i = 0; i < N; i += 1) writer.push(m.Message.user(`message ${i}`));
const text = JSON.stringify(writer.unsaved());

function run() {
  const records = JSON.parse(text);
  globalThis.gc?.();
  const session = new m.ReplicaSession('ui');
  session.hello();
  session.receive({ type: 'welcome', lineage: 7, revision: 0, acked: 0 });
  const start = process.cpuUsage();
  for (let i = 0; i < N; i += 1) {
    session.receive({ type: 'records', from: i, records: [records[i]] });
  }
  const spent = process.cpuUsage(start);
  return (spent.user + spent.system) / 1000;
}

for (let r = 0; r < 3; r += 1) run();
const times = [];
for (let r = 0; r < 7; r += 1) times.push(run());
times.sort((a, b) => a - b);
process.stdout.write(`${times[3].toFixed(1)}\n`);
