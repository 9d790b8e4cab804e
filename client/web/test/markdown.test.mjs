// The viewer's safe markdown subset: a tree of plain nodes, never markup.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { markdown } from '../markdown.js';

test('plain text, markup and entities come back as the same one string', () => {
  for (const text of ['hello', '<script>alert(1)</script>', 'a &amp; b', 'x * y', '2*3 = 6', '']) {
    assert.deepEqual(markdown(text), text === '' ? [] : [text]);
  }
  assert.deepEqual(markdown('snake_case_name and under_score'), ['snake_case_name and under_score']);
});

test('code spans and fenced code keep their text verbatim', () => {
  assert.deepEqual(markdown('run `rm -rf <b>` now'), [
    'run ',
    { tag: 'code', children: ['rm -rf <b>'] },
    ' now',
  ]);
  assert.deepEqual(markdown('before\n```js\nlet a = "**no**";\n```\nafter'), [
    'before',
    { tag: 'pre', children: [{ tag: 'code', children: ['let a = "**no**";'] }] },
    'after',
  ]);
});

test('strong and em, nested', () => {
  assert.deepEqual(markdown('**bold _em_**'), [
    { tag: 'strong', children: ['bold ', { tag: 'em', children: ['em'] }] },
  ]);
  assert.deepEqual(markdown('a **b** c *d* e'), [
    'a ',
    { tag: 'strong', children: ['b'] },
    ' c ',
    { tag: 'em', children: ['d'] },
    ' e',
  ]);
});

test('lists: bullets and numbers, one block each', () => {
  assert.deepEqual(markdown('Steps:\n1. one\n2. **two**\n- a\n- b'), [
    'Steps:',
    {
      tag: 'ol',
      children: [
        { tag: 'li', attrs: { dir: 'auto' }, children: ['one'] },
        { tag: 'li', attrs: { dir: 'auto' }, children: [{ tag: 'strong', children: ['two'] }] },
      ],
    },
    {
      tag: 'ul',
      children: [
        { tag: 'li', attrs: { dir: 'auto' }, children: ['a'] },
        { tag: 'li', attrs: { dir: 'auto' }, children: ['b'] },
      ],
    },
  ]);
});

test('links to http(s) only; javascript:, data: and relative ones stay text', () => {
  const rel = 'noopener noreferrer nofollow';
  assert.deepEqual(markdown('see [the docs](https://example.com/a?b=1)'), [
    'see ',
    {
      tag: 'a',
      attrs: { href: 'https://example.com/a?b=1', rel, target: '_blank' },
      children: ['the docs'],
    },
  ]);
  for (const href of ['javascript:alert(1)', 'data:text/html,x', '/local', 'JaVaScRiPt:x']) {
    const text = `[click](${href})`;
    assert.deepEqual(markdown(text), [text]);
  }
});

test('astral characters and RTL text pass through whole', () => {
  const text = 'שלום **עולם** 👩‍👩‍👧 `𝒳`';
  assert.deepEqual(markdown(text), [
    'שלום ',
    { tag: 'strong', children: ['עולם'] },
    ' 👩‍👩‍👧 ',
    { tag: 'code', children: ['𝒳'] },
  ]);
});
