// @ts-check
// Approvals, questions and frontend tools (SPEC §12): the twin of `sync/approvals.py`.
import { jsonEqual } from './conversation.js';
import { UsageError } from './errors.js';
import { Author } from './messages.js';
import { isObject } from './records.js';
import { codePoints } from './text.js';

/** An approval or a question a worker asks a person: value an approval (`sync.approvals`). */
export const APPROVAL_KIND = 'rig.approval';
/** The tools a UI runs (frontend tools): value `{tools: [name, ...]}`. */
export const TOOLS_KIND = 'rig.tools';
const APPROVAL_STATES = new Set(['open', 'approved', 'denied', 'answered', 'cancelled']);
const DECISIONS = new Set(['approved', 'denied', 'answered']);
const MAX_REASON = 2000;

const isStringOrNull = (/** @type {any} */ v) => v == null || typeof v === 'string';

/**
 * Whether `record` puts an approval in a decided state (`is_decision` in Python).
 * @param {any} record
 */
export function isDecision(record) {
  const change = record.change;
  if (change.type !== 'aside' || change.aside == null || change.aside.kind !== APPROVAL_KIND) {
    return false;
  }
  const value = change.aside.value;
  return value !== null && typeof value === 'object' && DECISIONS.has(value.state);
}

/**
 * The approval an aside holds, with every field (as `sync.approvals.approval_of`); null when
 * it is not a `rig.approval` or is malformed.
 * @param {any} aside
 */
export function approvalOf(aside) {
  if (aside === null || aside === undefined || aside.kind !== APPROVAL_KIND) return null;
  const v = aside.value;
  if (!isObject(v) || !Number.isInteger(v.turn) || typeof v.key !== 'string') return null;
  if (typeof v.asked_by !== 'string' || !isStringOrNull(v.asked_client)) return null;
  const state = v.state ?? 'open';
  if (!APPROVAL_STATES.has(state)) return null;
  for (const name of ['call', 'prompt', 'reason', 'decided_by']) {
    if (!isStringOrNull(v[name])) return null;
  }
  if (v.decided_at != null && !Number.isInteger(v.decided_at)) return null;
  return {
    turn: v.turn,
    key: v.key,
    call: v.call ?? null,
    prompt: v.prompt ?? null,
    schema: v.schema ?? null,
    state,
    answer: v.answer ?? null,
    reason: v.reason ?? null,
    asked_by: v.asked_by,
    asked_client: v.asked_client ?? null,
    decided_by: v.decided_by ?? null,
    decided_at: v.decided_at ?? null,
  };
}

/** Every well-formed approval of `conversation`, `[asideId, approval]`, in the order put. */
export function approvals(conversation) {
  const found = [];
  for (const [id, aside] of conversation.asides()) {
    const approval = approvalOf(aside);
    if (approval !== null) found.push([id, approval]);
  }
  return found;
}

/** The approval keyed `(turn, key)`, `[asideId, approval]`, or null. */
export function findApproval(conversation, turn, key) {
  return approvals(conversation).find(([, a]) => a.turn === turn && a.key === key) ?? null;
}

/**
 * Ask in the open turn (an edit: one aside put), or find the approval asked already for
 * `(turn, key)` (as `sync.approvals.ask`). Returns `{id, approval, made}`.
 * @param {Conversation} conversation
 * @param {{key: string, askedBy: string, askedClient: string, call?: string | null,
 *   prompt?: string | null, schema?: any}} options
 */
export function ask(conversation, options) {
  const { key, askedBy, askedClient, call = null, prompt = null, schema = null } = options;
  const turns = conversation.turns();
  const last = turns.length > 0 ? turns[turns.length - 1][1] : null;
  if (last === null || last.end !== null) {
    throw new UsageError('no_turn', 'ask in an open turn: open a turn record first');
  }
  const found = findApproval(conversation, last.index, key);
  if (found !== null) return { id: found[0], approval: found[1], made: false };
  if (typeof key !== 'string' || key.length === 0 || codePoints(key) > 256) {
    throw new UsageError('bad_key', "an approval's key is 1 to 256 characters");
  }
  if (schema !== null) {
    const problem = schemaProblem(schema);
    if (problem !== null) throw new UsageError('bad_schema', `schema: ${problem}`);
  }
  let after = null;
  for (let at = conversation.length - 1; at >= 0 && call !== null; at -= 1) {
    const message = /** @type {any} */ (conversation.entry(at)).message;
    if (message.role === 'assistant' && message.content.some((p) => p.type === 'tool_call' && p.id === call)) {
      after = conversation.id(at);
      break;
    }
  }
  if (after === null && conversation.length > 0) after = conversation.id(conversation.length - 1);
  const value = {
    turn: last.index,
    key,
    call,
    prompt,
    schema,
    state: 'open',
    answer: null,
    reason: null,
    asked_by: askedBy,
    asked_client: askedClient,
    decided_by: null,
    decided_at: null,
  };
  const id = conversation.addAside({ kind: APPROVAL_KIND, after, author: Author.rig(), value, saved: true });
  return { id, approval: value, made: true };
}

