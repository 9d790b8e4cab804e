// @ts-check
// Code points: the unit of every offset into text.

/** The number of Unicode code points in `text` (what draft offsets count). */
export function codePoints(text) {
  let count = 0;
  // eslint-disable-next-line no-unused-vars
  for (const _ of text) count += 1;
  return count;
}

/** `text` from code point `start` on (`start` counts code points, not UTF-16 units). */
export function sliceCodePoints(text, start) {
  return Array.from(text).slice(start).join('');
}
