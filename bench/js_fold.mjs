// The JS side of bench/js_fold.py: node bench/js_fold.mjs FILE...
// Each FILE is a JSON array of change records. For each, after one warm-up pass (so the JIT has
// compiled the fold, as in a page that has been live a while), times JSON.parse of the text and
// the fold of the parsed records onto a new Conversation; prints {file: {cold, parse, fold,
// entries, revision}} in seconds (`cold`: the warm-up fold, the first in this process).
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';

import { Conversation } from '../client/web/convsync.js';

function fold(records) {
  const conversation = new Conversation();
  for (const record of records) conversation.apply(record);
  return conversation;
}

const results = {};
for (const file of process.argv.slice(2)) {
  const text = readFileSync(file, 'utf8');
  const first = JSON.parse(text);
  let start = performance.now();
  fold(first); // warm-up
  const cold = (performance.now() - start) / 1000;
  start = performance.now();
  const records = JSON.parse(text);
  const parse = (performance.now() - start) / 1000;
  start = performance.now();
  const conversation = fold(records);
  const folded = (performance.now() - start) / 1000;
  results[file] = {
    cold,
    parse,
    fold: folded,
    entries: conversation.length,
    revision: conversation.revision,
  };
}
process.stdout.write(`${JSON.stringify(results)}\n`);
