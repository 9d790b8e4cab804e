// Safe markdown for the viewer: a small subset, parsed to a tree of plain nodes, never HTML.
//
// How this works: `markdown(text)` splits the text into blocks (fenced code, list items, and
// the lines between them) and each line run into inline spans (code, links, strong, em). The
// result is a list of nodes: a string is text, an object `{tag, attrs, children}` an element
// of a fixed set (`pre`, `code`, `ul`, `ol`, `li`, `strong`, `em`, `a`). Nothing in the text
// becomes markup: a tag or an entity in it stays those characters, and a link is made only
// for an `http:` or `https:` address (any other, `javascript:` included, stays text). Plain
// text with none of the markers comes back as one string, equal to the input.

/** @typedef {string | {tag: string, attrs?: Record<string, string>, children: MdNode[]}} MdNode */

const FENCE = /^ {0,3}```/;
const ITEM = /^ {0,3}(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/;
const INLINE =
  /`([^`\n]+)`|\[([^\]\n]+)\]\(([^()\s]+)\)|\*\*([^*\n]+)\*\*|__([^_\n]+)__|\*([^*\s][^*\n]*)\*|(?<![\p{L}\p{N}_])_([^_\s][^_\n]*)_(?![\p{L}\p{N}_])/gu;

/**
 * The nodes of `text` (see the module's comment).
 * @param {string} text
 * @returns {MdNode[]}
 */
export function markdown(text) {
  const lines = text.split('\n');
  /** @type {MdNode[]} */
  const out = [];
  /** @type {string[]} */
  let plain = [];
  const flush = () => {
    if (plain.length > 0) out.push(...inline(plain.join('\n')));
    plain = [];
  };
  for (let at = 0; at < lines.length; ) {
    const line = lines[at];
    if (FENCE.test(line)) {
      const code = [];
      at += 1;
      while (at < lines.length && !FENCE.test(lines[at])) code.push(lines[at++]);
      at += 1; // the closing fence (or the end)
      flush();
      out.push({ tag: 'pre', children: [{ tag: 'code', children: [code.join('\n')] }] });
      continue;
    }
    const item = ITEM.exec(line);
    if (item !== null) {
      const ordered = item[2] !== undefined;
      /** @type {MdNode[]} */
      const items = [];
      let next = item;
      while (next !== null && (next[2] !== undefined) === ordered) {
        items.push({ tag: 'li', attrs: { dir: 'auto' }, children: inline(next[3]) });
        at += 1;
        next = at < lines.length ? ITEM.exec(lines[at]) : null;
      }
      flush();
      out.push({ tag: ordered ? 'ol' : 'ul', children: items });
      continue;
    }
    plain.push(line);
    at += 1;
  }
  flush();
  return out;
}

/**
 * The inline nodes of one run of lines: code spans, links, strong and em; the rest text.
 * @param {string} text
 * @returns {MdNode[]}
 */
function inline(text) {
  /** @type {MdNode[]} */
  const out = [];
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    const [whole, code, label, href, strong1, strong2, em1, em2] = match;
    /** @type {MdNode | null} */
    let node = null;
    if (code !== undefined) node = { tag: 'code', children: [code] };
    else if (label !== undefined) node = safeHref(href) ? link(label, href) : null;
    else if (strong1 !== undefined || strong2 !== undefined) {
      node = { tag: 'strong', children: inline(strong1 ?? strong2) };
    } else node = { tag: 'em', children: inline(em1 ?? em2) };
    if (node === null) continue; // a link to somewhere not http(s): left as it was typed
    if (match.index > last) out.push(text.slice(last, match.index));
    out.push(node);
    last = match.index + whole.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return mergeText(out);
}

/** @param {string} label @param {string} href @returns {MdNode} */
function link(label, href) {
  return {
    tag: 'a',
    attrs: { href, rel: 'noopener noreferrer nofollow', target: '_blank' },
    children: inline(label).filter((node) => typeof node === 'string' || node.tag !== 'a'),
  };
}

/** Whether `href` is an absolute `http:` or `https:` address. @param {string} href */
export function safeHref(href) {
  try {
    const url = new URL(href);
    return url.protocol === 'http:' || url.protocol === 'https:';
  } catch {
    return false;
  }
}

/** Adjacent strings joined, so plain text stays one string. @param {MdNode[]} nodes */
function mergeText(nodes) {
  /** @type {MdNode[]} */
  const out = [];
  for (const node of nodes) {
    const before = out.length - 1;
    if (typeof node === 'string' && before >= 0 && typeof out[before] === 'string') {
      out[before] += node;
    } else out.push(node);
  }
  return out;
}
