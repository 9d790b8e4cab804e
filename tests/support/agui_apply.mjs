// Feed AG-UI events to @ag-ui/client's own pipeline and print what the client ends with.
//
// stdin: {"messages": [...initial messages], "runs": [[event, ...], ...]} (one list per run,
// applied one after the other to the same client). stdout: one JSON line,
// {"messages": [...], "error": str|null, "warnings": [str]}: the messages the client's
// `defaultApplyEvents` accumulated, the first error its `enforceEvents` (the schemas) or
// `verifyEvents` (the lifecycle rules) raised, and what the client warned about.
// The packages come from client/web/node_modules (scripts/ensure-npm).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const client = await import(
  pathToFileURL(join(root, 'client/web/node_modules/@ag-ui/client/dist/index.mjs')).href
);
const { from } = createRequire(join(root, 'client/web/package.json'))('rxjs');

const warnings = [];
console.warn = (...args) => warnings.push(args.map(String).join(' '));
console.error = (...args) => warnings.push(args.map(String).join(' '));

const input = JSON.parse(readFileSync(0, 'utf8'));
const agent = { messages: input.messages ?? [], state: {}, pendingInterrupts: [] };
let error = null;
for (const events of input.runs) {
  const runInput = { threadId: 't', runId: 'r', messages: agent.messages, state: {}, tools: [], context: [] };
  try {
    // the client's order: the schemas, then the lifecycle rules, then the accumulation;
    // defaultApplyEvents emits {messages} each time they change
    const stream = client.verifyEvents(false)(client.enforceEvents(false)(from(events)));
    let last = null;
    const states = [];
    await new Promise((resolve, reject) =>
      client
        .defaultApplyEvents(runInput, stream, agent, [])
        .subscribe({ next: (s) => states.push(s), error: reject, complete: resolve }),
    );
    for (const s of states) if (s.messages !== undefined) last = s.messages;
    if (last !== null) agent.messages = last;
  } catch (e) {
    error = String(e?.message ?? e);
    break;
  }
}
process.stdout.write(JSON.stringify({ messages: agent.messages, error, warnings }) + '\n');