/**
 * Decide approval `id` (an edit: the aside replaced), as `sync.approvals.decide`: denied,
 * answered (a question given an answer or a schema) or approved. Returns the decided approval.
 * Throws `UsageError` `no_approval`, `decided` (not open here any more: nothing changes) or
 * `bad_answer` (the schema refuses the answer).
 * @param {Conversation} conversation @param {string} id
 * @param {{approve?: boolean, answer?: any, reason?: string | null, decidedBy: string,
 *   at?: number}} options
 */
export function decide(conversation, id, options) {
  const { approve = true, reason = null, decidedBy, at = Date.now() } = options;
  let answer = options.answer ?? null;
  const aside = conversation.aside(id);
  const approval = approvalOf(aside);
  if (aside === null || approval === null) throw new UsageError('no_approval', `${id} is not an approval here`);
  if (approval.state !== 'open') {
    throw new UsageError('decided', `approval ${JSON.stringify(approval.key)} is ${approval.state} already`);
  }
  let state = 'approved';
  if (!approve) {
    state = 'denied';
    answer = null;
  } else if (approval.call === null && (answer !== null || approval.schema !== null)) {
    state = 'answered';
  }
  if (state !== 'denied' && approval.schema !== null) {
    const problem = answerProblem(approval.schema, answer);
    if (problem !== null) throw new UsageError('bad_answer', problem);
  }
  if (reason !== null && codePoints(reason) > MAX_REASON) {
    throw new UsageError('bad_reason', `a reason is at most ${MAX_REASON} characters`);
  }
  const value = { ...approval, state, answer, reason, decided_by: decidedBy, decided_at: at };
  conversation.replaceAside(id, { kind: APPROVAL_KIND, after: aside.after, author: Author.user(), value, saved: true });
  return value;
}

/**
 * The rebase rule (SPEC §12, `sync.approvals.decided_meanwhile`): whether a pending put of an
 * approval, made on `then`, meets the log's `held` decided meanwhile.
 */
export function decidedMeanwhile(then, held, pending) {
  if (pending === null || pending.kind !== APPROVAL_KIND || held === null || jsonEqual(held, pending)) {
    return false;
  }
  const logged = approvalOf(held);
  if (logged === null || logged.state === 'open') return false;
  const base = approvalOf(then);
  return base === null || base.state !== logged.state || !jsonEqual(base, logged);
}

const SCHEMA_KEYWORDS = new Set([
  'type', 'enum', 'const', 'properties', 'required', 'additionalProperties', 'items',
  'minItems', 'maxItems', 'minLength', 'maxLength', 'minimum', 'maximum',
  'exclusiveMinimum', 'exclusiveMaximum',
]);
const SCHEMA_ANNOTATIONS = new Set([
  'title', 'description', 'default', 'examples', '$schema', '$id', '$comment', 'deprecated',
]);
const SCHEMA_TYPES = ['null', 'boolean', 'integer', 'number', 'string', 'array', 'object'];
const SCHEMA_DEPTH = 16;

const isNumber = (/** @type {any} */ v) => typeof v === 'number' && Number.isFinite(v);

/**
 * Why `schema` is not in the JSON Schema subset an approval may use, or null (as Python's
 * `sync.approvals.schema_problem`, pinned by `tests/vectors/approvals.json`).
 */
export function schemaProblem(schema, depth = 0) {
  if (typeof schema === 'boolean') return null;
  if (!isObject(schema)) return 'a schema is an object or a boolean';
  if (depth > SCHEMA_DEPTH) return `nested deeper than ${SCHEMA_DEPTH}`;
  for (const [word, value] of Object.entries(schema)) {
    if (SCHEMA_ANNOTATIONS.has(word)) continue;
    if (!SCHEMA_KEYWORDS.has(word)) return `unsupported keyword ${pyRepr(word)}`;
    if (word === 'type') {
      const types = Array.isArray(value) ? value : [value];
      if (types.length === 0 || !types.every((t) => typeof t === 'string' && SCHEMA_TYPES.includes(t))) {
        return `type names one or more of ${SCHEMA_TYPES.join(', ')}`;
      }
    } else if (word === 'enum') {
      if (!Array.isArray(value) || value.length === 0) return 'enum is a non-empty array';
    } else if (word === 'properties') {
      if (!isObject(value)) return 'properties is an object of schemas';
      for (const sub of Object.values(value)) {
        const problem = schemaProblem(sub, depth + 1);
        if (problem !== null) return problem;
      }
    } else if (word === 'required') {
      if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) {
        return 'required is an array of names';
      }
    } else if (word === 'additionalProperties' || word === 'items') {
      const problem = schemaProblem(value, depth + 1);
      if (problem !== null) return problem;
    } else if (['minItems', 'maxItems', 'minLength', 'maxLength'].includes(word)) {
      if (!Number.isInteger(value) || value < 0) return `${word} is a non-negative integer`;
    } else if (!isNumber(value)) return `${word} is a number`;
  }
  return null;
}

