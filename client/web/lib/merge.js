// @ts-check
// The three-way merge of text, messages, entries and asides (`sync/merge.py`).

/*
 * Three-way merge of text, messages, entries and asides: the twin of `sync/merge.py`, rule for
 * rule (SPEC 16). Read that module's docstring for how it works; in short: each side's changes
 * are hunks over the base's code points (common prefix and suffix cut, Myers' O(ND) diff on the
 * middle, one hunk for the whole middle past a budget); hunks of both sides that touch
 * (overlap, or an insertion inside or at an end of the other's range) merge only when both
 * made the same text, else the merge is a conflict (`null`).
 *
 * Every index counts code points, never UTF-16 units: texts are split with `Array.from`, so an
 * astral character is one element here as it is one `str` index in Python. The vectors in
 * `tests/vectors/merge.json` pin both languages. (In this file, not a module of its own:
 * convsync.js imports nothing.)
 */

/** @typedef {[number, number, string]} Hunk `base[start:stop]` (code points) became `text`. */

const DIFF_BUDGET = 1 << 20;

/** The most edit steps the middle's diff tries. @param {number} n @param {number} m */
function diffBudget(n, m) {
  return Math.max(64, Math.floor(DIFF_BUDGET / (n + m)));
}

/**
 * The hunks that make `base` into `other`, in base order.
 * @param {string} base @param {string} other @returns {Hunk[]}
 */
export function diff(base, other) {
  if (base === other) return [];
  return diffPoints(Array.from(base), Array.from(other));
}

/** @param {string[]} a @param {string[]} b @returns {Hunk[]} */
function diffPoints(a, b) {
  const n = a.length;
  const m = b.length;
  let head = 0;
  while (head < n && head < m && a[head] === b[head]) head += 1;
  let tail = 0;
  while (tail < n - head && tail < m - head && a[n - 1 - tail] === b[m - 1 - tail]) tail += 1;
  const x = a.slice(head, n - tail);
  const y = b.slice(head, m - tail);
  if (x.length === 0 || y.length === 0) return leftmost(a, [[head, n - tail, y.join('')]]);
  return leftmost(
    a,
    myersHunks(x, y).map(([s, e, t]) => [head + s, head + e, t]),
  );
}

/**
 * Each pure insertion or deletion slid to the leftmost place giving the same text, short of
 * the hunk before it (as Python's `_leftmost`: two sides' edits at one point meet there).
 * @param {string[]} base @param {Hunk[]} hs @returns {Hunk[]}
 */
function leftmost(base, hs) {
  /** @type {Hunk[]} */
  const out = [];
  let floor = 0;
  for (let [start, stop, text] of hs) {
    if (start === stop) {
      let points = Array.from(text);
      while (start > floor && base[start - 1] === points[points.length - 1]) {
        points = [base[start - 1], ...points.slice(0, -1)];
        start -= 1;
      }
      text = points.join('');
      stop = start;
    } else if (text === '') {
      while (start > floor && base[start - 1] === base[stop - 1]) {
        start -= 1;
        stop -= 1;
      }
    }
    out.push([start, stop, text]);
    floor = stop + 1;
  }
  return out;
}

/**
 * Myers' greedy forward search, ties to a deletion first, as Python's `_myers`.
 * @param {string[]} a @param {string[]} b @returns {Hunk[]}
 */
function myersHunks(a, b) {
  const n = a.length;
  const m = b.length;
  const limit = Math.min(n + m, diffBudget(n, m));
  const offset = limit + 1;
  const v = new Array(2 * limit + 3).fill(0);
  /** @type {number[][]} */
  const trace = [];
  for (let d = 0; d <= limit; d += 1) {
    trace.push(v.slice(offset - d - 1, offset + d + 2));
    for (let k = -d; k <= d; k += 2) {
      let x =
        k === -d || (k !== d && v[offset + k - 1] < v[offset + k + 1])
          ? v[offset + k + 1]
          : v[offset + k - 1] + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) {
        x += 1;
        y += 1;
      }
      v[offset + k] = x;
      if (x >= n && y >= m) return hunksBetween(a, b, myersMatches(trace, n, m));
    }
  }
  return [[0, n, b.join('')]];
}

/** @param {number[][]} trace @param {number} n @param {number} m @returns {[number, number][]} */
function myersMatches(trace, n, m) {
  /** @type {[number, number][]} */
  const matched = [];
  let x = n;
  let y = m;
  for (let d = trace.length - 1; d >= 0; d -= 1) {
    const v = trace[d];
    const k = x - y;
    const prevK = k === -d || (k !== d && v[k - 1 + d + 1] < v[k + 1 + d + 1]) ? k + 1 : k - 1;
    const prevX = d > 0 ? v[prevK + d + 1] : 0;
    const prevY = d > 0 ? prevX - prevK : 0;
    while (x > prevX && y > prevY) {
      x -= 1;
      y -= 1;
      matched.push([x, y]);
    }
    x = prevX;
    y = prevY;
  }
  return matched.reverse();
}

