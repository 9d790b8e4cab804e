// The module itself: no dependencies, and the hand-kept .d.ts names exactly what it exports.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import * as convsync from '../convsync.js';

const source = (name) => readFileSync(new URL(`../${name}`, import.meta.url), 'utf8');

test('convsync.js imports nothing (no dependencies, no build step)', () => {
  assert.doesNotMatch(source('convsync.js'), /^\s*import\s[^(]/m);
  assert.doesNotMatch(source('convsync.js'), /\brequire\(/);
});

test('convsync.d.ts declares every runtime export, and no runtime name that is not exported', () => {
  const declared = new Set(
    Array.from(
      source('convsync.d.ts').matchAll(/^export (?:const|function|class) (\w+)/gm),
      (m) => m[1],
    ),
  );
  assert.deepEqual([...declared].sort(), Object.keys(convsync).sort());
});