/** A value as Python's `repr` shows a string (`'a'`), for messages both replicas share. */
function pyRepr(text) {
  return text.includes("'") && !text.includes('"') ? `"${text}"` : `'${text.replaceAll("'", "\\'")}'`;
}

/** JSON text as Python's `msgspec.json.encode` writes it (no spaces; `1.0` for a float). */
function show(value) {
  return JSON.stringify(value);
}

function isType(value, name) {
  switch (name) {
    case 'null':
      return value === null;
    case 'boolean':
      return typeof value === 'boolean';
    case 'integer':
      return Number.isInteger(value);
    case 'number':
      return isNumber(value);
    case 'string':
      return typeof value === 'string';
    case 'array':
      return Array.isArray(value);
    case 'object':
      return isObject(value);
    default:
      return false;
  }
}

/**
 * Why `value` does not match `schema` (the subset), or null; the message says where
 * (`answer.name`, `answer[2]`) and what was expected, as Python's `answer_problem`.
 */
export function answerProblem(schema, value, path = 'answer', depth = 0) {
  if (schema === true) return null;
  if (schema === false || !isObject(schema)) return `${path}: no value is allowed here`;
  if (depth > SCHEMA_DEPTH) return `${path}: nested deeper than ${SCHEMA_DEPTH}`;
  if ('type' in schema) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => isType(value, t))) return `${path}: expected ${types.join(' or ')}`;
  }
  if ('const' in schema && !jsonEqual(value, schema.const)) return `${path}: expected ${show(schema.const)}`;
  if ('enum' in schema && !schema.enum.some((v) => jsonEqual(value, v))) {
    return `${path}: expected one of ${schema.enum.map(show).join(', ')}`;
  }
  if (typeof value === 'string') {
    const length = codePoints(value);
    if ('minLength' in schema && length < schema.minLength) return `${path}: at least ${schema.minLength} characters`;
    if ('maxLength' in schema && length > schema.maxLength) return `${path}: at most ${schema.maxLength} characters`;
  }
  if (isNumber(value)) {
    if ('minimum' in schema && value < schema.minimum) return `${path}: at least ${show(schema.minimum)}`;
    if ('maximum' in schema && value > schema.maximum) return `${path}: at most ${show(schema.maximum)}`;
    if ('exclusiveMinimum' in schema && value <= schema.exclusiveMinimum) {
      return `${path}: more than ${show(schema.exclusiveMinimum)}`;
    }
    if ('exclusiveMaximum' in schema && value >= schema.exclusiveMaximum) {
      return `${path}: less than ${show(schema.exclusiveMaximum)}`;
    }
  }
  if (Array.isArray(value)) {
    if ('minItems' in schema && value.length < schema.minItems) return `${path}: at least ${schema.minItems} items`;
    if ('maxItems' in schema && value.length > schema.maxItems) return `${path}: at most ${schema.maxItems} items`;
    if ('items' in schema) {
      for (let at = 0; at < value.length; at += 1) {
        const problem = answerProblem(schema.items, value[at], `${path}[${at}]`, depth + 1);
        if (problem !== null) return problem;
      }
    }
  }
  if (isObject(value)) {
    for (const name of schema.required ?? []) {
      if (!Object.hasOwn(value, name)) return `${path}: ${pyRepr(name)} is required`;
    }
    const properties = schema.properties ?? {};
    const extra = 'additionalProperties' in schema ? schema.additionalProperties : true;
    for (const [name, item] of Object.entries(value)) {
      const own = Object.hasOwn(properties, name);
      const sub = own ? properties[name] : extra;
      const problem = answerProblem(sub, item, `${path}.${name}`, depth + 1);
      if (problem !== null) return !own && sub === false ? `${path}: ${pyRepr(name)} is not allowed` : problem;
    }
  }
  return null;
}

/** The first result answering call `callId` after the last entry holding it, or null. */
export function resultOf(conversation, callId) {
  let at = conversation.length - 1;
  for (; at >= 0; at -= 1) {
    const message = /** @type {any} */ (conversation.entry(at)).message;
    if (
      message.role === 'assistant' &&
      message.content.some((p) => p.type === 'tool_call' && p.id === callId)
    )
      break;
  }
  if (at < 0) return null;
  for (let later = at + 1; later < conversation.length; later += 1) {
    const message = /** @type {any} */ (conversation.entry(later)).message;
    if (message.role !== 'user') continue;
    const found = message.content.find((p) => p.type === 'tool_result' && p.call_id === callId);
    if (found !== undefined) return found;
  }
  return null;
}

/** `approval_asked` / `approval_decided` events for the approvals `records` put. */