/** @param {string[]} a @param {string[]} b @param {[number, number][]} matched @returns {Hunk[]} */
function hunksBetween(a, b, matched) {
  /** @type {Hunk[]} */
  const out = [];
  let px = 0;
  let py = 0;
  for (const [x, y] of [...matched, [a.length, b.length]]) {
    if (x > px || y > py) out.push([px, x, b.slice(py, y).join('')]);
    px = x + 1;
    py = y + 1;
  }
  return out;
}

/** @param {Hunk} h @param {number} lo @param {number} hi */
function hunkTouches(h, lo, hi) {
  if (h[0] < hi && lo < h[1]) return true;
  return (h[0] === h[1] || lo === hi) && h[0] <= hi && lo <= h[1];
}

/** @param {string[]} base @param {number} lo @param {number} hi @param {Hunk[]} hs */
function applyHunks(base, lo, hi, hs) {
  let out = '';
  let at = lo;
  for (const [start, stop, text] of hs) {
    out += base.slice(at, start).join('') + text;
    at = stop;
  }
  return out + base.slice(at, hi).join('');
}

/**
 * `base` with the changes of both `ours` and `theirs`, or `null` on a conflict. Symmetric.
 * @param {string} base @param {string} ours @param {string} theirs @returns {string | null}
 */
export function mergeText(base, ours, theirs) {
  if (ours === theirs || theirs === base) return ours;
  if (ours === base) return theirs;
  const points = Array.from(base);
  const sides = [diffPoints(points, Array.from(ours)), diffPoints(points, Array.from(theirs))];
  const at = [0, 0];
  let out = '';
  let done = 0;
  while (at[0] < sides[0].length || at[1] < sides[1].length) {
    const first =
      at[1] >= sides[1].length ||
      (at[0] < sides[0].length && sides[0][at[0]][0] <= sides[1][at[1]][0])
        ? 0
        : 1;
    const seed = sides[first][at[first]];
    at[first] += 1;
    /** @type {[Hunk[], Hunk[]]} */
    const group = [[], []];
    group[first].push(seed);
    let lo = seed[0];
    let hi = seed[1];
    let grown = true;
    while (grown) {
      grown = false;
      for (const side of [0, 1]) {
        const hs = sides[side];
        while (at[side] < hs.length && hunkTouches(hs[at[side]], lo, hi)) {
          const h = hs[at[side]];
          group[side].push(h);
          lo = Math.min(lo, h[0]);
          hi = Math.max(hi, h[1]);
          at[side] += 1;
          grown = true;
        }
      }
    }
    out += points.slice(done, lo).join('');
    if (group[0].length > 0 && group[1].length > 0) {
      const mine = applyHunks(points, lo, hi, group[0]);
      if (mine !== applyHunks(points, lo, hi, group[1])) return null;
      out += mine;
    } else {
      out += applyHunks(points, lo, hi, group[0].length > 0 ? group[0] : group[1]);
    }
    done = hi;
  }
  return out + points.slice(done).join('');
}

/** Deep equality of JSON values (undefined fields count as absent). */
function mergeSame(a, b) {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    return a.every((item, i) => mergeSame(item, b[i]));
  }
  if (Array.isArray(b)) return false;
  const keys = Object.keys(a).filter((k) => a[k] !== undefined);
  if (keys.length !== Object.keys(b).filter((k) => b[k] !== undefined).length) return false;
  return keys.every((key) => mergeSame(a[key], b[key]));
}

const MISSING = Symbol('missing');

class Clash extends Error {}

/** The side that changed, or a clash. */
function mergePick(base, ours, theirs) {
  if (mergeSame(ours, theirs) || mergeSame(theirs, base)) return ours;
  if (mergeSame(ours, base)) return theirs;
  throw new Clash();
}

/** @param {string} base @param {string} ours @param {string} theirs */
function mergeTextOrClash(base, ours, theirs) {
  const merged = mergeText(base, ours, theirs);
  if (merged === null) throw new Clash();
  return merged;
}

/** A tool call's arguments merged as their compact JSON text. */
function mergeArguments(base, ours, theirs) {
  if (mergeSame(ours, theirs) || mergeSame(theirs, base)) return ours;
  if (mergeSame(ours, base)) return theirs;
  const [b, o, t] = [base, ours, theirs].map((value) => JSON.stringify(value));
  const merged = mergeTextOrClash(b, o, t);
  let value;
  try {
    value = JSON.parse(merged);
  } catch {
    throw new Clash();
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Clash();
  return value;
}

function mergePart(base, ours, theirs) {
  if (mergeSame(ours, theirs) || mergeSame(theirs, base)) return ours;
  if (mergeSame(ours, base)) return theirs;
  if (!(base.type === ours.type && ours.type === theirs.type)) throw new Clash();
  if (base.type === 'text') {
    return { ...ours, text: mergeTextOrClash(base.text, ours.text, theirs.text) };
  }
  if (base.type === 'tool_call') {
    return {
      type: 'tool_call',
      id: mergePick(base.id, ours.id, theirs.id),
      name: mergePick(base.name, ours.name, theirs.name),
      arguments: mergeArguments(base.arguments, ours.arguments, theirs.arguments),
      provider_data: mergePick(base.provider_data, ours.provider_data, theirs.provider_data),
    };
  }
  throw new Clash();
}

function mergeMessageOrClash(base, ours, theirs) {
  if (mergeSame(ours, theirs) || mergeSame(theirs, base)) return ours;
  if (mergeSame(ours, base)) return theirs;
  if (!(base.role === ours.role && ours.role === theirs.role)) throw new Clash();
  if (base.role === 'system') {
    return { ...ours, content: mergeTextOrClash(base.content, ours.content, theirs.content) };
  }
  const n = base.content.length;
  if (ours.content.length !== n || theirs.content.length !== n) throw new Clash();
  const content = base.content.map((/** @type {any} */ b, /** @type {number} */ i) =>
    mergePart(b, ours.content[i], theirs.content[i]),
  );
  if (base.role === 'user') return { ...ours, content };
  return {
    ...ours,
    content,
    stop: mergePick(base.stop, ours.stop, theirs.stop),
    origin: mergePick(base.origin, ours.origin, theirs.origin),
    usage: mergePick(base.usage, ours.usage, theirs.usage),
  };
}

/**
 * `base` with the changes of both sides, part by part, or `null` on a conflict.
 * @param {any} base @param {any} ours @param {any} theirs @returns {any}
 */
export function mergeMessage(base, ours, theirs) {
  try {
    return mergeMessageOrClash(base, ours, theirs);
  } catch (error) {
    if (error instanceof Clash) return null;
    throw error;
  }
}

/** The pending side's when it changed it, else the log's. */
function mergeNewer(base, log, pending) {
  return mergeSame(pending, base) ? log : pending;
}

/**
 * The entry `pending` (an edit of `base`) becomes on a log that made `base` into `log`, or
 * `null` when the messages conflict (as Python's `merge_entry`).
 * @param {any} base @param {any} log @param {any} pending @returns {any}
 */
export function mergeEntry(base, log, pending) {
  const merged = mergeMessage(base.message, log.message, pending.message);
  if (merged === null) return null;
  return {
    message: merged,
    id: pending.id,
    author: mergeNewer(base.author, log.author, pending.author),
    source_id: mergeNewer(base.source_id, log.source_id, pending.source_id),
  };
}

function isNoteValue(value) {
  return (
    typeof value === 'object' &&
    value !== null &&
    !Array.isArray(value) &&
    typeof value.text === 'string'
  );
}

function mergeNote(base, log, pending) {
  if (![base, log, pending].every(isNoteValue)) return mergePick(base, log, pending);
  /** @type {Record<string, any>} */
  const merged = {};
  const keys = [...Object.keys(log), ...Object.keys(pending).filter((k) => !(k in log))];
  const has = (/** @type {any} */ value, /** @type {string} */ key) =>
    Object.hasOwn(value, key) ? value[key] : MISSING;
  for (const key of keys) {
    const values = [has(base, key), has(log, key), has(pending, key)];
    const value =
      key === 'text' ? mergeTextOrClash(values[0], values[1], values[2]) : mergePick(...values);
    if (value !== MISSING) merged[key] = value;
  }
  return merged;
}

/**
 * The aside `pending` (a replacement of `base`) becomes on a log that made `base` into `log`,
 * or `null` on a conflict (as Python's `merge_aside`).
 * @param {any} base @param {any} log @param {any} pending @returns {any}
 */
export function mergeAside(base, log, pending) {
  try {
    const kind = mergePick(base.kind, log.kind, pending.kind);
    const value =
      kind === 'note' && base.kind === 'note'
        ? mergeNote(base.value, log.value, pending.value)
        : mergePick(base.value, log.value, pending.value);
    return {
      kind,
      after: mergePick(base.after, log.after, pending.after),
      author: mergeNewer(base.author, log.author, pending.author),
      value,
      saved: mergePick(base.saved, log.saved, pending.saved),
    };
  } catch (error) {
    if (error instanceof Clash) return null;
    throw error;
  }
}
